/**
 * The offline importer contract (spec 1.1 "Nine offline importers", 1.2 step 3).
 */
import type { ImporterKind } from '../kinds.ts'
import type { VmManifest } from '../manifest.ts'

/** What an importer's inspect needs to know about the host. */
export interface InspectContext {
  /** Absolute import root; every file a descriptor references must resolve inside it. */
  importRoot: string
  /** True when the input lives under `.uploads` (an uploaded archive). */
  allowUploads?: boolean
  /** Path of the `qemu-img` binary (default `qemu-img`). */
  qemuImg?: string
}

/**
 * An offline importer: turns an input path (a file or a folder, already confined to the import
 * root) into a {@link VmManifest}. Throws `E_MIG_MALFORMED_ARCHIVE` (naming member and reason),
 * `E_MIG_UNSUPPORTED_FORMAT`, `E_MIG_HOST_PATH_REJECTED`, `E_MIG_DISK_READ_FAILED`.
 */
export interface Importer {
  kind: ImporterKind
  /** Inspects the input; reads headers and descriptors only, never whole disks. */
  inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest>
}
