/**
 * Disk reader of an image whose virtual disk is cut into fixed-size blocks, each either stored
 * whole at a file offset or reading as zeros: the VHDX BAT (`vhdx-blocks.ts`) and the
 * dynamic VHD BAT (`vhd-blocks.ts`) describe their images this way. The format module supplies
 * the {@link BlockTable}; this reader does the rest, with positioned reads on the one open file:
 * - `extents()`: a block reading as zeros is a zero extent (never read); a stored block is data,
 *   except the holes the file has inside it ({@link FileHoleMap}: a file written by qemu, or
 *   copied sparse), which are zero extents too. Adjacent extents of a kind are merged (at most
 *   1 GiB each).
 * - `read()`: stored blocks at their file offsets (blocks stored one after another in one
 *   positioned read), zeros elsewhere; a short read (a file cut short since it was opened) is
 *   `E_MIG_DISK_READ_FAILED`, never zeros.
 * - The table reads its entries in windows ({@link TableWindows}), so memory stays flat
 *   whatever the disk size; every entry is checked by the table when used.
 * No `qemuNode`: these readers are copied by the node engine.
 */
import { MigError } from '../../errors.ts'
import { readAt } from '../../formats/io.ts'
import type { DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'
import { FileHoleMap } from './file-holes.ts'
import { imageFileNode, type ImageFile, type ImageFileOptions, openImageFile } from './image-file.ts'

/** Longest extent yielded, bytes (the copy loop cuts its own chunks). */
const EXTENT_SPAN = 1024 * 1024 * 1024

/**
 * Where each block of an image lies. `size`: virtual size, bytes; `blockSize`: bytes per block
 * (the last block may be partial); `blocks`: `ceil(size / blockSize)`.
 * `dataOffset(b)`: the file offset (bytes, inside the image's byte range) of block `b`'s first
 * byte, or null when it reads as zeros; throws `E_MIG_DISK_READ_FAILED` for an entry that cannot
 * be trusted (the format's checks, naming the block).
 */
export interface BlockTable {
  size: number
  blockSize: number
  blocks: number
  dataOffset(b: number): Promise<number | null>
  /**
   * Checks every entry at once, in place of {@link dataOffset} for each block (a table of many
   * small blocks checks its tables whole, not one block at a time): resolves true when every
   * block can be read here, false when the image holds blocks this reader leaves to qemu (the
   * caller then reads the image through qemu-nbd); throws as `dataOffset` for an entry that
   * cannot be trusted.
   */
  checkAll?(): Promise<boolean>
  /**
   * Block `b`'s file offset (or null: zeros) as {@link dataOffset} answers it, when the table
   * holding its entry is loaded already (no I/O, no `await`); undefined when it is not. A table
   * of many small blocks (qcow2 clusters, VMDK grains: 131,072 of 64 KiB in 8 GiB) answers most
   * blocks so, where an `await` per block cost the extents walk 60 ms of the event loop.
   */
  known?(b: number): number | null | undefined
}

/**
 * The last `kept` loads by key (promises: askers of a key being loaded share its load); a load
 * that fails is dropped, so the next ask loads again. The tables of the block-table readers keep
 * their windows and decoded tables this way, so memory stays flat whatever the disk size.
 */
export class KeptLoads<T> {
  private readonly loads = new Map<number, Promise<T>>()
  /** The values of the kept loads that resolved. */
  private readonly values = new Map<number, T>()

  constructor(private readonly kept: number) {}

  get(key: number, load: () => Promise<T>): Promise<T> {
    const kept = this.loads.get(key)
    if (kept) return kept
    const p = load()
    p.then(
      (v) => {
        if (this.loads.get(key) === p) this.values.set(key, v)
      },
      () => {
        if (this.loads.get(key) === p) this.loads.delete(key)
      },
    )
    this.loads.set(key, p)
    if (this.loads.size > this.kept) {
      const oldest = this.loads.keys().next().value!
      this.loads.delete(oldest)
      this.values.delete(oldest)
    }
    return p
  }

  /** The value of `key`'s kept load once it resolved; undefined while it loads, failed, or is not kept. */
  peek(key: number): T | undefined {
    return this.values.get(key)
  }
}

/**
 * Positioned reads of a table of fixed-size entries (`entryBytes` each) at `offset` of the image
 * (bytes, inside its range), `perWindow` entries at a time, the last few windows kept.
 * `window(w)` resolves to the bytes of window `w`, shorter where the image ends; a failed read is
 * `E_MIG_DISK_READ_FAILED` (and is not kept).
 */
export class TableWindows {
  private readonly windows: KeptLoads<Buffer>

  constructor(
    private readonly file: ImageFile,
    private readonly offset: number,
    readonly perWindow: number,
    private readonly entryBytes: number,
    kept = 4,
  ) {
    this.windows = new KeptLoads(kept)
  }

  window(w: number): Promise<Buffer> {
    return this.windows.get(w, () => this.load(w))
  }

  /** The `entryBytes` bytes of entry `index`, or null when the image ends before it. */
  async entry(index: number): Promise<Buffer | null> {
    const win = await this.window(Math.floor(index / this.perWindow))
    const at = (index % this.perWindow) * this.entryBytes
    return at + this.entryBytes <= win.length ? win.subarray(at, at + this.entryBytes) : null
  }

  private async load(w: number): Promise<Buffer> {
    const len = this.perWindow * this.entryBytes
    const at = this.offset + w * len
    const want = Math.max(0, Math.min(len, this.file.length - at))
    return readAt(this.file.fh, `${this.file.label} (block table)`, want, this.file.base + at)
  }
}

/**
 * Opens the image at `path` once ({@link openImageFile}: the byte range `opts.offset`/`length` of
 * it for a tar member) and reads it by the {@link BlockTable} `tableOf` makes of it (see the
 * module comment), or resolves null, the file closed, when `tableOf` does (an image the caller
 * leaves to qemu-nbd) or the table's `checkAll` finds blocks it leaves to qemu. Checks every
 * table entry first (before any copy: a damaged table fails the open, not the copy half-way).
 * The reader's `close()` closes the file; an error closes it too.
 * Throws what {@link openImageFile}, `tableOf` and the table's `dataOffset` throw.
 */
export async function openBlockMapReader(
  path: string,
  opts: ImageFileOptions,
  tableOf: (file: ImageFile) => Promise<BlockTable | null>,
): Promise<DiskReader | null> {
  const file = await openImageFile(path, opts)
  try {
    const table = await tableOf(file)
    if (!table) {
      await file.fh.close()
      return null
    }
    let readable = true
    if (table.checkAll) readable = await table.checkAll()
    else for (let b = 0; b < table.blocks; b++) await table.dataOffset(b)
    if (!readable) {
      await file.fh.close()
      return null
    }
    return new BlockMapReader(file, table)
  } catch (e) {
    await file.fh.close().catch(() => {})
    throw e
  }
}

class BlockMapReader implements DiskReader {
  readonly size: number
  private closed = false
  private readonly maps = new Set<FileHoleMap>()

  constructor(
    private readonly file: ImageFile,
    private readonly table: BlockTable,
  ) {
    this.size = table.size
  }

  private fail(why: string, cause?: unknown): MigError {
    return new MigError('E_MIG_DISK_READ_FAILED', `${this.file.label}: ${why}`, cause ? { cause } : {})
  }

  async *extents(from: number): AsyncIterable<DiskExtent> {
    if (this.closed) throw this.fail('extents after close')
    const { length, isBlock, remote, label } = this.file
    const B = this.table.blockSize
    // a remote input has no holes to ask for: every allocated block is data
    const holes = new FileHoleMap({ node: remote ? {} : imageFileNode(this.file), size: length, label, noHoles: isBlock || remote })
    this.maps.add(holes)
    let run: DiskExtent | null = null
    /** Adds `x` to the run it continues; else starts a run with it and answers the finished one. */
    const join = (x: DiskExtent): DiskExtent | null => {
      if (run && run.zero === x.zero && run.offset + run.length === x.offset && run.length + x.length <= EXTENT_SPAN) {
        run.length += x.length
        return null
      }
      const out = run
      run = x
      return out
    }
    try {
      for (let b = Math.floor(Math.max(0, from) / B); b < this.table.blocks; b++) {
        const vStart = Math.max(from, b * B)
        const vEnd = Math.min((b + 1) * B, this.size)
        let at = this.offsetOf(b)
        if (at instanceof Promise) at = await at
        if (at === null) {
          const out = join({ offset: vStart, length: vEnd - vStart, zero: true })
          if (out) yield out
        } else
          for await (const x of holes.split(at + (vStart - b * B), vEnd - vStart)) {
            const out = join({ offset: x.offset + b * B - at, length: x.length, zero: x.zero })
            if (out) yield out
          }
      }
      if (run) yield run
    } finally {
      this.maps.delete(holes)
      await holes.close()
    }
  }

  async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
    if (this.closed) throw this.fail(`read at offset ${offset} after close`)
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > this.size)
      throw this.fail(`read of ${length} bytes at offset ${offset} is outside the disk (${this.size} bytes)`)
    const buf = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
    const B = this.table.blockSize
    let done = 0
    while (done < length) {
      const v = offset + done
      const first = Math.floor(v / B)
      let b = first
      let n = Math.min(length - done, (b + 1) * B - v)
      let at = this.offsetOf(b)
      if (at instanceof Promise) at = await at
      // Following blocks of the same kind (zeros, or stored right after this one) join this
      // read: one positioned read for blocks stored in a row (small qcow2 clusters).
      while (done + n < length) {
        let next = this.offsetOf(b + 1)
        if (next instanceof Promise) next = await next
        if (at === null ? next !== null : next !== at + (b + 1 - first) * B) break
        b++
        n = Math.min(length - done, (b + 1) * B - v)
      }
      if (at === null) buf.fill(0, done, done + n)
      else {
        const pos = this.file.base + at + (v - first * B)
        const got = (await readAt(this.file.fh, this.file.label, n, pos, buf.subarray(done))).length
        if (got !== n) throw this.fail(`short read at offset ${v + got} (file offset ${pos + got}; file truncated?)`)
      }
      done += n
    }
    return buf
  }

  /** Block `b`'s file offset: at once from the table's loaded entries ({@link BlockTable.known}), else its `dataOffset`. */
  private offsetOf(b: number): number | null | Promise<number | null> {
    const k = this.table.known?.(b)
    return k === undefined ? this.table.dataOffset(b) : k
  }

  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    await Promise.all([...this.maps].map((m) => m.close()))
    await this.file.fh.close().catch(() => {})
  }
}
