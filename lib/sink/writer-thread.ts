/**
 * A volume's writer thread: one `worker_threads` thread per {@link HandleVolume} that
 * writes the volume's data with `pwrite(2)` one write after another, in the order the copy issued
 * them. Writes issued concurrently on libuv's thread pool reach the file out of order, and ext4
 * then allocates more blocks (extent-tree blocks of a fragmented file) than `qemu-img convert`
 * does for the same data (measured: 232 to 1,556 KiB more on an 8 GiB disk of alternating
 * 64 KiB clusters); writes chained one after another on the thread pool keep the order but cost
 * a thread-pool round trip each (an 8 GiB copy took 10 s instead of 7 s). On its own thread the
 * writes stay in order while the job's event loop goes on reading the source.
 *
 * One call writes any number of segments of one buffer (a chunk's data pieces: an 8 GiB disk of
 * alternating 64 KiB clusters is 65,536 pieces, and a call, its message and its promise each, cost
 * the job's heap more than the pieces' bytes cost the copy). Buffers on a `SharedArrayBuffer`
 * reach the thread without a copy; any other buffer is copied once (only its view) and the copy
 * transferred. The thread is a {@link ScriptThread}.
 */
import { isSharedView, ScriptThread } from '../script-thread.ts'

/**
 * One call as the thread receives it: `segs` is a flat list of quadruples `fd, offset, start,
 * length` (bytes): `data[start, start+length)` written at `offset` through `fd`, through `alt`
 * when `fd` answers EINVAL; without `data`, `length` zero bytes (`start` unused).
 */
type WriteMessage = { alt: number; data?: Uint8Array; segs: number[] }

/**
 * What the thread answers for one call: `fellBack`, bytes of segments that `alt` wrote (their
 * `fd` answered EINVAL); `error`, the first failure: its errno `code`, the index `seg` of the
 * segment (in quadruples) and the volume offset `at` where its write stopped (bytes). The segments
 * after a failed one are not written.
 */
export type WriteOutcome = { fellBack: number; error?: { code?: string; message: string; seg: number; at: number } }

/**
 * The thread's handler: writes each segment of a {@link WriteMessage} with `fs.writeSync` until
 * all of it is written (a write of 0 bytes is ENOSPC), retries through `alt` when `fd` answers
 * EINVAL (an O_DIRECT handle refusing a buffer's memory alignment), stops at the first error.
 * Zeros come from the thread's own zero buffer.
 */
const HANDLER = `(() => {
  const { writeSync } = require('node:fs')
  const ZERO = new Uint8Array(1024 * 1024)
  return (w) => {
    const s = w.segs
    let fellBack = 0
    for (let i = 0; i < s.length; i += 4) {
      let fd = s[i], done = 0, alt = false
      const offset = s[i + 1], start = s[i + 2], length = s[i + 3]
      while (done < length) {
        try {
          const n = w.data
            ? writeSync(fd, w.data, start + done, length - done, offset + done)
            : writeSync(fd, ZERO, 0, Math.min(ZERO.length, length - done), offset + done)
          if (n === 0) return { fellBack, error: { code: 'ENOSPC', message: 'no progress (ENOSPC?)', seg: i / 4, at: offset + done } }
          done += n
        } catch (e) {
          if (e && e.code === 'EINVAL' && fd !== w.alt) { fd = w.alt; alt = true; continue }
          return { fellBack, error: { code: e && e.code, message: String((e && e.message) || e), seg: i / 4, at: offset + done } }
        }
      }
      if (alt) fellBack += length
    }
    return { fellBack }
  }
})()`

/**
 * The writer thread of one volume. The thread starts at the first write and ends at
 * {@link close}; it keeps the process alive only while writes are pending. Calls are sent in
 * batches, one per turn of the event loop, and done in the order of the calls.
 */
export class WriterThread {
  private readonly thread = new ScriptThread<WriteMessage, WriteOutcome>(HANDLER, 'writer thread')

  /**
   * Writes the segments `segs` of `data` (flat quadruples `fd, offset, start, length`, bytes:
   * `data[start, start+length)` at `offset` through `fd`), in order, each through `alt` when its
   * `fd` answers EINVAL. Resolves the outcome, never rejects: a failed write, or the thread's
   * death, is an outcome with an `error` (the caller names the volume and offset).
   */
  write(alt: number, data: Uint8Array, segs: number[]): Promise<WriteOutcome> {
    if (isSharedView(data)) return this.send({ alt, data, segs })
    // A copy of the view only (a Buffer's `slice` would be a view of the same memory, and the
    // transfer would take the caller's buffer away).
    const copy = new Uint8Array(data)
    return this.send({ alt, data: copy, segs }, copy.buffer)
  }

  /** Writes `length` zero bytes at `offset` through `fd`, in order with the writes. */
  zeros(fd: number, offset: number, length: number): Promise<WriteOutcome> {
    return this.send({ alt: fd, segs: [fd, offset, 0, length] })
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
    return this.thread.call(m, transfer).catch((e: Error) => ({ fellBack: 0, error: { message: e.message, seg: 0, at: m.segs[1] ?? 0 } }))
  }
}
