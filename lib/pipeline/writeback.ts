/**
 * The writeback loop of a disk copy (either engine, copy-engine-node.ts and
 * copy-engine-qemu-img.ts): the volume flushed back to back while the copy writes, so the kernel
 * writes the page cache's data back as it comes instead of all at the next checkpoint. These
 * flushes move no watermark; the engines' checkpoints keep their own flush.
 */
import { setTimeout as sleep } from 'node:timers/promises'
import type { SinkVolume } from '../sink/types.ts'
import type { CopyDiskOptions } from './copy-common.ts'

/**
 * Whether a copy runs {@link startWriteback}: the option when given (true: whatever the volume
 * says), else while the volume asks for it.
 */
export function writesBack(volume: SinkVolume, opts: Pick<CopyDiskOptions, 'writeback'>): (() => boolean) | null {
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
export function startWriteback(volume: SinkVolume, wanted: () => boolean, signal: AbortSignal): { stop(): Promise<void> } {
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
