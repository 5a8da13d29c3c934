/**
 * The qemu-img engine of {@link copyDisk} (copy-disk.ts): `qemu-img convert` moves the bytes
 * (one range per process, lib/pipeline/qemu-img-copy.ts) while the migrator keeps the
 * checkpoints, watermarks, progress, bandwidth cap and cancel (see {@link copyWithQemuImg}).
 */
import { availableParallelism } from 'node:os'
import { MigError } from '../errors.ts'
import type { DiskReader } from '../contracts/disk-reader.ts'
import type { SinkVolume } from '../sink/types.ts'
import { type CopyDiskOptions, type CopyDiskResult, cancelled, capWait, DEFAULT_FLUSH } from './copy-common.ts'
import { qemuImgCopyRange } from './qemu-img-copy.ts'
import { prefetch } from './prefetch.ts'
import { startWriteback, writesBack } from './writeback.ts'

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
