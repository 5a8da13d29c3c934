/**
 * The node engine of {@link copyDisk} (copy-disk.ts): this process reads the reader's extents and
 * writes them to the volume.
 *
 * - Walks the reader's extents from the resume watermark, cut by the chunker into 4 MiB chunks
 *   (spec 8); zero extents are never read, they become zero runs.
 * - Keeps up to `readAhead` reads (default 4) and the writes of up to `writeDepth` chunks
 *   (default 8, {@link WRITE_DEPTH}; one more while the copy waits for the oldest) in flight so
 *   reading and writing overlap; reads reuse a fixed pool of 4 MiB
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
 */
import { createHash, type Hash } from 'node:crypto'
import { MigError } from '../errors.ts'
import { CHUNK_BYTES, ZERO_BUFFER, chunkExtents, splitZeroRuns, type Chunk } from './chunker.ts'
import { landInto, type DiskReader } from '../contracts/disk-reader.ts'
import type { SinkVolume, WriteSegment } from '../sink/types.ts'
import { type CopyDiskOptions, type CopyDiskResult, cancelled, capWait, DEFAULT_FLUSH } from './copy-common.ts'
import { startWriteback, writesBack } from './writeback.ts'

/**
 * Chunks whose writes may be queued on the volume's writer thread (4 MiB each): on fast storage
 * the thread's `pwrite` calls are the copy's slowest step, and with only a few queued it idles
 * while the job's event loop turns between chunks (docs/benchmarks.md has the measurements).
 * Costs 4 MiB of memory each.
 */
export const WRITE_DEPTH = 8

function hashZeros(h: Hash, n: number): void {
  while (n > 0) {
    const k = Math.min(n, ZERO_BUFFER.length)
    h.update(ZERO_BUFFER.subarray(0, k))
    n -= k
  }
}

/**
 * The node engine of {@link copyDisk}: copies `reader` into `volume` from `opts.from` to
 * `reader.size` in this process (see the module comment). Errors as {@link copyDisk}.
 */
export async function copyWithNode(reader: DiskReader, volume: SinkVolume, opts: CopyDiskOptions): Promise<CopyDiskResult> {
  const label = opts.label ?? volume.path
  const size = reader.size
  const from = Math.max(0, Math.min(Math.floor(opts.from), size))
  const flushEvery = Math.max(1, opts.flushEveryBytes ?? DEFAULT_FLUSH)
  const readAhead = Math.max(1, Math.min(16, opts.readAhead ?? reader.readAhead ?? 4))
  const writeDepth = Math.max(1, Math.min(16, opts.writeDepth ?? WRITE_DEPTH))
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
