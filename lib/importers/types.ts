/**
 * The offline importer contract (spec 1.1 "Nine offline importers", 1.2 step 3).
 */
import type { ImporterKind } from '../kinds.ts'
import type { VmManifest } from '../manifest.ts'
import type { InspectContext } from '../contracts/inspect.ts'

/** Re-exported for the importers; defined in `lib/contracts/inspect.ts` so formats can use it too. */
export type { InspectContext }

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
