/**
 * Disk reader of a VHDX without a parent, by its Block Allocation Table (issue 15; MS-VHDX v1.0
 * section 2.5 BAT, 2.5.1.1 payload block states), in place of qemu-nbd: qemu's VHDX driver has
 * no block status, so qemu reports every present block as data and reads it whole, holes and
 * all; this reader reads only the bytes the file holds.
 *
 * - A payload block NOT_PRESENT, UNDEFINED, ZERO or UNMAPPED reads as zeros (a zero extent, never
 *   read). FULLY_PRESENT reads from its file offset; inside it, the file's holes (a file written
 *   by qemu or copied sparse) are zero extents too ({@link FileHoleMap}).
 * - Sector bitmap blocks are not read: in an image without a parent they carry no meaning for
 *   reads (2.5.1.2; qemu's `block/vhdx.c` does not read them either), so the bytes equal
 *   `qemu-img convert -f vhdx -O raw`'s.
 * - Every BAT entry is checked when used, and all of them once at open, before any copy: a state
 *   other than the six defined ones, PARTIALLY_PRESENT (a differencing state), a block inside the
 *   first MiB (the header section) or beyond the end of the file (a truncated image, whose
 *   missing data qemu would read as zeros) is `E_MIG_DISK_READ_FAILED` naming the block and the
 *   offset. The file is opened once; the BAT is read in 64 KiB windows (a few kept), so memory
 *   stays flat whatever the disk size.
 * - Differencing images (HasParent) and images with an unreplayed log are not read here:
 *   {@link openVhdxBlocksReader} returns null and the caller uses qemu-nbd.
 */
import { open, type FileHandle } from 'node:fs/promises'
import { MigError } from '../../errors.ts'
import { pinnedPath } from '../../hostpath.ts'
import type { DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'
import { batEntryAt, batIndexOfBlock, readVhdxInfoFrom, VHDX_BLOCK, type VhdxInfo } from '../../formats/vhdx.ts'
import { FileHoleMap } from './file-holes.ts'

const MiB = 1024 * 1024
/** BAT entries per window read at once (64 KiB). */
const BAT_WINDOW = 8192
/** BAT windows kept in memory (the copy's reads in flight touch at most a few). */
const BAT_WINDOWS_KEPT = 4
/** Longest extent yielded, bytes (the copy loop cuts its own chunks). */
const EXTENT_SPAN = 1024 * 1024 * 1024

/** Options of {@link openVhdxBlocksReader}. Bytes. */
export interface VhdxBlocksReaderOptions {
  /** Start of the image inside the file (tar member data offset); default 0. */
  offset?: number
  /** Length of the image (tar member size); default: the file's size minus `offset`. */
  length?: number
  /** Name used in messages (e.g. `disk1.vhdx in vm.tar`); defaults to the path. */
  label?: string
}

/**
 * Opens the VHDX at `path` (the byte range `offset`/`length` of it for a tar member). Returns the
 * reader (`size`: the Virtual Disk Size), or null for a differencing VHDX or one whose log needs
 * replay (read those through qemu-nbd).
 * Throws `E_MIG_DISK_READ_FAILED` (cannot open or read the file, range outside the file, a BAT
 * entry that is undefined, differencing, in the header section or beyond the end of the file),
 * and the errors of `readVhdxInfo` (`E_MIG_UNSUPPORTED_FORMAT`, `E_MIG_MALFORMED_ARCHIVE`).
 */
export async function openVhdxBlocksReader(path: string, opts: VhdxBlocksReaderOptions = {}): Promise<DiskReader | null> {
  const label = opts.label ?? path
  const fail = (why: string, cause?: unknown) => new MigError('E_MIG_DISK_READ_FAILED', `${label}: ${why}`, cause ? { cause } : {})
  let fh: FileHandle
  try {
    fh = await open(pinnedPath(path), 'r')
  } catch (e) {
    throw fail(`cannot open: ${(e as Error).message}`, e)
  }
  try {
    const st = await fh.stat()
    if (!st.isFile() && !st.isBlockDevice()) throw fail('not a regular file or block device')
    const base = opts.offset ?? 0
    const fileLen = opts.length ?? st.size - base
    if (!Number.isSafeInteger(base) || base < 0 || !Number.isSafeInteger(fileLen) || fileLen < 0 || base + fileLen > st.size)
      throw fail(`range of ${fileLen} bytes at offset ${base} lies outside the file (${st.size} bytes)`)
    const info = await readVhdxInfoFrom(fh, label, { offset: base, length: fileLen })
    if (info.has_parent || info.needs_log_replay) {
      await fh.close()
      return null
    }
    const reader = new VhdxBlocks(fh, label, info, base, fileLen, st.isBlockDevice())
    for (let b = 0; b < reader.blocks; b++) await reader.blockOffset(b) // every entry checked before any copy
    return reader
  } catch (e) {
    await fh.close().catch(() => {})
    throw e instanceof MigError ? e : fail((e as Error).message, e)
  }
}

class VhdxBlocks implements DiskReader {
  readonly size: number
  readonly blocks: number
  private readonly blockSize: number
  private readonly windows = new Map<number, Promise<Buffer>>()
  private closed = false
  private readonly maps = new Set<FileHoleMap>()

  constructor(
    private readonly fh: FileHandle,
    private readonly label: string,
    private readonly info: VhdxInfo,
    private readonly base: number,
    private readonly fileLen: number,
    private readonly isBlock: boolean,
  ) {
    this.size = info.virtual_size
    this.blockSize = info.block_size
    this.blocks = Math.ceil(this.size / this.blockSize)
  }

  private fail(why: string, cause?: unknown): MigError {
    return new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: ${why}`, cause ? { cause } : {})
  }

  /** The BAT window holding entry `index` (read once, a few kept). */
  private window(w: number): Promise<Buffer> {
    let p = this.windows.get(w)
    if (p) return p
    p = (async () => {
      const len = BAT_WINDOW * 8
      const buf = Buffer.alloc(len)
      const at = this.info.bat_offset + w * len
      const want = Math.max(0, Math.min(len, this.fileLen - at))
      let got = 0
      try {
        while (got < want) {
          const { bytesRead } = await this.fh.read(buf, got, want - got, this.base + at + got)
          if (bytesRead === 0) break
          got += bytesRead
        }
      } catch (e) {
        throw this.fail(`read of the BAT at offset ${at} failed: ${(e as Error).message}`, e)
      }
      return buf.subarray(0, got)
    })()
    p.catch(() => this.windows.delete(w))
    this.windows.set(w, p)
    if (this.windows.size > BAT_WINDOWS_KEPT) this.windows.delete(this.windows.keys().next().value!)
    return p
  }

  /**
   * File offset (bytes, inside the image's range) of payload block `b`, or null when it reads as
   * zeros. Throws `E_MIG_DISK_READ_FAILED` for an entry that cannot be read as a VHDX without a
   * parent (see the module comment).
   */
  async blockOffset(b: number): Promise<number | null> {
    const index = batIndexOfBlock(b, this.info.chunk_ratio)
    const win = await this.window(Math.floor(index / BAT_WINDOW))
    const at = (index % BAT_WINDOW) * 8
    if (at + 8 > win.length) throw this.fail(`the BAT entry of block ${b} lies beyond the end of the file (truncated image); refusing to copy it`)
    const { state, fileOffset } = batEntryAt(win, at)
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
          `BAT entry ${index} (block ${b}) has state ${state}, ${state === VHDX_BLOCK.PARTIALLY_PRESENT ? 'which only a differencing image may use' : 'which MS-VHDX does not define'}; refusing to copy it`,
        )
    }
    const need = Math.min(this.blockSize, this.size - b * this.blockSize)
    if (fileOffset < MiB) throw this.fail(`block ${b} lies at file offset ${fileOffset}, inside the header section; refusing to copy it`)
    if (fileOffset + need > this.fileLen)
      throw this.fail(
        `block ${b} at file offset ${fileOffset} (+${need} bytes) lies beyond the end of the file (${this.fileLen} bytes): the image is truncated or damaged, and its missing data would read as zeros; refusing to copy it`,
      )
    return fileOffset
  }

  async *extents(from: number): AsyncIterable<DiskExtent> {
    if (this.closed) throw this.fail('extents after close')
    const B = this.blockSize
    const node = {
      driver: 'raw',
      offset: this.base,
      size: this.fileLen,
      file: { driver: this.isBlock ? 'host_device' : 'file', filename: `/proc/${process.pid}/fd/${this.fh.fd}` },
    }
    const holes = new FileHoleMap({ node, size: this.fileLen, label: this.label, noHoles: this.isBlock })
    this.maps.add(holes)
    let run: DiskExtent | null = null
    try {
      for (let b = Math.floor(Math.max(0, from) / B); b < this.blocks; b++) {
        const vStart = Math.max(from, b * B)
        const vEnd = Math.min((b + 1) * B, this.size)
        const at = await this.blockOffset(b)
        const pieces: Iterable<DiskExtent> | AsyncIterable<DiskExtent> =
          at === null
            ? [{ offset: vStart, length: vEnd - vStart, zero: true }]
            : this.virtual(holes.split(at + (vStart - b * B), vEnd - vStart), vStart - (at + (vStart - b * B)))
        for await (const x of pieces) {
          if (run && run.zero === x.zero && run.offset + run.length === x.offset && run.length + x.length <= EXTENT_SPAN) run.length += x.length
          else {
            if (run) yield run
            run = { ...x }
          }
        }
      }
      if (run) yield run
    } finally {
      this.maps.delete(holes)
      await holes.close()
    }
  }

  /** File pieces moved to virtual offsets by `shift` bytes. */
  private async *virtual(pieces: AsyncIterable<DiskExtent>, shift: number): AsyncIterable<DiskExtent> {
    for await (const p of pieces) yield { offset: p.offset + shift, length: p.length, zero: p.zero }
  }

  async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
    if (this.closed) throw this.fail(`read at offset ${offset} after close`)
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > this.size)
      throw this.fail(`read of ${length} bytes at offset ${offset} is outside the disk (${this.size} bytes)`)
    const buf = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
    const B = this.blockSize
    let done = 0
    while (done < length) {
      const v = offset + done
      const b = Math.floor(v / B)
      const n = Math.min(length - done, (b + 1) * B - v)
      const at = await this.blockOffset(b)
      if (at === null) buf.fill(0, done, done + n)
      else {
        const pos = this.base + at + (v - b * B)
        let got = 0
        try {
          while (got < n) {
            const { bytesRead } = await this.fh.read(buf, done + got, n - got, pos + got)
            if (bytesRead === 0) break
            got += bytesRead
          }
        } catch (e) {
          throw this.fail(`read of ${n} bytes at offset ${v} (file offset ${pos}) failed: ${(e as Error).message}`, e)
        }
        if (got !== n) throw this.fail(`short read at offset ${v + got} (file offset ${pos + got}; file truncated?)`)
      }
      done += n
    }
    return buf
  }

  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    await Promise.all([...this.maps].map((m) => m.close()))
    this.windows.clear()
    await this.fh.close().catch(() => {})
  }
}
