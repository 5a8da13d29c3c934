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
 * once (only its view) and the copy transferred. The thread's code is a script string run with
 * `eval` (a few lines, no imports of the project), so it runs alike under Bun (also from the
 * bundled job worker) and from Node's compiled output.
 */
import { Worker } from 'node:worker_threads'

/** One write as the thread receives it: `data` at `offset` through `fd`; on EINVAL through `alt`. */
type WriteMessage = { id: number; fd: number; alt: number; offset: number; data?: Uint8Array; zeros?: number }

/** What the thread answers for one write: bytes done, whether `alt` took the rest, the error if any. */
export type WriteOutcome = { done: number; fellBack: boolean; error?: { code?: string; message: string } }

/**
 * The thread's script: receives batches of {@link WriteMessage}, writes each in order with
 * `fs.writeSync` until all of it is written (a write of 0 bytes is ENOSPC), retries through `alt`
 * when `fd` answers EINVAL (an O_DIRECT handle refusing a buffer's memory alignment), and answers
 * one array of `{ id, done, fellBack, error }` per batch. `zeros` writes that many zero bytes
 * from the thread's own zero buffer.
 */
const SCRIPT = `
const { parentPort } = require('node:worker_threads')
const { writeSync } = require('node:fs')
const ZERO = new Uint8Array(1024 * 1024)
parentPort.on('message', (batch) => {
  const out = []
  for (const w of batch) {
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
    out.push({ id: w.id, done, fellBack, error })
  }
  parentPort.postMessage(out)
})
`

/**
 * The writer thread of one volume. The thread starts at the first write and ends at
 * {@link close}; it keeps the process alive only while writes are pending. Writes are sent in
 * batches, one per turn of the event loop, and done in the order of the calls.
 */
export class WriterThread {
  private worker: Worker | null = null
  private readonly waiting = new Map<number, (o: WriteOutcome) => void>()
  private batch: WriteMessage[] = []
  private transfer: ArrayBuffer[] = []
  private nextId = 1
  private last: Promise<WriteOutcome | void> = Promise.resolve()
  private failure: Error | null = null

  /**
   * Writes all of `data` at `offset` (bytes) through file descriptor `fd`, and through `alt` when
   * `fd` answers EINVAL. Resolves the outcome, never rejects: a failed write, or the thread's
   * death, is an outcome with an `error` (the caller names the volume and offset).
   */
  write(fd: number, alt: number, offset: number, data: Uint8Array): Promise<WriteOutcome> {
    if (!(data.buffer instanceof SharedArrayBuffer)) {
      // A copy of the view only (a Buffer's `slice` would be a view of the same memory, and the
      // transfer would take the caller's buffer away).
      data = new Uint8Array(data)
      this.transfer.push(data.buffer as ArrayBuffer)
    }
    return this.send({ id: 0, fd, alt, offset, data })
  }

  /** Writes `length` zero bytes at `offset` through `fd`, in order with the writes. */
  zeros(fd: number, offset: number, length: number): Promise<WriteOutcome> {
    return this.send({ id: 0, fd, alt: fd, offset, zeros: length })
  }

  /** Resolves once every write sent before is done (whatever its outcome). */
  async drain(): Promise<void> {
    await this.last
  }

  /** Waits for the writes sent before, then ends the thread. Never throws. */
  async close(): Promise<void> {
    await this.drain()
    const w = this.worker
    this.worker = null
    await w?.terminate().catch(() => {})
  }

  private send(m: WriteMessage): Promise<WriteOutcome> {
    if (this.failure) return Promise.resolve(this.dead())
    m.id = this.nextId++
    const p = new Promise<WriteOutcome>((resolve) => this.waiting.set(m.id, resolve))
    if (this.batch.length === 0) setImmediate(() => this.post())
    this.batch.push(m)
    this.last = p
    return p
  }

  /** The outcome of a write the thread will never do: it died. */
  private dead(): WriteOutcome {
    return { done: 0, fellBack: false, error: { message: `writer thread: ${this.failure?.message}` } }
  }

  private post(): void {
    const batch = this.batch
    const transfer = this.transfer
    this.batch = []
    this.transfer = []
    if (batch.length === 0) return
    const w = this.thread()
    w.ref()
    w.postMessage(batch, transfer)
  }

  private thread(): Worker {
    if (this.worker) return this.worker
    const w = new Worker(SCRIPT, { eval: true })
    w.on('message', (out: Array<WriteOutcome & { id: number }>) => {
      for (const o of out) {
        const resolve = this.waiting.get(o.id)
        this.waiting.delete(o.id)
        resolve?.(o)
      }
      // Idle: the thread no longer keeps the process alive.
      if (this.waiting.size === 0) w.unref()
    })
    const die = (e: unknown) => {
      this.failure = e instanceof Error ? e : new Error(`writer thread ended (${String(e)})`)
      for (const resolve of this.waiting.values()) resolve(this.dead())
      this.waiting.clear()
    }
    w.on('error', die)
    w.on('exit', (code) => {
      if (this.worker === w) die(new Error(`writer thread exited with code ${code}`))
    })
    this.worker = w
    return w
  }
}
