/**
 * The `read_disk` loop of spec 1.2 (offline importers; also live snapshot and delta copies):
 * copies one disk from a {@link DiskReader} into a {@link SinkVolume}.
 *
 * - Walks the reader's extents from the resume watermark, cut by the chunker into 4 MiB chunks
 *   (spec 8); zero extents are never read, they become zero runs.
 * - Keeps up to `readAhead` reads (default 4) and the writes of up to `writeDepth` chunks
 *   (default 2) in flight so reading and writing overlap; reads reuse a fixed pool of 4 MiB
 *   buffers, so memory stays flat (at most `readAhead + writeDepth + 1` chunk buffers). The
 *   buffers are on `SharedArrayBuffer`s: the volume's writer thread writes from them without a
 *   copy (lib/sink/writer-thread.ts).
 * - Each chunk read is cut into data and zero segments at the volume's block size; data is
 *   written, adjacent zero segments and zero extents are merged into runs discarded with
 *   `volume.zero()`.
 * - Every `flushEveryBytes` (default 256 MiB) of data read from the source, and at the end:
 *   pending zero run issued and writes completed, `volume.flush()` (fsync), then
 *   `onWatermark(w)`: all bytes below `w` are durable, so a persisted watermark never runs ahead
 *   of the destination (DESIGN.md section 4); between checkpoints the volume is flushed back to
 *   back (writeback, {@link startWriteback}; a block device's only until its writes go `O_DIRECT`),
 *   which moves no watermark. Zero extents, which a resumed copy handles again without reading
 *   anything, do not count (as the qemu-img engine's ranges): a sparse disk is not fsynced every
 *   256 MiB of holes. A resumed copy reads at most the data above the watermark plus one interval
 *   (and one chunk). Intermediate checkpoints run in the background while the copy goes on (at
 *   most one at a time); the final one is awaited.
 * - Optional digest: the bytes of `[0, size)` are hashed in order (bytes below `from` are
 *   re-read, not re-written) and compared at the end; only meaningful when the reader's bytes
 *   are the digested file's bytes (raw disks).
 * - The byte moving can be handed to qemu itself ({@link copyWithQemuImg}: `qemu-img convert`
 *   per range between checkpoints) when the reader has a qemu block node (and, for `auto`,
 *   prefers it: a qemu-nbd reader) and the volume a qemu target; the checkpoints, watermarks,
 *   progress, cap and cancel stay this module's.
 */
import { createHash, type Hash } from 'node:crypto'
import { availableParallelism } from 'node:os'
import { setTimeout as sleep } from 'node:timers/promises'
import { MigError } from '../errors.ts'
import { CHUNK_BYTES, ZERO_BUFFER, chunkExtents, splitZeroRuns, type Chunk } from './chunker.ts'
import { landInto, type DiskReader } from '../contracts/disk-reader.ts'
import type { SinkVolume, WriteSegment } from '../sink/types.ts'
import { qemuImgCopyRange } from './qemu-img-copy.ts'
import { prefetch } from './prefetch.ts'

/**
 * Progress of a copy. Bytes. `bytes_done`: `from` plus bytes handled (written or discarded) in
 * this run; `bytes_zero`: bytes discarded as zeros in this run; `watermark`: last durable
 * position; `bytes_read`: bytes read from the source in this run (qemu-img engine: the data
 * extents of the ranges handed to qemu-img, counted when each range is done).
 */
export interface CopyProgress {
  bytes_done: number
  bytes_zero: number
  watermark: number
  bytes_read?: number
}

/** Result of a copy, bytes of this run: read from the reader, written to the volume, discarded as zeros. */
export interface CopyDiskResult {
  bytes_read: number
  bytes_written: number
  bytes_zero: number
}

/** Options of {@link copyDisk}. Bytes. */
export interface CopyDiskOptions {
  /** Resume watermark: everything below it is already durable on the volume. */
  from: number
  /** Aborting stops the copy with `E_MIG_CANCELLED`. */
  signal: AbortSignal
  /** Called after each chunk. */
  onProgress(p: CopyProgress): void
  /** Called after each flush with the new durable watermark; awaited before the copy goes on. */
  onWatermark(watermark: number): Promise<void>
  /** Flush interval: bytes read from the source (data, not zero extents) between checkpoints (default 256 MiB). */
  flushEveryBytes?: number
  /** Reads in flight (1..16, default the reader's `readAhead`, else 4). */
  readAhead?: number
  /** Chunks whose writes may be in flight at once (1..16, default 2). */
  writeDepth?: number
  /** Zero-detection granularity (default the volume's `blockSize`, else 64 KiB). */
  zeroGranularity?: number
  /** Expected digest of the reader's bytes `[0, size)` (hex, lower or upper case). */
  digest?: { algorithm: 'sha1' | 'sha256' | 'sha512'; hex: string }
  /** Name used in messages (default the volume path). */
  label?: string
  /**
   * Bandwidth cap on bytes read from the source, bytes per second (0 or absent: unlimited), so
   * an import does not starve the source storage's other users.
   */
  maxBytesPerSecond?: number
  /**
   * Who moves the bytes: `node` (this loop reads and writes), `qemu-img` (qemu-img convert per
   * range between checkpoints, see {@link copyWithQemuImg}; needs `reader.qemuNode` and
   * `volume.qemuTarget`), `auto` (default: qemu-img when the reader prefers it
   * (`reader.preferQemuImg`: a qemu-nbd reader), both sides allow it and no digest is asked, else
   * node).
   */
  engine?: 'auto' | 'node' | 'qemu-img'
  /** qemu-img binary (default from PATH). */
  qemuImgPath?: string
  /**
   * qemu-img engine: ranges copied at once, each by its own `qemu-img convert` (1..4; default
   * and limits: {@link qemuImgProcesses}).
   */
  qemuProcesses?: number
  /**
   * Flush the volume back to back while the copy runs (see {@link startWriteback}), so the
   * kernel writes the page cache's data back as it comes instead of all at the next checkpoint.
   * Absent: while the volume asks for it ({@link SinkVolume.writeback}); true: whatever the volume
   * says; false: flushes only at checkpoints and at the end.
   */
  writeback?: boolean
}

/** Whether {@link copyDisk} hands this copy to qemu-img (see {@link CopyDiskOptions.engine}). */
export function usesQemuImg(reader: DiskReader, volume: SinkVolume, opts: Pick<CopyDiskOptions, 'engine' | 'digest'>): boolean {
  const engine = opts.engine ?? 'auto'
  if (engine === 'node') return false
  const able = !!reader.qemuNode && !!volume.qemuTarget && reader.size % 512 === 0 && !opts.digest
  if (engine === 'qemu-img' && !able)
    throw new MigError(
      'E_MIG_INTERNAL',
      `${volume.path}: the qemu-img copy engine needs a qemu source node, a qemu target, a size multiple of 512 bytes and no digest`,
    )
  return able && (engine === 'qemu-img' || !!reader.preferQemuImg)
}

const DEFAULT_FLUSH = 256 * 1024 * 1024

function cancelled(label: string, at: number): MigError {
  return new MigError('E_MIG_CANCELLED', `${label}: copy cancelled at offset ${at}`)
}

function hashZeros(h: Hash, n: number): void {
  while (n > 0) {
    const k = Math.min(n, ZERO_BUFFER.length)
    h.update(ZERO_BUFFER.subarray(0, k))
    n -= k
  }
}

/**
 * Copies `reader` into `volume` from `opts.from` to `reader.size` (see the module comment).
 * Throws `E_MIG_CANCELLED` (signal aborted; the watermark reported last stays valid),
 * `E_MIG_DISK_READ_FAILED` / `E_MIG_DISK_WRITE_FAILED` from the reader and the volume,
 * `E_MIG_MALFORMED_ARCHIVE` when a digest was given and differs.
 */
export async function copyDisk(reader: DiskReader, volume: SinkVolume, opts: CopyDiskOptions): Promise<CopyDiskResult> {
  if (usesQemuImg(reader, volume, opts)) return copyWithQemuImg(reader, volume, opts)
  const label = opts.label ?? volume.path
  const size = reader.size
  const from = Math.max(0, Math.min(Math.floor(opts.from), size))
  const flushEvery = Math.max(1, opts.flushEveryBytes ?? DEFAULT_FLUSH)
  const readAhead = Math.max(1, Math.min(16, opts.readAhead ?? reader.readAhead ?? 4))
  const writeDepth = Math.max(1, Math.min(16, opts.writeDepth ?? 2))
  const poolMax = readAhead + writeDepth + 1
  const gran = opts.zeroGranularity ?? volume.blockSize ?? 64 * 1024
  const signal = opts.signal
  const res: CopyDiskResult = { bytes_read: 0, bytes_written: 0, bytes_zero: 0 }
  if (signal.aborted) throw cancelled(label, from)

  const hash = opts.digest ? createHash(opts.digest.algorithm) : null
  if (hash && from > 0) await hashPrefix(reader, hash, from, signal, label)

  // ---- read side: chunk iterator + bounded read-ahead over a buffer pool ------------------
  type Item = { chunk: Chunk; read?: Promise<Buffer>; buf?: Buffer }
  const pool: Buffer[] = []
  const queue: Item[] = []
  let inFlight = 0
  let exhausted = false
  const it = chunkExtents(reader.extents(from), { from, size, label })[Symbol.asyncIterator]()
  let filling: Promise<void> | null = null
  const doFill = async (): Promise<void> => {
    while (!exhausted && inFlight < readAhead && queue.length < readAhead * 4 && !signal.aborted) {
      const r = await it.next()
      if (r.done) {
        exhausted = true
        break
      }
      const c = r.value
      if (c.zero) {
        queue.push({ chunk: c })
        continue
      }
      const buf = pool.pop() ?? Buffer.from(new SharedArrayBuffer(CHUNK_BYTES))
      const read = readChunk(reader, c, buf)
      read.catch(() => {}) // observed when its turn comes
      queue.push({ chunk: c, read, buf })
      inFlight++
    }
  }
  /** Starts (or joins) the one fill in progress: `it.next()` is never called concurrently. */
  const fill = (): Promise<void> => {
    if (filling) return filling
    const p: Promise<void> = doFill().finally(() => {
      if (filling === p) filling = null
    })
    filling = p
    return p
  }

  // ---- write side ----------------------------------------------------------------------------
  let zeroRun: { offset: number; length: number } | null = null
  let position = from
  let watermark = from
  let sinceFlush = 0
  let hashPos = from
  const issueZero = async () => {
    if (!zeroRun) return
    const z = zeroRun
    zeroRun = null
    await volume.zero(z.offset, z.length)
  }
  const addZero = async (offset: number, length: number) => {
    res.bytes_zero += length
    if (zeroRun && zeroRun.offset + zeroRun.length === offset) zeroRun.length += length
    else {
      await issueZero()
      zeroRun = { offset, length }
    }
  }
  // Writes of up to `writeDepth` chunks in flight; a chunk's buffer returns to the pool when
  // its writes are done.
  const writes: Array<{ done: Promise<void>; buf?: Buffer }> = []
  const drainWrites = async (keep: number) => {
    while (writes.length > keep) {
      const w = writes.shift()!
      await w.done
      if (w.buf && pool.length < poolMax) pool.push(w.buf)
    }
  }
  let checkpoint: Promise<void> | null = null
  const awaitCheckpoint = async () => {
    const c = checkpoint
    checkpoint = null
    if (c) await c
  }
  const settle = async () => {
    // Let reads and writes in flight finish (their errors are already observed) before returning.
    await Promise.allSettled([
      ...(queue.map((q) => q.read).filter(Boolean) as Promise<Buffer>[]),
      ...writes.map((w) => w.done),
      ...(checkpoint ? [checkpoint] : []),
    ])
    if (filling) await filling.catch(() => {})
    await it.return?.(undefined).catch(() => {})
  }

  const rate = opts.maxBytesPerSecond ?? 0
  const t0 = performance.now()
  const wanted = writesBack(volume, opts)
  const writeback = wanted ? startWriteback(volume, wanted, signal) : null

  try {
    await fill()
    while (queue.length > 0 || !exhausted) {
      if (signal.aborted) throw cancelled(label, position)
      if (queue.length === 0) {
        await fill()
        continue
      }
      const item = queue.shift()!
      const c = item.chunk
      const readBefore = res.bytes_read
      if (hash && c.offset > hashPos) hashZeros(hash, c.offset - hashPos)
      hashPos = c.offset + c.length
      let next: Promise<void>
      if (c.zero) {
        next = fill()
        if (hash) hashZeros(hash, c.length)
        await addZero(c.offset, c.length)
      } else {
        const data = await item.read!
        inFlight--
        next = fill()
        if (data.length !== c.length)
          throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: reader returned ${data.length} bytes for ${c.length} at offset ${c.offset}`)
        for (const piece of c.pieces ?? [c]) res.bytes_read += piece.length
        if (hash) {
          if (c.pieces) zeroGaps(data, c)
          hash.update(data)
        }
        // The chunk's data segments go to the volume as one call where it takes them so (its zero
        // runs are issued as they come: disjoint ranges, whose order changes no byte).
        const parts: Promise<void>[] = []
        const segments: WriteSegment[] = []
        let p = c.offset
        for (const piece of c.pieces ?? [c]) {
          if (piece.offset > p) await addZero(p, piece.offset - p)
          const view = data.subarray(piece.offset - c.offset, piece.offset - c.offset + piece.length)
          for (const s of splitZeroRuns(view, piece.offset, gran)) {
            if (s.zero) await addZero(s.offset, s.length)
            else {
              await issueZero()
              const start = s.offset - c.offset
              if (volume.writeSegments) segments.push({ offset: s.offset, start, length: s.length })
              else parts.push(volume.write(s.offset, data.subarray(start, start + s.length)))
              res.bytes_written += s.length
            }
          }
          p = piece.offset + piece.length
        }
        if (p < c.offset + c.length) await addZero(p, c.offset + c.length - p)
        if (segments.length > 0) parts.push(volume.writeSegments!(data, segments))
        const done = parts.length === 1 ? parts[0] : Promise.all(parts).then(() => {})
        done.catch(() => {}) // observed in drainWrites
        writes.push({ done, buf: item.buf })
        await drainWrites(writeDepth)
      }
      await next
      position = c.offset + c.length
      sinceFlush += res.bytes_read - readBefore
      if (sinceFlush >= flushEvery) {
        // Checkpoint: everything below `position` is written (page cache); the fsync runs in the
        // background while the copy goes on, and the watermark is reported once it returned.
        await issueZero()
        await drainWrites(0)
        await awaitCheckpoint()
        const mark = position
        checkpoint = volume.flush().then(async () => {
          watermark = mark
          await opts.onWatermark(mark)
        })
        checkpoint.catch(() => {}) // observed in awaitCheckpoint
        sinceFlush = 0
      }
      opts.onProgress({ bytes_done: from + res.bytes_written + res.bytes_zero, bytes_zero: res.bytes_zero, watermark, bytes_read: res.bytes_read })
      if (rate > 0) await capWait(res.bytes_read, rate, t0, signal)
    }
    if (signal.aborted) throw cancelled(label, position)
    await issueZero()
    await drainWrites(0)
    await awaitCheckpoint()
    await writeback?.stop()
    await volume.flush()
    watermark = size
    await opts.onWatermark(watermark)
    opts.onProgress({ bytes_done: from + res.bytes_written + res.bytes_zero, bytes_zero: res.bytes_zero, watermark, bytes_read: res.bytes_read })
  } catch (e) {
    await settle()
    await writeback?.stop().catch(() => {})
    throw e
  }
  if (hash && opts.digest) {
    if (hashPos < size) hashZeros(hash, size - hashPos)
    const actual = hash.digest('hex')
    if (actual !== opts.digest.hex.toLowerCase()) {
      throw new MigError(
        'E_MIG_MALFORMED_ARCHIVE',
        `${label}: ${opts.digest.algorithm.toUpperCase()} digest mismatch: expected ${opts.digest.hex.toLowerCase()}, data has ${actual}`,
      )
    }
  }
  return res
}

/** Zero-fills the parts of a pieced chunk's buffer between its data pieces. */
function zeroGaps(view: Buffer, c: Chunk): void {
  let p = c.offset
  for (const piece of c.pieces ?? []) {
    if (piece.offset > p) view.fill(0, p - c.offset, piece.offset - c.offset)
    p = piece.offset + piece.length
  }
  if (p < c.offset + c.length) view.fill(0, p - c.offset, c.length)
}

/**
 * Reads data chunk `c` into `buf` (at least 4 MiB): the whole chunk in one read, or with
 * `pieces` each data piece in parallel at its place in the buffer (the bytes between pieces are
 * left as they are). Resolves to the chunk's bytes: a view of `buf` or the reader's own buffer.
 */
async function readChunk(reader: DiskReader, c: Chunk, buf: Buffer): Promise<Buffer> {
  if (!c.pieces) return reader.read(c.offset, c.length, buf)
  const view = buf.subarray(0, c.length)
  await Promise.all(
    c.pieces.map(async (piece) => {
      const at = piece.offset - c.offset
      const into = view.subarray(at, at + piece.length)
      const got = await reader.read(piece.offset, piece.length, into)
      if (got.length !== piece.length)
        throw new MigError('E_MIG_DISK_READ_FAILED', `reader returned ${got.length} bytes for ${piece.length} at offset ${piece.offset}`)
      landInto(got, into)
    }),
  )
  return view
}

/** Hashes the reader's bytes below `end` (re-reading data, zeros for zero extents and gaps). */
async function hashPrefix(reader: DiskReader, hash: Hash, end: number, signal: AbortSignal, label: string): Promise<void> {
  const buf = Buffer.allocUnsafe(CHUNK_BYTES)
  let pos = 0
  for await (const c of chunkExtents(reader.extents(0), { from: 0, size: end, label })) {
    if (signal.aborted) throw cancelled(label, c.offset)
    if (c.offset > pos) hashZeros(hash, c.offset - pos)
    if (c.zero) hashZeros(hash, c.length)
    else {
      const data = await readChunk(reader, c, buf)
      if (c.pieces) zeroGaps(data, c)
      hash.update(data)
    }
    pos = c.offset + c.length
  }
  if (pos < end) hashZeros(hash, end - pos)
}

/** Ranges handed to qemu-img are cut on this alignment, bytes (1 MiB). */
const RANGE_ALIGN = 1024 * 1024

/** Ranges of the qemu-img engine found ahead of the one being copied (each a few numbers: memory stays flat). */
const RANGES_AHEAD = 2

/** One range of the qemu-img engine: `[offset, end)`, its data and zero extent bytes. */
interface QemuRange {
  offset: number
  end: number
  data: number
  zero: number
}

/**
 * Cuts the reader's extents from `from` into ranges holding about `flushEvery` bytes of data
 * each (cut on 1 MiB boundaries, or at a gap between extents, or at the disk's end).
 */
async function* qemuRanges(reader: DiskReader, from: number, size: number, flushEvery: number, label: string): AsyncGenerator<QemuRange> {
  let r: QemuRange | null = null
  let prevEnd = 0
  for await (const x of reader.extents(from)) {
    if (!Number.isSafeInteger(x.offset) || !Number.isSafeInteger(x.length) || x.offset < prevEnd || x.length < 0) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: reader yielded overlapping, unordered or invalid extents at offset ${x.offset}`)
    }
    prevEnd = x.offset + x.length
    let o = Math.max(x.offset, from)
    const stop = Math.min(x.offset + x.length, size)
    if (r && o > r.end) {
      yield r
      r = null
    }
    while (o < stop) {
      r ??= { offset: o, end: o, data: 0, zero: 0 }
      let cut = stop
      if (!x.zero && r.data + (stop - o) > flushEvery) {
        cut = Math.min(stop, Math.ceil((o + flushEvery - r.data) / RANGE_ALIGN) * RANGE_ALIGN)
      }
      if (x.zero) r.zero += cut - o
      else r.data += cut - o
      r.end = cut
      o = cut
      if (r.data >= flushEvery && r.end % RANGE_ALIGN === 0) {
        yield r
        r = null
      }
    }
  }
  if (r) yield r
}

/**
 * qemu-img processes the qemu-img engine runs at once into a block device (a zvol) by default,
 * each on its own range: 2, or 1 on a one-CPU host. qemu-img does its format work (inflating a
 * streamOptimized VMDK's grains, scanning for zeros) on one thread, so on two cores two ranges
 * side by side use both (about 1.7 times as fast on a streamOptimized VMDK; docs/benchmarks.md).
 * Into an image file the default stays 1: two ranges written at once insert their extents into
 * the file's extent tree out of disk order, and the file then takes more blocks than
 * `qemu-img convert`'s own, and the migrator's destination must take no more than qemu-img's;
 * a block device has no such tree (as for `-W`, see
 * lib/pipeline/qemu-img-copy.ts).
 */
export const QEMU_IMG_PROCESSES = Math.min(2, availableParallelism())

/**
 * How many qemu-img the engine runs at once: `requested` (1..4) when given, else
 * {@link QEMU_IMG_PROCESSES} into a target that takes writes out of order (a block device) and 1
 * into one that must be written in order (an image file); always 1 under a bandwidth cap
 * (`maxBytesPerSecond` > 0: each qemu-img's `-r` holds one process to it).
 */
export function qemuImgProcesses(target: { inOrder: boolean }, maxBytesPerSecond: number, requested?: number): number {
  if (maxBytesPerSecond > 0) return 1
  if (requested !== undefined) return Math.max(1, Math.min(4, Math.floor(requested)))
  return target.inOrder ? 1 : QEMU_IMG_PROCESSES
}

/** One range being copied by the qemu-img engine, with how much of it is done (bytes). */
interface QemuSlot {
  r: QemuRange
  done: number
  finished: boolean
}

/**
 * The qemu-img engine of {@link copyDisk}: the bytes are moved by `qemu-img convert`
 * ({@link qemuImgCopyRange}) one range per process, each range holding about `flushEveryBytes`
 * of data (per the reader's extents), up to {@link qemuImgProcesses} ranges at once; the migrator
 * keeps the rest of the contract:
 * - the ranges are found up to two ahead of those being copied (the reader's extents walked
 *   while qemu-img copies), and started in disk order;
 * - when the ranges done reach further without a gap (every range below done too), a checkpoint:
 *   `volume.flush()` (fsync of the whole volume, covering every range below), then
 *   `onWatermark(end of those ranges)`. Checkpoints run in the background, one at a time, in
 *   order; a failed one stops the copy. The final flush is awaited, then `onWatermark(size)`. A
 *   range copied past a range still running is not below any watermark until that one is done:
 *   after a kill, the copy resumes below both;
 * - while any qemu-img runs, the volume is flushed back to back (writeback, see
 *   {@link startWriteback}; a block device's only until its writes go `O_DIRECT`);
 * - ranges with no data extents are not given to qemu-img: `volume.zero()` (nothing on a fresh
 *   volume); zeros inside ranges are skipped by qemu-img, never written;
 * - progress after each qemu-img progress line: `bytes_done` is `from` plus the ranges done plus
 *   the running ranges' parts done (qemu-img's fraction); the bandwidth cap as qemu-img's `-r`
 *   inside a range and a pause between ranges (each qemu-img starts with a fresh budget) so the
 *   data extents read stay under the cap overall; cancel kills every qemu-img (and ends a pause);
 *   a failing range kills the others, and its error is thrown once all have exited.
 * `bytes_read`/`bytes_written` count the data extents of the ranges copied, `bytes_zero` the
 * zero extents. Errors as {@link copyDisk}.
 */
export async function copyWithQemuImg(reader: DiskReader, volume: SinkVolume, opts: CopyDiskOptions): Promise<CopyDiskResult> {
  const label = opts.label ?? volume.path
  const size = reader.size
  const from = Math.max(0, Math.min(Math.floor(opts.from), size))
  const flushEvery = Math.max(RANGE_ALIGN, opts.flushEveryBytes ?? DEFAULT_FLUSH)
  const signal = opts.signal
  const target = volume.qemuTarget!
  const res: CopyDiskResult = { bytes_read: 0, bytes_written: 0, bytes_zero: 0 }
  if (signal.aborted) throw cancelled(label, from)
  const rate = opts.maxBytesPerSecond ?? 0
  const lanes = qemuImgProcesses(target, rate, opts.qemuProcesses)
  // Aborted by the caller's signal, or by the first failure (the other qemu-imgs are killed).
  const stop = new AbortController()
  const onAbort = () => stop.abort()
  signal.addEventListener('abort', onAbort, { once: true })
  let failure: { error: unknown } | null = null
  const fail = (error: unknown) => {
    failure ??= { error }
    stop.abort()
  }

  let watermark = from
  // Ranges started and not yet below the point the checkpoints reached, in disk order.
  const open: QemuSlot[] = []
  let reached = from
  let checkpoint: Promise<void> = Promise.resolve()
  const progress = () => {
    let done = reached
    for (const s of open) done += s.done
    opts.onProgress({ bytes_done: done, bytes_zero: res.bytes_zero, watermark, bytes_read: res.bytes_read })
  }
  /** Moves `reached` over the ranges done from the lowest up, and asks for a checkpoint there. */
  const advance = () => {
    const before = reached
    while (open.length > 0 && open[0].finished) reached = open.shift()!.r.end
    if (reached === before) return
    const mark = reached
    checkpoint = checkpoint.then(async () => {
      await volume.flush()
      watermark = mark
      await opts.onWatermark(mark)
    })
    checkpoint.catch(fail)
  }
  const copyRange = async (slot: QemuSlot): Promise<void> => {
    const r = slot.r
    const len = r.end - r.offset
    if (r.data === 0) await volume.zero(r.offset, len)
    else {
      const targetIsZero = target.isZero(r.offset)
      target.noteWritten(r.end)
      await qemuImgCopyRange({
        source: reader.qemuNode!,
        target: target.node,
        offset: r.offset,
        length: len,
        targetIsZero,
        outOfOrder: !target.inOrder,
        targetDirect: target.takeDirect(r.data),
        maxBytesPerSecond: opts.maxBytesPerSecond,
        signal: stop.signal,
        label,
        qemuImgPath: opts.qemuImgPath,
        onFraction: (f) => {
          slot.done = Math.floor(len * f)
          progress()
        },
      })
    }
    res.bytes_read += r.data
    res.bytes_written += r.data
    res.bytes_zero += r.zero
    slot.done = len
    slot.finished = true
    advance()
    progress()
  }

  const running = new Set<Promise<void>>()
  const wanted = writesBack(volume, opts)
  const writeback = wanted ? startWriteback(volume, wanted, stop.signal) : null
  const t0 = performance.now()
  /** Under the cap, waits until the data read so far is within it (ended early by a failure or cancel). */
  const capPause = async () => {
    if (rate > 0 && !failure) await capWait(res.bytes_read, rate, t0, stop.signal)
  }
  try {
    // The ranges are found (the reader's extents: NBD block status, qemu-img map) up to
    // RANGES_AHEAD ahead, while qemu-img copies those before.
    for await (const r of prefetch(qemuRanges(reader, from, size, flushEvery, label), RANGES_AHEAD)) {
      while (running.size >= lanes && !failure) await Promise.race(running)
      // Each qemu-img starts with a fresh rate budget: the cap also holds across ranges.
      await capPause()
      if (failure || signal.aborted) break
      const slot: QemuSlot = { r, done: 0, finished: false }
      open.push(slot)
      const p: Promise<void> = copyRange(slot).then(
        () => {
          running.delete(p)
        },
        (e: unknown) => {
          running.delete(p)
          fail(e)
        },
      )
      running.add(p)
    }
  } catch (e) {
    fail(e)
  }
  await Promise.all(running)
  // The cap holds to the end, as between ranges: the copy takes at least its data at the cap's rate
  // (qemu-img's own `-r` lets a small range through at once).
  await capPause()
  // A failed writeback fsync fails the copy too; qemu-img's own failure is reported first.
  await writeback?.stop().catch(fail)
  await checkpoint.catch(() => {}) // a failure is in `failure`
  signal.removeEventListener('abort', onAbort)
  if (signal.aborted) throw cancelled(label, reached)
  if (failure) throw (failure as { error: unknown }).error
  await volume.flush()
  watermark = size
  await opts.onWatermark(size)
  progress()
  return res
}

/**
 * The bandwidth cap's wait: resolves once `bytesRead` bytes read since `t0` (`performance.now()`
 * ms) are within `rate` bytes per second, or at once when `signal` aborts. Never rejects.
 */
async function capWait(bytesRead: number, rate: number, t0: number, signal: AbortSignal): Promise<void> {
  const ahead = (bytesRead / rate) * 1000 - (performance.now() - t0)
  if (ahead > 1) await sleep(ahead, undefined, { signal }).catch(() => {})
}

/**
 * Whether a copy runs {@link startWriteback}: the option when given (true: whatever the volume
 * says), else while the volume asks for it.
 */
function writesBack(volume: SinkVolume, opts: Pick<CopyDiskOptions, 'writeback'>): (() => boolean) | null {
  if (opts.writeback === false) return null
  if (opts.writeback === true) return () => true
  return () => volume.writeback !== false
}

/** Pause after a writeback flush that found nothing to write, ms (no busy loop over an idle volume). */
const WRITEBACK_IDLE_MS = 10

/**
 * While a copy runs (either engine, from its start to its last write), flushes the volume back to
 * back (one fsync after the other, never two at once) so the kernel writes the data back as it
 * reaches the page cache, instead of all of it at the next checkpoint, which then finds little
 * left to write: the copy and its writeback overlap (the figures: docs/benchmarks.md,
 * "Measurements behind the data-path constants"). The loop ends for good once `wanted()` answers false
 * (before each flush: a block device whose writes went `O_DIRECT`, {@link SinkVolume.writeback}).
 * These flushes are no checkpoints: no watermark follows them (the checkpoints keep their own
 * flush). A flush that found nothing to write is followed by a 10 ms pause. `stop()` ends the
 * loop, waits for the flush in flight and rejects with its error (`E_MIG_DISK_WRITE_FAILED` from
 * the volume); an aborted `signal` ends the loop too.
 */
function startWriteback(volume: SinkVolume, wanted: () => boolean, signal: AbortSignal): { stop(): Promise<void> } {
  const stopped = new AbortController()
  const onAbort = () => stopped.abort()
  signal.addEventListener('abort', onAbort, { once: true })
  const loop = (async () => {
    while (!stopped.signal.aborted && wanted()) {
      const t0 = performance.now()
      await volume.flush()
      if (performance.now() - t0 < WRITEBACK_IDLE_MS) await sleep(WRITEBACK_IDLE_MS, undefined, { signal: stopped.signal }).catch(() => {})
    }
  })()
  loop.catch(() => {}) // observed by stop()
  return {
    stop() {
      stopped.abort()
      signal.removeEventListener('abort', onAbort)
      return loop
    },
  }
}
