/**
 * Disk reader of a VHDX without a parent, by its Block Allocation Table (MS-VHDX v1.0
 * section 2.5 BAT, 2.5.1.1 payload block states), in place of qemu-nbd: qemu's VHDX driver has
 * no block status, so qemu reports every present block as data and reads it whole, holes and
 * all; this reader ({@link openBlockMapReader}) reads only the bytes the file holds.
 *
 * - A payload block NOT_PRESENT, UNDEFINED, ZERO or UNMAPPED reads as zeros; FULLY_PRESENT reads
 *   from its file offset.
 * - Sector bitmap blocks are not read: in an image without a parent they carry no meaning for
 *   reads (2.5.1.2; qemu's `block/vhdx.c` does not read them either), so the bytes equal
 *   `qemu-img convert -f vhdx -O raw`'s.
 * - Every BAT entry is checked when used, and all of them at open, before any copy: a state other
 *   than the six defined ones, PARTIALLY_PRESENT (a differencing state), a block inside the first
 *   MiB (the header section) or beyond the end of the file (a truncated image, whose missing data
 *   qemu would read as zeros) is `E_MIG_DISK_READ_FAILED` naming the block and the offset.
 * - Differencing images (HasParent) and images whose header names a log are not read here:
 *   {@link openVhdxBlocksReader} returns null and the caller uses qemu-nbd.
 */
import { MigError } from '../../errors.ts'
import type { DiskReader } from '../../contracts/disk-reader.ts'
import { batEntryAt, batIndexOfBlock, readVhdxInfoFrom, VHDX_BLOCK, type VhdxInfo } from '../../formats/vhdx.ts'
import { type BlockTable, openBlockMapReader, TableWindows } from './block-map.ts'
import type { ImageFile, ImageFileOptions } from './image-file.ts'

const MiB = 1024 * 1024
/** BAT entries per window read at once (64 KiB). */
const BAT_WINDOW = 8192

/**
 * Opens the VHDX at `path` (the byte range `offset`/`length` of it for a tar member). Returns the
 * reader (`size`: the Virtual Disk Size), or null for a differencing VHDX or one whose log needs
 * replay (read those through qemu-nbd).
 * Throws `E_MIG_DISK_READ_FAILED` (cannot open or read the file, range outside the file, a BAT
 * entry that is undefined, differencing, in the header section or beyond the end of the file),
 * and the errors of `readVhdxInfo` (`E_MIG_UNSUPPORTED_FORMAT`, `E_MIG_MALFORMED_ARCHIVE`).
 */
export function openVhdxBlocksReader(path: string, opts: ImageFileOptions = {}): Promise<DiskReader | null> {
  return openBlockMapReader(path, opts, async (file) => {
    const info = await readVhdxInfoFrom(file.fh, file.label, { offset: file.base, length: file.length })
    if (info.has_parent || info.needs_log_replay) return null
    return new VhdxBat(file, info)
  })
}

/** The BAT of a VHDX without a parent as a {@link BlockTable}. */
class VhdxBat implements BlockTable {
  readonly size: number
  readonly blockSize: number
  readonly blocks: number
  private readonly windows: TableWindows

  constructor(
    private readonly file: ImageFile,
    private readonly info: VhdxInfo,
  ) {
    this.size = info.virtual_size
    this.blockSize = info.block_size
    this.blocks = Math.ceil(this.size / this.blockSize)
    this.windows = new TableWindows(file, info.bat_offset, BAT_WINDOW, 8)
  }

  private fail(why: string): MigError {
    return new MigError('E_MIG_DISK_READ_FAILED', `${this.file.label}: ${why}; refusing to copy it`)
  }

  async dataOffset(b: number): Promise<number | null> {
    const index = batIndexOfBlock(b, this.info.chunk_ratio)
    const raw = await this.windows.entry(index)
    if (!raw) throw this.fail(`the BAT entry of block ${b} lies beyond the end of the file (truncated image)`)
    const { state, fileOffset } = batEntryAt(raw, 0)
    switch (state) {
      case VHDX_BLOCK.NOT_PRESENT:
      case VHDX_BLOCK.UNDEFINED:
      case VHDX_BLOCK.ZERO:
      case VHDX_BLOCK.UNMAPPED:
        return null
      case VHDX_BLOCK.FULLY_PRESENT:
        break
      default:
        throw this.fail(
          `BAT entry ${index} (block ${b}) has state ${state}, ${state === VHDX_BLOCK.PARTIALLY_PRESENT ? 'which only a differencing image may use' : 'which MS-VHDX does not define'}`,
        )
    }
    const need = Math.min(this.blockSize, this.size - b * this.blockSize)
    if (fileOffset < MiB) throw this.fail(`block ${b} lies at file offset ${fileOffset}, inside the header section`)
    if (fileOffset + need > this.file.length)
      throw this.fail(
        `block ${b} at file offset ${fileOffset} (+${need} bytes) lies beyond the end of the file (${this.file.length} bytes): the image is truncated or damaged, and its missing data would read as zeros`,
      )
    return fileOffset
  }
}
