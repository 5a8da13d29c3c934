/**
 * Chooses and opens the disk reader for one manifest disk (DESIGN.md section 5):
 * - `source.compression === 'gzip'` (OVF `ovf:compression="gzip"`) or `source.layout ===
 *   'ovf_chunks'` (DSP0243 `ovf:chunkSize`): staged as a plain sparse file in `stagingDir`
 *   ({@link stageOvfFile}, removed when the reader closes), then opened as below;
 * - `source.layout === 'xva_blocks'`: {@link openXvaBlocksReader} over `source.member`;
 * - `disk_format === 'raw'`: {@link openRawFileReader}, at `source.offset`/`source.length` for a
 *   tar member;
 * - `vhdx` without a parent or an unreplayed log, `vpc` dynamic, `vdi` dynamic or fixed, `qcow2`
 *   without a backing file, compressed clusters, subclusters or the dirty bit:
 *   {@link openVhdxBlocksReader}, {@link openVhdBlocksReader}, {@link openVdiBlocksReader},
 *   {@link openQcow2ClustersReader} (their BAT, block map or L1/L2 tables, the file's holes
 *   skipped; their own checks of every entry replace `qemu-img check`); a stream-optimized `vmdk`
 *   without a parent (an OVA's disk): {@link openStreamVmdkReader} (grains inflated on threads;
 *   its checks replace `qemu-img check`); a monolithicSparse `vmdk` without a parent:
 *   {@link openSparseVmdkReader} (its grain tables);
 * - `qcow2`, `vmdk`, `vhdx` (differencing), `vpc` (fixed, differencing), `vdi` (the images the
 *   readers above leave to qemu, differencing):
 *   {@link openNbdReader} (qemu-nbd),
 *   through the raw driver's offset/size for a tar member, with the manifest's validated
 *   `backing_chain`.
 */
import { rm, rmdir } from 'node:fs/promises'
import { MigError } from '../../errors.ts'
import { outsideInputScope, remoteInput } from '../../hostpath.ts'
import type { DiskFormat, ManifestDisk } from '../../manifest.ts'
import { CHECKABLE_FORMATS, qemuImgCheck } from '../../formats/qemu-info.ts'
import { readVdiInfo } from '../../formats/vdi.ts'
import { openNbdReader } from './nbd.ts'
import { openQcow2ClustersReader } from './qcow2-clusters.ts'
import { stageOvfFile } from './ovf-staged.ts'
import { openRawFileReader } from './raw-file.ts'
import { openStreamVmdkReader } from './stream-vmdk.ts'
import type { DiskReader } from '../../contracts/disk-reader.ts'
import type { ImageFileOptions } from './image-file.ts'
import { openVdiBlocksReader } from './vdi-blocks.ts'
import { openVhdBlocksReader } from './vhd-blocks.ts'
import { openVhdxBlocksReader } from './vhdx-blocks.ts'
import { openSparseVmdkReader } from './vmdk-grains.ts'
import { openXvaBlocksReader } from './xva-blocks.ts'

/** Options of {@link openDiskReader}. */
export interface OpenDiskReaderOptions {
  /** Aborting kills qemu-nbd of an NBD-backed reader. */
  signal?: AbortSignal
  /** qemu-nbd binary (default from PATH). */
  qemuNbdPath?: string
  /** Where gzip-compressed or chunked OVF files are staged; without it they are `E_MIG_UNSUPPORTED_FORMAT`. */
  stagingDir?: string
}

/** Room the inflated file of a disk of `capacity` bytes may take beyond it (image metadata). */
const stagingSlack = (capacity: number) => Math.ceil(capacity / 16) + 64 * 1024 * 1024

/**
 * Opens the reader of `disk`. The reader's `size` is the disk's virtual size as the reader sees
 * it; a reader larger than `capacity_bytes` is refused (the destination volume is sized from it).
 * Throws `E_MIG_UNSUPPORTED_FORMAT` (gzip-compressed or chunked OVF files without a staging
 * directory, unsupported layouts, unsafe image headers), the staging errors of
 * {@link stageOvfFile}, `E_MIG_DISK_READ_FAILED` (unreadable input, qemu-nbd refusal,
 * reader larger than the capacity), `E_MIG_MALFORMED_ARCHIVE` (bad XVA block layout).
 */
export async function openDiskReader(disk: ManifestDisk, opts: OpenDiskReaderOptions = {}): Promise<DiskReader> {
  const src = disk.source
  const label = src.member ? `${disk.label} (${src.member} in ${src.path})` : `${disk.label} (${src.path})`
  if (remoteInput(src.path)) return openRemoteDiskReader(disk, label)
  if (src.compression === 'gzip' || src.layout === 'ovf_chunks') {
    const what = src.compression === 'gzip' ? 'gzip-compressed disk files (ovf:compression="gzip")' : 'chunked OVF disk files (ovf:chunkSize)'
    if (!opts.stagingDir) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: ${what} need a staging directory`)
    if (!(disk.capacity_bytes > 0))
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: ${what} need the disk's capacity (ovf:capacity) to bound their inflated size`)
    const staged = await stageOvfFile(src, {
      dir: opts.stagingDir,
      label,
      maxBytes: disk.capacity_bytes + stagingSlack(disk.capacity_bytes),
      signal: opts.signal,
    })
    let inner: DiskReader
    try {
      inner = await outsideInputScope(() => openDiskReader({ ...disk, source: { path: staged } }, { ...opts, stagingDir: undefined }))
    } catch (e) {
      await rm(staged, { force: true })
      throw e
    }
    return {
      size: inner.size,
      qemuNode: inner.qemuNode,
      preferQemuImg: inner.preferQemuImg,
      extents: (from) => inner.extents(from),
      read: (offset, length, into) => inner.read(offset, length, into),
      async close() {
        await inner.close()
        await rm(staged, { force: true })
        await rmdir(opts.stagingDir!).catch(() => {}) // when no other disk is staged there
      },
    }
  }
  let reader: DiskReader
  if (src.layout === 'xva_blocks') {
    if (!src.member) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: an XVA disk needs its VDI directory (member)`)
    if (disk.disk_format !== 'raw') throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: XVA blocks are raw, not ${disk.disk_format}`)
    reader = await openXvaBlocksReader(src.path, { member: src.member, capacity: disk.capacity_bytes, label })
  } else if (disk.disk_format === 'raw') {
    reader = await openRawFileReader(src.path, { offset: src.offset, length: src.length, label })
  } else {
    if ((src.offset === undefined) !== (src.length === undefined)) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: a member range needs both offset and length`)
    }
    const native = disk.backing_chain?.length ? null : await openByBlockTable(disk.disk_format, src.path, { offset: src.offset, length: src.length, label })
    if (native) return refuseLarger(native, disk, label)
    // `qemu-img check` runs while qemu-nbd starts (both fixed costs of every job);
    // nothing is read before the check passed, and its refusal wins over qemu-nbd's.
    const check = src.offset === undefined ? refuseDamaged(src.path, disk.disk_format, label) : Promise.resolve()
    check.catch(() => {}) // awaited below
    const opened = await openNbdReader({
      path: src.path,
      format: disk.disk_format,
      offset: src.offset,
      length: src.length,
      backingChain: disk.backing_chain,
      label,
      signal: opts.signal,
      qemuNbdPath: opts.qemuNbdPath,
    }).catch(async (e: unknown) => {
      await check
      throw e
    })
    await check.catch(async (e: unknown) => {
      await opened.close()
      throw e
    })
    reader = opened
  }
  return refuseLarger(reader, disk, label)
}

/**
 * The reader of a disk of a remote input (`lib/remote/`): the raw reader or a reader by block
 * table over ranged reads; what would need qemu (a backing chain, an image the table readers
 * leave to qemu-nbd) or staging (gzip-compressed or chunked OVF files) is
 * `E_MIG_UNSUPPORTED_FORMAT` naming the disk and the fix.
 */
async function openRemoteDiskReader(disk: ManifestDisk, label: string): Promise<DiskReader> {
  const src = disk.source
  const refuse = (why: string) =>
    new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: ${why} from a remote input is not read; copy the export into the import root`)
  if (src.compression === 'gzip') throw refuse('a gzip-compressed disk file (ovf:compression="gzip")')
  if (src.layout === 'ovf_chunks') throw refuse('a chunked disk file (ovf:chunkSize)')
  if (src.layout === 'xva_blocks') throw refuse('an XVA disk')
  if (disk.backing_chain?.length) throw refuse('a disk with a backing chain')
  if (disk.disk_format === 'raw') return refuseLarger(await openRawFileReader(src.path, { offset: src.offset, length: src.length, label }), disk, label)
  const native = await openByBlockTable(disk.disk_format, src.path, { offset: src.offset, length: src.length, label })
  if (!native) throw refuse(`this ${disk.disk_format} image (a layout only qemu reads: compressed clusters, an external data file ...)`)
  return refuseLarger(native, disk, label)
}

/**
 * The reader of an image by its block or grain table (`vhdx-blocks.ts`, `vhd-blocks.ts`,
 * `vdi-blocks.ts`, `stream-vmdk.ts` for a stream-optimized VMDK, `vmdk-grains.ts` for a
 * monolithicSparse one, `qcow2-clusters.ts`), or null for a
 * format or an image these do not read (then qemu-nbd reads it). Errors of those readers.
 */
function openByBlockTable(format: DiskFormat, path: string, opts: ImageFileOptions): Promise<DiskReader | null> {
  if (format === 'vhdx') return openVhdxBlocksReader(path, opts)
  if (format === 'vpc') return openVhdBlocksReader(path, opts)
  if (format === 'vdi') return openVdiBlocksReader(path, opts)
  if (format === 'vmdk') return openStreamVmdkReader(path, opts).then((r) => r ?? openSparseVmdkReader(path, opts))
  if (format === 'qcow2') return openQcow2ClustersReader(path, opts)
  return Promise.resolve(null)
}

/** `reader`, unless it is larger than the disk's capacity (then closed, `E_MIG_DISK_READ_FAILED`). */
async function refuseLarger(reader: DiskReader, disk: ManifestDisk, label: string): Promise<DiskReader> {
  if (disk.capacity_bytes > 0 && reader.size > disk.capacity_bytes) {
    await reader.close()
    throw new MigError(
      'E_MIG_DISK_READ_FAILED',
      `${label}: the image holds ${reader.size} bytes, more than the manifest's capacity of ${disk.capacity_bytes} bytes`,
    )
  }
  return reader
}

/**
 * `qemu-img check` of a whole-file image of a checkable format (qcow2, VHDX, VMDK; VDI by its header): corruptions or
 * unreadable metadata are `E_MIG_DISK_READ_FAILED`, because qemu would read the missing clusters
 * of a truncated image as zeros and the copy would silently lose data. Leaks are harmless.
 */
async function refuseDamaged(path: string, format: DiskFormat, label: string): Promise<void> {
  if (format === 'vdi') {
    // qemu's VDI check does not look at the file size; the header reader does.
    await readVdiInfo(path).catch((e: unknown) => {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: ${(e as Error).message}; refusing to copy it`, { cause: e })
    })
    return
  }
  if (!CHECKABLE_FORMATS.includes(format)) return
  const c = await qemuImgCheck(path, format)
  if (c.corruptions > 0 || c.check_errors > 0) {
    const end = c.image_end_offset !== null ? ` (its metadata ends at byte ${c.image_end_offset})` : ''
    throw new MigError(
      'E_MIG_DISK_READ_FAILED',
      `${label}: qemu-img check found ${c.corruptions} corruptions and ${c.check_errors} unreadable metadata blocks${end}: the image is truncated or damaged, and its missing data would read as zeros; refusing to copy it`,
      { details: { corruptions: c.corruptions, check_errors: c.check_errors } },
    )
  }
}
