/**
 * The host facts an offline inspect needs (spec 1.2 step 3), shared by the importers and the
 * format parsers they call (which must not import from `lib/importers/`).
 */

/** What an importer's inspect needs to know about the host. */
export interface InspectContext {
  /** Absolute import root; every file a descriptor references must resolve inside it. */
  importRoot: string
  /** True when the input lives under `.uploads` (an uploaded archive). */
  allowUploads?: boolean
  /** Path of the `qemu-img` binary (default `qemu-img`). */
  qemuImg?: string
}
