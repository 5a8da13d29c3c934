/**
 * What a disk copy's entry point ({@link copyDisk}, copy-disk.ts) and its two engines
 * (copy-engine-node.ts, copy-engine-qemu-img.ts) share: the copy's options, progress and result,
 * the default checkpoint interval, the cancel error and the bandwidth cap's wait.
 */
import { setTimeout as sleep } from 'node:timers/promises'
import { MigError } from '../errors.ts'

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
  /** Chunks whose writes may be in flight at once (1..16, default `WRITE_DEPTH` of the node engine, 8). */
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

/** Default checkpoint interval: bytes of data read from the source between two checkpoints (256 MiB). */
export const DEFAULT_FLUSH = 256 * 1024 * 1024

/** `E_MIG_CANCELLED` for a copy of `label` stopped at byte offset `at`. */
export function cancelled(label: string, at: number): MigError {
  return new MigError('E_MIG_CANCELLED', `${label}: copy cancelled at offset ${at}`)
}

/**
 * The bandwidth cap's wait: resolves once `bytesRead` bytes read since `t0` (`performance.now()`
 * ms) are within `rate` bytes per second, or at once when `signal` aborts. Never rejects.
 */
export async function capWait(bytesRead: number, rate: number, t0: number, signal: AbortSignal): Promise<void> {
  const ahead = (bytesRead / rate) * 1000 - (performance.now() - t0)
  if (ahead > 1) await sleep(ahead, undefined, { signal }).catch(() => {})
}
