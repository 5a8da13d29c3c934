/**
 * Disk reader of a stream-optimized VMDK (VMware "Virtual Disk Format 5.0",
 * "Stream-Optimized Compressed Sparse Extents", read the way qemu's `block/vmdk.c` reads it), in
 * place of qemu-img and qemu's `vmdk` driver: the disk of an OVA (read in place as a tar member)
 * or a `streamOptimized` VMDK file.
 *
 * - The grain directory comes from the footer when the header says `GD_AT_END`; the grain tables
 *   are read as needed ({@link SparseExtent}), every one of them checked at open (a table or grain
 *   entry outside the file fails the open, before any copy).
 * - `extents()`: a grain whose entry is 0 (absent: this reader reads no parent) or 1 (a zeroed
 *   grain) is a zero extent, never read; a stored grain is data.
 * - `read()`: the stored grains of the read are read from the file together (one positioned read
 *   for the grains that lie close together, as the file's writer leaves them), each grain
 *   marker checked (the grain's sector, as the table says, and a compressed size of 1 byte to
 *   twice the grain size, qemu's bound), then inflated on the inflating threads
 *   ({@link inflateGrains}) straight into the caller's buffer. A grain that does not inflate (bad
 *   deflate data, more than the grain size, fewer bytes than read) or lies past the end of the
 *   file (a truncated image) is `E_MIG_DISK_READ_FAILED` naming the grain, never zeros.
 * - Only what the module reads well is read here: files that are no stream-optimized extent
 *   (no `KDMV` magic, grains not deflate-compressed with markers), grains over 1 MiB and files
 *   whose data barely compresses ({@link INCOMPRESSIBLE}) make {@link openStreamVmdkReader}
 *   return null, and the caller leaves the file to qemu.
 * No `qemuNode`: the node engine copies this reader.
 */
import { MigError } from '../../errors.ts'
import { readAt } from '../../formats/io.ts'
import { VMDK_MARKER } from '../../formats/vmdk/hosted-sparse.ts'
import { GRAIN_MARKER_BYTES, SECTOR } from '../../formats/vmdk/limits.ts'
import { openStreamOptimizedExtent, type SparseExtent } from '../../formats/vmdk/sparse-extent.ts'
import type { Grain } from '../../formats/vmdk/sparse-codec.ts'
import type { DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'
import { inflateGrains, type GrainJob } from './grain-inflate.ts'
import { type ImageFile, type ImageFileOptions, imageFileView, openImageFile } from './image-file.ts'
import { isSharedView } from '../../script-thread.ts'

/** Largest grain read here, bytes (VMware and qemu write 64 KiB grains). */
const MAX_GRAIN_BYTES = 1024 * 1024

/**
 * A file larger than this share of its stored grains' bytes holds data that barely compresses
 * (random, encrypted or already compressed data: deflate stores it as it is): such a file is left
 * to qemu-img: on data that compresses well this reader's threads win, on data that does not,
 * qemu-img's one thread has little to inflate while the threads' per-grain costs show (the
 * measurements: docs/benchmarks.md). The threshold 0.8 lies between the two measured cases
 * (0.35 and about 1.0); it is chosen, not measured.
 */
const INCOMPRESSIBLE = 0.8

/** Longest extent yielded, bytes (the copy loop cuts its own chunks). */
const EXTENT_SPAN = 1024 * 1024 * 1024

/** Most bytes of the file read at once for the grains of one read. */
const SPAN_BYTES = 8 * 1024 * 1024

/**
 * Opens the VMDK at `path` (the byte range `offset`/`length` of it for a tar member). Returns the
 * reader of a stream-optimized extent (`size`: its capacity), or null for any other file (see the
 * module comment). Throws `E_MIG_DISK_READ_FAILED` (cannot open or read the file, range outside
 * the file, a damaged or truncated extent: no footer, a grain directory, grain table or grain
 * outside the file; "refusing to copy it").
 */
export async function openStreamVmdkReader(path: string, opts: ImageFileOptions = {}): Promise<DiskReader | null> {
  const file = await openImageFile(path, opts)
  try {
    const extent = await openStreamOptimizedExtent(imageFileView(file)).catch(refuseMalformed)
    if (!extent || extent.g.grainBytes > MAX_GRAIN_BYTES) {
      await file.fh.close()
      return null
    }
    const tables = Math.ceil(extent.g.capacityBytes / extent.span)
    let stored = 0
    for (let t = 0; t < tables; t++) for (const g of (await extent.tableGrains(t).catch(refuseMalformed)) ?? []) if (typeof g === 'number') stored++
    // (a remote input has no qemu to hand it to: this reader reads it whatever the ratio)
    if (!file.remote && stored > 0 && file.length > INCOMPRESSIBLE * stored * extent.g.grainBytes) {
      await file.fh.close()
      return null
    }
    return new StreamVmdkReader(file, extent)
  } catch (e) {
    await file.fh.close().catch(() => {})
    throw e
  }
}

/**
 * A damaged extent (`E_MIG_MALFORMED_ARCHIVE` of the format modules) as the copy refuses it:
 * `E_MIG_DISK_READ_FAILED`, "refusing to copy it"; other errors are thrown as they are.
 */
export function refuseMalformed(e: unknown): never {
  if (e instanceof MigError && e.code === 'E_MIG_MALFORMED_ARCHIVE')
    throw new MigError('E_MIG_DISK_READ_FAILED', `${e.message}; refusing to copy it`, { cause: e })
  throw e
}

/** A stored grain a read needs: its index, marker offset in the file, and the part of it read. Bytes. */
interface Wanted {
  grain: number
  at: number
  skip: number
  length: number
  dstOffset: number
}

class StreamVmdkReader implements DiskReader {
  readonly size: number
  /** Reads the copy keeps in flight: two (each split among the inflating threads) keep the threads busy; four held 20-50 MiB more of the threads' garbage. */
  readonly readAhead = 2
  private closed = false
  /** Scratch buffers (on `SharedArrayBuffer`s, read by the inflating threads) for the compressed bytes of a read. */
  private readonly scratch: Buffer[] = []

  constructor(
    private readonly file: ImageFile,
    private readonly extent: SparseExtent,
  ) {
    this.size = extent.g.capacityBytes
  }

  private fail(why: string, cause?: unknown): MigError {
    return new MigError('E_MIG_DISK_READ_FAILED', `${this.file.label}: ${why}`, cause ? { cause } : {})
  }

  async *extents(from: number): AsyncIterable<DiskExtent> {
    if (this.closed) throw this.fail('extents after close')
    const G = this.extent.g.grainBytes
    const perTable = this.extent.g.gtEntries
    let run: DiskExtent | null = null
    for (let t = Math.floor(Math.max(0, from) / this.extent.span); t * this.extent.span < this.size; t++) {
      const grains = await this.extent.tableGrains(t).catch(refuseMalformed)
      for (let k = 0; k < perTable; k++) {
        const s = Math.max(from, (t * perTable + k) * G)
        const e = Math.min(this.size, (t * perTable + k + 1) * G)
        if (e <= s) continue
        const zero = !grains || typeof grains[k] !== 'number'
        if (run && run.zero === zero && run.offset + run.length === s && run.length + (e - s) <= EXTENT_SPAN) run.length += e - s
        else {
          if (run) yield run
          run = { offset: s, length: e - s, zero }
        }
      }
    }
    if (run) yield run
  }

  async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
    if (this.closed) throw this.fail(`read at offset ${offset} after close`)
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > this.size)
      throw this.fail(`read of ${length} bytes at offset ${offset} is outside the disk (${this.size} bytes)`)
    const buf = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
    // The inflating threads write into a shared buffer: the caller's (the copy loop's are), else one of ours.
    const dst = isSharedView(buf) ? buf : Buffer.from(new SharedArrayBuffer(Math.max(1, length))).subarray(0, length)
    const G = this.extent.g.grainBytes
    const perTable = this.extent.g.gtEntries
    const wanted: Wanted[] = []
    // The grains of the table under `v`, decoded once per table the read spans.
    let t = -1
    let grains: Grain[] | null = null
    for (let v = offset; v < offset + length; ) {
      const gi = Math.floor(v / G)
      const n = Math.min(offset + length - v, (gi + 1) * G - v)
      if (Math.floor(gi / perTable) !== t) {
        t = Math.floor(gi / perTable)
        grains = await this.extent.tableGrains(t).catch(refuseMalformed)
      }
      const at = grains?.[gi % perTable]
      if (typeof at === 'number') wanted.push({ grain: gi, at, skip: v - gi * G, length: n, dstOffset: v - offset })
      else dst.fill(0, v - offset, v - offset + n)
      v += n
    }
    // Grains whose markers lie close together in the file are read in one span.
    for (let i = 0; i < wanted.length; ) {
      const start = wanted[i]!.at
      let j = i + 1
      while (j < wanted.length && wanted[j]!.at > wanted[j - 1]!.at && wanted[j]!.at + GRAIN_MARKER_BYTES + 2 * G - start <= SPAN_BYTES) j++
      await this.inflateSpan(wanted.slice(i, j), dst)
      i = j
    }
    if (dst !== buf) dst.copy(buf)
    return buf
  }

  /** Reads the grains of `group` (markers in increasing file order, within {@link SPAN_BYTES}) in one read, checks their markers and inflates them into `dst`. */
  private async inflateSpan(group: Wanted[], dst: Buffer): Promise<void> {
    const G = this.extent.g.grainBytes
    const start = group[0]!.at
    const end = Math.min(this.file.length, group[group.length - 1]!.at + GRAIN_MARKER_BYTES + 2 * G)
    const src = this.scratch.pop() ?? Buffer.from(new SharedArrayBuffer(SPAN_BYTES))
    try {
      const got = await readAt(this.file.fh, this.file.label, end - start, this.file.base + start, src)
      const jobs: GrainJob[] = []
      for (const w of group) {
        const m = w.at - start
        const where = `grain ${w.grain} (disk offset ${w.grain * G}, marker at file offset ${w.at})`
        if (m + GRAIN_MARKER_BYTES > got.length) throw this.fail(`${where} lies past the end of the file: the image is truncated; refusing to copy it`)
        const lba = got.readBigUInt64LE(m + VMDK_MARKER.lba)
        const size = got.readUInt32LE(m + VMDK_MARKER.size)
        if (lba !== BigInt((w.grain * G) / SECTOR))
          throw this.fail(`${where}: its marker names sector ${lba}, not ${(w.grain * G) / SECTOR}: the grain table is damaged; refusing to copy it`)
        if (size === 0 || size > 2 * G) throw this.fail(`${where}: compressed size ${size} is outside 1..${2 * G} bytes; refusing to copy it`)
        if (m + GRAIN_MARKER_BYTES + size > got.length)
          throw this.fail(`${where}: its ${size} compressed bytes run past the end of the file: the image is truncated; refusing to copy it`)
        jobs.push({ srcOffset: m + GRAIN_MARKER_BYTES, srcLength: size, grainBytes: G, skip: w.skip, length: w.length, dstOffset: w.dstOffset })
      }
      const failure = await inflateGrains(src, dst, jobs)
      if (failure) {
        const w = group[failure.index]!
        throw this.fail(
          `grain ${w.grain} (disk offset ${w.grain * G}, marker at file offset ${w.at}) does not inflate: ${failure.message}; refusing to copy it`,
        )
      }
    } finally {
      this.scratch.push(src)
    }
  }

  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    await this.file.fh.close().catch(() => {})
  }
}
