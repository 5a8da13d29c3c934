/**
 * Disk reader of a VirtualBox VDI (dynamic or fixed) by its block map (VirtualBox
 * `src/VBox/Storage/VDICore.h`, read the way qemu's `block/vdi.c` reads it), in place of qemu-nbd
 * and qemu's `vdi` driver ({@link openBlockMapReader}).
 *
 * - A block map entry (little-endian 32-bit) of `0xFFFFFFFF` (block free) or `0xFFFFFFFE` (block
 *   zero, discarded) reads as zeros. Otherwise it is the index of the stored block: its data lies
 *   at `offData + entry * cbBlock` (qemu's offset; the images read here have no extra bytes per
 *   block, so VirtualBox's offset is the same).
 * - The virtual size is the one qemu presents: `cbDisk` rounded up to a multiple of 512 bytes
 *   (qemu accepts the odd sizes `VBoxManage convertfromraw` writes that way).
 * - Every entry is checked when used, and all of them at open, before any copy: a stored block
 *   that does not lie whole inside the file (a truncated image) is `E_MIG_DISK_READ_FAILED`
 *   naming the block.
 * - Only what qemu reads too is read here: images qemu refuses (a block size other than 1 MiB, a
 *   sector size other than 512, unaligned block map or data, a parent or link UUID), undo and
 *   differencing images, images with extra bytes per block, and images of more than
 *   {@link MAX_BLOCKS} blocks make {@link openVdiBlocksReader} return null, and the caller uses
 *   qemu-nbd (which refuses or reads them as before this reader).
 */
import { MigError } from '../../errors.ts'
import type { DiskReader } from '../../contracts/disk-reader.ts'
import { readAt } from '../../formats/io.ts'
import { parseVdiHeader, type VdiInfo } from '../../formats/vdi.ts'
import { type BlockTable, openBlockMapReader, TableWindows } from './block-map.ts'
import type { ImageFile, ImageFileOptions } from './image-file.ts'

/** Block size qemu reads (1 MiB), bytes. */
const QEMU_BLOCK_SIZE = 1024 * 1024

/**
 * Most blocks read here (2^25: 32 TiB of 1 MiB blocks): the block map is checked whole at open,
 * one entry at a time; a larger image goes to qemu-nbd, as before this reader.
 */
const MAX_BLOCKS = 2 ** 25

/** Block map entries per window read at once (64 KiB). */
const BMAP_WINDOW = 16384

/** Block map entries at or above this read as zeros (`VDI_IMAGE_BLOCK_ZERO`, `_FREE`). */
const VDI_FIRST_UNALLOCATED = 0xfffffffe

/** Whether this reader reads `info` (see the module comment); else qemu-nbd does. */
function readableHere(info: VdiInfo): boolean {
  return (
    (info.image_type === 'dynamic' || info.image_type === 'fixed') &&
    info.parent_uuid === null &&
    info.block_size === QEMU_BLOCK_SIZE &&
    info.sector_size === 512 &&
    info.block_extra === 0 &&
    info.bmap_offset % 512 === 0 &&
    info.data_offset % 512 === 0 &&
    info.blocks <= MAX_BLOCKS
  )
}

/**
 * Opens the VDI at `path` (the byte range `offset`/`length` of it for a tar member). Returns the
 * reader of a dynamic or fixed image (`size`: the virtual size qemu presents), or null for one
 * qemu-nbd reads instead (see the module comment). Throws `E_MIG_DISK_READ_FAILED` (cannot open
 * or read the file, range outside the file, a block outside the file, a damaged header: the
 * `E_MIG_MALFORMED_ARCHIVE` findings of `parseVdiHeader`), `E_MIG_UNSUPPORTED_FORMAT` (not a VDI
 * 1.1 image).
 */
export function openVdiBlocksReader(path: string, opts: ImageFileOptions = {}): Promise<DiskReader | null> {
  return openBlockMapReader(path, opts, async (file) => {
    const head = await readAt(file.fh, file.label, Math.min(512, file.length), file.base)
    let info: VdiInfo
    try {
      info = parseVdiHeader(head, file.length, file.label)
    } catch (e) {
      // A damaged header (a truncated image among others) is refused as qemu-img check's findings are.
      if (e instanceof MigError && e.code === 'E_MIG_MALFORMED_ARCHIVE')
        throw new MigError('E_MIG_DISK_READ_FAILED', `${e.message}; refusing to copy it`, { cause: e })
      throw e
    }
    return readableHere(info) ? new VdiBlockMap(file, info) : null
  })
}

/** The block map of a VDI as a {@link BlockTable}. */
class VdiBlockMap implements BlockTable {
  readonly size: number
  readonly blockSize: number
  readonly blocks: number
  private readonly dataOffsetOfFirst: number
  private readonly windows: TableWindows

  constructor(
    private readonly file: ImageFile,
    info: VdiInfo,
  ) {
    this.size = Math.ceil(info.virtual_size / 512) * 512
    this.blockSize = info.block_size
    this.blocks = Math.ceil(this.size / this.blockSize)
    this.dataOffsetOfFirst = info.data_offset
    this.windows = new TableWindows(file, info.bmap_offset, BMAP_WINDOW, 4)
  }

  async dataOffset(b: number): Promise<number | null> {
    const raw = await this.windows.entry(b)
    const fail = (why: string) => new MigError('E_MIG_DISK_READ_FAILED', `${this.file.label}: ${why}; refusing to copy it`)
    if (!raw) throw fail(`the block map entry of block ${b} lies beyond the end of the file (truncated image)`)
    const entry = raw.readUInt32LE(0)
    if (entry >= VDI_FIRST_UNALLOCATED) return null
    const at = this.dataOffsetOfFirst + entry * this.blockSize
    if (at + this.blockSize > this.file.length)
      throw fail(
        `block ${b} (stored block ${entry}) at file offset ${at} (+${this.blockSize} bytes) lies beyond the end of the file (${this.file.length} bytes): the image is truncated or damaged, and its missing data would read as zeros`,
      )
    return at
  }
}
