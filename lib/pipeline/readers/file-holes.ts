/**
 * Which byte ranges of an image file hold data and which are holes, asked in pieces
 * and mostly in increasing file order: a format reader that maps virtual blocks to file ranges
 * (the VHDX BAT) uses it to skip the holes inside allocated blocks. qemu's VHDX driver reports a
 * whole present block as data, so `qemu-img convert` reads a present block's holes as zeros,
 * 16-32 MiB at a time; a reader using this map reads only what the file holds.
 *
 * The answer comes from one `qemu-img map` of the file's raw node ({@link qemuImgMap}: on the
 * open descriptor, `SEEK_DATA`/`SEEK_HOLE`), streamed: it is read forward as the asked ranges move
 * forward, and started again at the asked offset when a range lies before its position (a block
 * stored before an earlier one). After {@link MAX_RESTARTS} such restarts (a file whose blocks
 * are stored far out of order) the map gives up and calls everything data: the reader then reads
 * and zero-checks whole blocks, as qemu does; correctness never depends on the map.
 */
import type { DiskExtent } from '../../contracts/disk-reader.ts'
import type { QemuNode } from '../qemu-img-copy.ts'
import { qemuImgMap } from '../qemu-img-map.ts'

/** Restarts of `qemu-img map` (each a process start, ~5 ms) before the map calls everything data. */
export const MAX_RESTARTS = 64

/** Options of {@link FileHoleMap}. */
export interface FileHoleMapOptions {
  /** The file's raw node (a `file` or `host_device` child; `offset`/`size` for a tar member). */
  node: QemuNode
  /** Bytes of the node (its `size`, else the file's size). */
  size: number
  /** Name used in messages. */
  label: string
  /** No holes to look for (a block device): every range is data, qemu-img is never run. */
  noHoles?: boolean
}

/**
 * The hole map of one file. `split(offset, length)` yields `[offset, offset + length)` (file
 * bytes, inside `[0, size)`) cut into data (`zero: false`) and hole (`zero: true`) pieces, in
 * order, covering the range exactly. One `split` at a time (an extents walk). `close()` stops
 * qemu-img; never throws. Throws what {@link qemuImgMap} throws (`E_MIG_DISK_READ_FAILED`).
 */
export class FileHoleMap {
  private it: AsyncGenerator<DiskExtent> | null = null
  private cur: DiskExtent | null = null
  private restarts = 0
  private allData: boolean

  constructor(private readonly opts: FileHoleMapOptions) {
    this.allData = !!opts.noHoles
  }

  /** Number of times the map was started again behind its position (for tests and benches). */
  get restartCount(): number {
    return this.restarts
  }

  async *split(offset: number, length: number): AsyncGenerator<DiskExtent> {
    const end = offset + length
    if (length <= 0) return
    if (!this.allData && (!this.cur || offset < this.cur.offset)) await this.restart(offset)
    let o = offset
    while (o < end) {
      if (this.allData) {
        yield { offset: o, length: end - o, zero: false }
        return
      }
      while (this.cur && this.cur.offset + this.cur.length <= o) this.cur = await this.next()
      if (!this.cur) {
        // qemuImgMap covers [from, size) or throws: only a range past the node's end gets here.
        yield { offset: o, length: end - o, zero: false }
        return
      }
      const stop = Math.min(end, this.cur.offset + this.cur.length)
      yield { offset: o, length: stop - o, zero: this.cur.zero }
      o = stop
    }
  }

  async close(): Promise<void> {
    const it = this.it
    this.it = null
    this.cur = null
    await it?.return(undefined).catch(() => {})
  }

  private async next(): Promise<DiskExtent | null> {
    const r = await this.it!.next()
    return r.done ? null : r.value
  }

  private async restart(from: number): Promise<void> {
    if (this.it) {
      this.restarts++
      await this.close()
      if (this.restarts > MAX_RESTARTS) {
        this.allData = true
        return
      }
    }
    this.it = qemuImgMap({ node: this.opts.node, from, size: this.opts.size, label: this.opts.label })
    this.cur = await this.next()
  }
}
