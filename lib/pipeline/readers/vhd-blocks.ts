/**
 * Disk reader of a dynamic VHD by its Block Allocation Table (Microsoft "Virtual Hard
 * Disk Image Format Specification" v1.0, "Dynamic Disk Header", "Block Allocation Table and Data
 * Blocks"), in place of qemu-nbd and qemu's `vpc` driver ({@link openBlockMapReader}).
 *
 * - A BAT entry (big-endian 32-bit) of `0xFFFFFFFF` is a block not allocated: zeros. Otherwise it
 *   is the sector number of the block's sector bitmap, followed by the block's data: the data of
 *   block `b` lies at `entry * 512 + bitmap bytes` ({@link vhdBitmapBytes}).
 * - The sector bitmap is not read: qemu's `block/vpc.c` does not read it for a dynamic disk
 *   either, so the bytes equal `qemu-img convert -f vpc -O raw`'s (for a dynamic disk its clear
 *   bits mean sectors never written, which read as the zeros a new block holds).
 * - Every entry is checked when used, and all of them at open, before any copy: a block whose
 *   bitmap and data (a whole block, as qemu requires) do not lie inside the file (a truncated
 *   image) or that starts inside the first 512 bytes (the footer copy) is
 *   `E_MIG_DISK_READ_FAILED` naming the block.
 * - The virtual size is the one qemu presents (`readVhdInfo`: CHS geometry for some creators).
 * - Fixed disks (qemu-img reads them as a raw file), differencing disks and disks of more than
 *   {@link MAX_BLOCKS} blocks are not read here: {@link openVhdBlocksReader} returns null and the
 *   caller uses qemu-nbd.
 */
import { MigError } from '../../errors.ts'
import type { DiskReader } from '../../contracts/disk-reader.ts'
import { readVhdInfoFrom, VHD_UNALLOCATED, vhdBitmapBytes, type VhdInfo } from '../../formats/vhd.ts'
import { type BlockTable, openBlockMapReader, TableWindows } from './block-map.ts'
import type { ImageFile, ImageFileOptions } from './image-file.ts'

/**
 * Most blocks read here (2^24: 32 TiB of 2 MiB blocks, the size every VHD writer uses): the BAT
 * is checked whole at open, one entry at a time, and a VHD of tiny blocks (the format allows 512
 * bytes: 4 Gi entries for 2 TiB) would keep that check busy for many minutes; such an image goes
 * to qemu-nbd, as before this reader.
 */
const MAX_BLOCKS = 2 ** 24

/** BAT entries per window read at once (64 KiB). */
const BAT_WINDOW = 16384

/**
 * Opens the VHD at `path` (the byte range `offset`/`length` of it for a tar member). Returns the
 * reader of a dynamic disk (`size`: the virtual size qemu presents), or null for a fixed or
 * differencing disk or one of more than {@link MAX_BLOCKS} blocks (read those through qemu-nbd).
 * Throws `E_MIG_DISK_READ_FAILED` (cannot open or read the file, range outside the file, a block
 * outside the file), and the errors of `readVhdInfo` (`E_MIG_UNSUPPORTED_FORMAT`,
 * `E_MIG_MALFORMED_ARCHIVE`).
 */
export function openVhdBlocksReader(path: string, opts: ImageFileOptions = {}): Promise<DiskReader | null> {
  return openBlockMapReader(path, opts, async (file) => {
    const info = await readVhdInfoFrom(file.fh, file.label, { offset: file.base, length: file.length })
    if (info.disk_type !== 'dynamic' || Math.ceil(info.virtual_size / info.block_size!) > MAX_BLOCKS) return null
    return new VhdBat(file, info)
  })
}

/** The BAT of a dynamic VHD as a {@link BlockTable}. */
class VhdBat implements BlockTable {
  readonly size: number
  readonly blockSize: number
  readonly blocks: number
  private readonly bitmap: number
  private readonly windows: TableWindows

  constructor(
    private readonly file: ImageFile,
    info: VhdInfo,
  ) {
    this.size = info.virtual_size
    this.blockSize = info.block_size!
    this.blocks = Math.ceil(this.size / this.blockSize)
    this.bitmap = vhdBitmapBytes(this.blockSize)
    this.windows = new TableWindows(file, info.bat_offset!, BAT_WINDOW, 4)
  }

  async dataOffset(b: number): Promise<number | null> {
    const raw = await this.windows.entry(b)
    const fail = (why: string) => new MigError('E_MIG_DISK_READ_FAILED', `${this.file.label}: ${why}; refusing to copy it`)
    if (!raw) throw fail(`the BAT entry of block ${b} lies beyond the end of the file (truncated image)`)
    const sector = raw.readUInt32BE(0)
    if (sector === VHD_UNALLOCATED) return null
    const at = sector * 512
    if (at < 512) throw fail(`block ${b} lies at file offset ${at}, over the footer copy`)
    if (at + this.bitmap + this.blockSize > this.file.length)
      throw fail(
        `block ${b} at file offset ${at} (+${this.bitmap + this.blockSize} bytes with its sector bitmap) lies beyond the end of the file (${this.file.length} bytes): the image is truncated or damaged, and its missing data would read as zeros`,
      )
    return at + this.bitmap
  }
}
