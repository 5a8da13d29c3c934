/**
 * The 4 MiB chunker with zero-run detection (spec 1.1 and 8: "Stream chunk size 4 MiB, with
 * zero-run detection"; DESIGN.md section 5).
 *
 * - {@link chunkExtents} turns a reader's extents into chunks: data extents are cut at 4 MiB
 *   boundaries (absolute offsets, so chunks of a resumed copy line up with a first run's), and
 *   adjacent zero extents are merged into one zero run of any length (never read).
 * - {@link isAllZero} is the fast all-zero test (memcmp against a shared zero buffer).
 * - {@link splitZeroRuns} cuts a chunk that was read into data and zero segments at a block
 *   granularity (the destination's block size), merging adjacent segments of the same kind, so
 *   the zeros inside a partly used 4 MiB chunk are discarded rather than written.
 */
import { MigError } from '../errors.ts'
import type { DiskExtent } from '../contracts/disk-reader.ts'

/** Chunk size of the data path, bytes (4 MiB, spec 8). */
export const CHUNK_BYTES = 4 * 1024 * 1024

/** A shared, never-written buffer of zeros (4 MiB) used for comparisons and zero-fill. */
export const ZERO_BUFFER: Buffer = Buffer.alloc(CHUNK_BYTES)

/**
 * A chunk to copy, bytes. `zero: true` chunks are zero runs (not read), others are at most 4 MiB
 * inside one aligned window. `pieces`, when present, lists the data extents of a data chunk
 * (ascending, inside it); the rest of the chunk is known zeros (zero extents between them), which
 * need neither reading nor scanning.
 */
export interface Chunk {
  offset: number
  length: number
  zero: boolean
  pieces?: Array<{ offset: number; length: number }>
}

/** Options of {@link chunkExtents}. Bytes. */
export interface ChunkOptions {
  /** Start of the copy (resume watermark); extents before it are clipped away. */
  from: number
  /** Disk size; extents beyond it are clipped. */
  size: number
  /** Maximum data chunk length and alignment (default {@link CHUNK_BYTES}). */
  chunkBytes?: number
  /** Name used in messages. */
  label?: string
}

/**
 * Splits `extents` into chunks (see the module comment). Within one aligned 4 MiB window, the
 * data extents and the zero extents between them form one data chunk whose `pieces` list the
 * data extents (so a window is read into one buffer with its data pieces read in parallel, and
 * the zeros between them are never read nor scanned); zero extents outside data windows are
 * merged into zero runs of any length. Extents must come in increasing order without overlaps; gaps between
 * them are skipped (nothing is yielded for them, and no chunk spans a gap).
 * Throws `E_MIG_DISK_READ_FAILED` when the reader yields overlapping, unordered or invalid extents.
 */
export async function* chunkExtents(extents: AsyncIterable<DiskExtent>, opts: ChunkOptions): AsyncGenerator<Chunk> {
  const step = opts.chunkBytes ?? CHUNK_BYTES
  const win = (o: number) => Math.floor(o / step)
  const end = (c: Chunk) => c.offset + c.length
  let prevEnd = 0
  let zr: Chunk | null = null // committed zero run, before `cur`
  let cur: Chunk | null = null // data chunk being built
  let pz: Chunk | null = null // zeros right after `cur` in its window, absorbed if data follows
  function* commitZero(c: Chunk): Generator<Chunk> {
    if (zr && end(zr) === c.offset) zr.length += c.length
    else {
      if (zr) yield zr
      zr = { ...c }
    }
  }
  function* flushCur(): Generator<Chunk> {
    if (!cur) return
    if (zr) yield zr
    zr = null
    yield cur
    cur = null
    if (pz) {
      zr = pz
      pz = null
    }
  }
  for await (const x of extents) {
    if (!Number.isSafeInteger(x.offset) || !Number.isSafeInteger(x.length) || x.offset < 0 || x.length < 0) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${opts.label ?? 'disk'}: reader yielded an invalid extent at offset ${x.offset}`)
    }
    if (x.offset < prevEnd)
      throw new MigError('E_MIG_DISK_READ_FAILED', `${opts.label ?? 'disk'}: reader yielded overlapping or unordered extents at offset ${x.offset}`)
    prevEnd = x.offset + x.length
    const start = Math.max(x.offset, opts.from)
    const stop = Math.min(x.offset + x.length, opts.size)
    if (stop <= start) continue
    const tail: number = cur ? end(pz ?? cur) : -1 // where an absorbable piece must start
    if (x.zero) {
      if (cur && tail === start) {
        const wEnd = (win(cur.offset) + 1) * step
        const inWin = Math.min(stop, wEnd)
        if (inWin > start) pz = { offset: pz ? pz.offset : start, length: inWin - (pz ? pz.offset : start), zero: true }
        if (stop > inWin) {
          yield* flushCur()
          yield* commitZero({ offset: inWin, length: stop - inWin, zero: true })
        }
      } else {
        yield* flushCur()
        yield* commitZero({ offset: start, length: stop - start, zero: true })
      }
      continue
    }
    for (let o = start; o < stop; ) {
      const next = Math.min(stop, (win(o) + 1) * step)
      if (cur && win(cur.offset) === win(o) && end(pz ?? cur) === o) {
        if (pz) {
          cur.pieces ??= [{ offset: cur.offset, length: cur.length }]
          cur.pieces.push({ offset: o, length: next - o })
        } else if (cur.pieces) cur.pieces[cur.pieces.length - 1].length += next - o
        cur.length = next - cur.offset
        pz = null
      } else {
        yield* flushCur()
        cur = { offset: o, length: next - o, zero: false }
      }
      o = next
    }
  }
  yield* flushCur()
  if (zr) yield zr
}

/** True when every byte of `buf` is zero (memcmp against {@link ZERO_BUFFER}, 4 MiB at a time). */
export function isAllZero(buf: Uint8Array): boolean {
  const b = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength)
  for (let o = 0; o < b.length; o += CHUNK_BYTES) {
    const n = Math.min(CHUNK_BYTES, b.length - o)
    if (b.compare(ZERO_BUFFER, 0, n, o, o + n) !== 0) return false
  }
  return true
}

/** Granules of {@link splitZeroRuns} checked at once before any is checked alone. */
const ZERO_SCAN_FANOUT = 16

/**
 * Cuts `buf`, the bytes at disk offset `offset`, into alternating data and zero segments whose
 * inner boundaries fall on multiples of `granularity` (absolute disk offsets; the first and last
 * segments may be partial). Adjacent segments of the same kind are merged. Bytes.
 * Each span of 16 granules (fewer when 16 exceed 4 MiB) is compared whole first (one memcmp against {@link ZERO_BUFFER}); only a
 * span holding data is compared granule by granule, so a zero area costs one call per 16 granules
 * (the calls, not the bytes, were most of the scan's time with 4 KiB granules). The segments are
 * the same as a granule-by-granule scan's.
 */
export function splitZeroRuns(buf: Buffer, offset: number, granularity: number): Chunk[] {
  const out: Chunk[] = []
  const g = Math.max(512, Math.min(granularity, CHUNK_BYTES))
  const span = g * Math.max(1, Math.min(ZERO_SCAN_FANOUT, Math.floor(CHUNK_BYTES / g))) // a multiple of g, at most ZERO_BUFFER's length
  const end = offset + buf.length
  // A non-zero first or last byte settles a range without a call into compare(): data granules
  // (nearly all of a chunk of data) then cost two byte reads, not a call per granule.
  const zeroAt = (from: number, to: number) =>
    buf[from - offset] === 0 && buf[to - offset - 1] === 0 && buf.compare(ZERO_BUFFER, 0, to - from, from - offset, to - offset) === 0
  const add = (from: number, to: number, zero: boolean) => {
    const last = out[out.length - 1]
    if (last && last.zero === zero) last.length += to - from
    else out.push({ offset: from, length: to - from, zero })
  }
  let o = offset
  while (o < end) {
    const spanEnd = Math.min(end, (Math.floor(o / span) + 1) * span)
    if (zeroAt(o, spanEnd)) {
      add(o, spanEnd, true)
      o = spanEnd
      continue
    }
    while (o < spanEnd) {
      const next = Math.min(spanEnd, (Math.floor(o / g) + 1) * g)
      add(o, next, zeroAt(o, next))
      o = next
    }
  }
  return out
}
