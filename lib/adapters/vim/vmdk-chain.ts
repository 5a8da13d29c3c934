/**
 * The `vim_api` adapter's boundary to the VMDK snapshot-chain reader
 * (`lib/formats/vmdk/chain-reader.ts`, which decodes FLAT/VMFS, ZERO, hosted sparse, vmfsSparse
 * and seSparse extents and follows `parentFileNameHint`): the disk files are those of a live
 * snapshot on a datastore (a {@link RemoteFile} of range reads, `datastore.ts`), so a file found
 * malformed at copy time is a failed read of the source, `E_MIG_DISK_READ_FAILED` (spec section
 * 7), not an archive the user supplied (`E_MIG_MALFORMED_ARCHIVE`, which the shared parsers raise
 * and the offline importers keep). This is the one place that maps the code, for opening and for
 * every later read. `E_MIG_UNSUPPORTED_FORMAT` (raw device mappings, compressed grains, a dirty
 * seSparse journal) stays as it is.
 */
import { MigError } from '../../errors.ts'
import type { DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'
import { openVmdkChain as openChain, type VmdkFile } from '../../formats/vmdk/chain-reader.ts'

export { MAX_RANGE } from '../../formats/vmdk/chain-reader.ts'

/** Random access to the bytes of one datastore file (see `VmdkFile`); reads fail with `E_MIG_DISK_READ_FAILED`. */
export type RemoteFile = VmdkFile

/** A malformed snapshot file, seen at copy time, as the read failure it is for a live source. */
function asReadFailure(e: unknown): unknown {
  if (e instanceof MigError && e.code === 'E_MIG_MALFORMED_ARCHIVE') return new MigError('E_MIG_DISK_READ_FAILED', e.message, { details: e.details, cause: e })
  return e
}

async function mapped<T>(f: () => Promise<T>): Promise<T> {
  try {
    return await f()
  } catch (e) {
    throw asReadFailure(e)
  }
}

/**
 * Opens the datastore VMDK `file` and its chain of parents as one {@link DiskReader}; arguments
 * (`file`, `openSibling(name)`, `openParent(hint, depth)`, `opts: { label, capacity }`) as
 * `openVmdkChain` of `lib/formats/vmdk/chain-reader.ts`. Every fault of a malformed or hostile
 * file (extent names leaving the directory, loops, chains deeper than `MAX_CHAIN_DEPTH`, CID mismatches, grains
 * outside their file) is `E_MIG_DISK_READ_FAILED`; unsupported features are
 * `E_MIG_UNSUPPORTED_FORMAT`.
 */
export async function openVmdkChain(...args: Parameters<typeof openChain>): Promise<DiskReader> {
  const inner = await mapped(() => openChain(...args))
  return {
    size: inner.size,
    async *extents(from: number): AsyncIterable<DiskExtent> {
      try {
        yield* inner.extents(from)
      } catch (e) {
        throw asReadFailure(e)
      }
    },
    read: (offset, length, into) => mapped(() => inner.read(offset, length, into)),
    close: () => inner.close(),
  }
}
