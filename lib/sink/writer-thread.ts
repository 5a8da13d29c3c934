/**
 * A volume's writer thread (issue 15): one `worker_threads` thread per {@link HandleVolume} that
 * writes the volume's data with `pwrite(2)` one write after another, in the order the copy issued
 * them. Writes issued concurrently on libuv's thread pool reach the file out of order, and ext4
 * then allocates more blocks (extent-tree blocks of a fragmented file) than `qemu-img convert`
 * does for the same data (measured: 232 to 1,556 KiB more on an 8 GiB disk of alternating
 * 64 KiB clusters); writes chained one after another on the thread pool keep the order but cost
 * a thread-pool round trip each (an 8 GiB copy took 10 s instead of 7 s). On its own thread the
 * writes stay in order while the job's event loop goes on reading the source.
 *
 * Buffers on a `SharedArrayBuffer` reach the thread without a copy; any other buffer is copied
 * once (only its view) and the copy transferred. The thread is a {@link ScriptThread}.
 */
import { isSharedView, ScriptThread } from '../script-thread.ts'

/** One write as the thread receives it: `data` at `offset` through `fd`; on EINVAL through `alt`. */
type WriteMessage = { fd: number; alt: number; offset: number; data?: Uint8Array; zeros?: number }

/** What the thread answers for one write: bytes done, whether `alt` took the rest, the error if any. */
export type WriteOutcome = { done: number; fellBack: boolean; error?: { code?: string; message: string } }

/**
 * The thread's handler: writes one {@link WriteMessage} with `fs.writeSync` until all of it is
 * written (a write of 0 bytes is ENOSPC), retries through `alt` when `fd` answers EINVAL (an
 * O_DIRECT handle refusing a buffer's memory alignment), and answers `{ done, fellBack, error }`.
 * `zeros` writes that many zero bytes from the thread's own zero buffer.
 */
const HANDLER = `(() => {
  const { writeSync } = require('node:fs')
  const ZERO = new Uint8Array(1024 * 1024)
  return (w) => {
    let fd = w.fd, done = 0, fellBack = false, error
    const length = w.data ? w.data.length : w.zeros
    while (done < length) {
      try {
        const n = w.data
          ? writeSync(fd, w.data, done, length - done, w.offset + done)
          : writeSync(fd, ZERO, 0, Math.min(ZERO.length, length - done), w.offset + done)
        if (n === 0) { error = { code: 'ENOSPC', message: 'no progress (ENOSPC?)' }; break }
        done += n
      } catch (e) {
        if (e && e.code === 'EINVAL' && fd !== w.alt) { fd = w.alt; fellBack = true; continue }
        error = { code: e && e.code, message: String(e && e.message || e) }
        break
      }
    }
    return { done, fellBack, error }
  }
})()`

/**
 * The writer thread of one volume. The thread starts at the first write and ends at
 * {@link close}; it keeps the process alive only while writes are pending. Writes are sent in
 * batches, one per turn of the event loop, and done in the order of the calls.
 */
export class WriterThread {
  private readonly thread = new ScriptThread<WriteMessage, WriteOutcome>(HANDLER, 'writer thread')

  /**
   * Writes all of `data` at `offset` (bytes) through file descriptor `fd`, and through `alt` when
   * `fd` answers EINVAL. Resolves the outcome, never rejects: a failed write, or the thread's
   * death, is an outcome with an `error` (the caller names the volume and offset).
   */
  write(fd: number, alt: number, offset: number, data: Uint8Array): Promise<WriteOutcome> {
    if (isSharedView(data)) return this.send({ fd, alt, offset, data })
    // A copy of the view only (a Buffer's `slice` would be a view of the same memory, and the
    // transfer would take the caller's buffer away).
    const copy = new Uint8Array(data)
    return this.send({ fd, alt, offset, data: copy }, copy.buffer)
  }

  /** Writes `length` zero bytes at `offset` through `fd`, in order with the writes. */
  zeros(fd: number, offset: number, length: number): Promise<WriteOutcome> {
    return this.send({ fd, alt: fd, offset, zeros: length })
  }

  /** Resolves once every write sent before is done (whatever its outcome). */
  drain(): Promise<void> {
    return this.thread.drain()
  }

  /** Waits for the writes sent before, then ends the thread. Never throws. */
  close(): Promise<void> {
    return this.thread.close()
  }

  private send(m: WriteMessage, transfer?: ArrayBuffer): Promise<WriteOutcome> {
    return this.thread.call(m, transfer).catch((e: Error) => ({ done: 0, fellBack: false, error: { message: e.message } }))
  }
}
