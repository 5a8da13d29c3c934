/**
 * A `worker_threads` thread running a short script string: the data path's helpers
 * that must leave the job's event loop free (a volume's ordered writes, lib/sink/writer-thread.ts;
 * the XVA block digests, lib/crypto/hash-threads.ts). The script is run with `eval` and may only
 * `require` Node's built-in modules, so it runs alike under Bun (also from the bundled job worker)
 * and from Node's compiled output.
 *
 * Calls made in one turn of the event loop go to the thread as one message (an array) and are
 * handled in call order; the thread answers each batch with one array. The thread starts at the
 * first call, keeps the process alive only while calls are pending, and ends at {@link close}.
 *
 * A request's top-level fields that are views on a `SharedArrayBuffer` (the copy loop's chunk
 * buffers) are sent as numbers: the buffer itself goes to the thread once, with the first call
 * that uses it, and the thread keeps it until the caller's side lets it go (a
 * `FinalizationRegistry`) or the thread ends. Under Bun, posting a message that holds a
 * `SharedArrayBuffer` costs the caller about ten times what a message of numbers costs, which a
 * copy would pay once per block. A thread collects its heap when it forgets buffers: a thread's
 * small heap is seldom collected on its own, and the buffers it let go of would otherwise stay
 * in memory (up to gigabytes; docs/benchmarks.md).
 */
import { Worker } from 'node:worker_threads'

/** Whether `view` lies on a `SharedArrayBuffer`: a thread reads such a view in place, without a copy. */
export function isSharedView(view: Uint8Array): boolean {
  return view.buffer instanceof SharedArrayBuffer
}

/** The marker field of a shared view sent as numbers: `{ [SHARED_VIEW]: id, offset, length }` (bytes). */
const SHARED_VIEW = '__sharedView'

/**
 * The thread: `handler` is the source of a function expression `(request) => result` (it may
 * use the script's `require`); a request that throws answers `{ error: { code, message } }`.
 */
function script(handler: string): string {
  return `
const { parentPort } = require('node:worker_threads')
const handle = ${handler}
const shared = new Map()
const resolve = (request) => {
  if (!request || typeof request !== 'object') return request
  for (const k of Object.keys(request)) {
    const v = request[k]
    if (v && typeof v === 'object' && '${SHARED_VIEW}' in v) request[k] = new Uint8Array(shared.get(v.${SHARED_VIEW}), v.offset, v.length)
  }
  return request
}
parentPort.on('message', (batch) => {
  for (const [id, sab] of batch.share) shared.set(id, sab)
  for (const id of batch.drop) shared.delete(id)
  // A buffer let go of goes back to the system only once this thread's heap is collected too;
  // that heap is tiny and seldom collected on its own, so collect it now: Bun.gc under Bun, the
  // gc() that node --expose-gc gives every thread under Node (the supervisor forks job workers so).
  if (batch.drop.length > 0) {
    if (typeof Bun !== 'undefined') Bun.gc(true)
    else if (typeof gc === 'function') gc()
  }
  parentPort.postMessage(batch.calls.map((m) => {
    try { return { id: m.id, result: handle(resolve(m.request)) } }
    catch (e) { return { id: m.id, error: { code: e && e.code, message: String((e && e.message) || e) } } }
  }))
})
`
}

/** A call the thread could not answer: the handler threw (`code` its errno code, if any), or the thread died. */
export class ScriptThreadError extends Error {
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message)
  }
}

type Answer<Res> = { id: number; result?: Res; error?: { code?: string; message: string } }

/**
 * One thread running `handler` (see {@link script}) on requests of type `Req`, answering `Res`.
 * `name` prefixes the messages of a dead thread.
 */
export class ScriptThread<Req, Res> {
  private worker: Worker | null = null
  private readonly waiting = new Map<number, { resolve(r: Res): void; reject(e: Error): void }>()
  private batch: Array<{ id: number; request: Req }> = []
  private transfer: ArrayBuffer[] = []
  /** Shared buffers already sent to the thread (or in the batch), by their id there. */
  private readonly sharedIds = new WeakMap<SharedArrayBuffer, number>()
  private nextShared = 1
  /** Shared buffers to send with the next batch, and ids the thread may forget. */
  private share: Array<[number, SharedArrayBuffer]> = []
  private drop: number[] = []
  private readonly released = new FinalizationRegistry<number>((id) => this.drop.push(id))
  private nextId = 1
  private last: Promise<unknown> = Promise.resolve()
  private failure: Error | null = null
  private readonly source: string

  constructor(
    handler: string,
    private readonly name: string,
  ) {
    this.source = script(handler)
  }

  /**
   * Sends `request` (and moves the buffers in `transfer` to the thread). Resolves the handler's
   * result; rejects with a {@link ScriptThreadError} when the handler threw or the thread died.
   * A request's views on a `SharedArrayBuffer` reach the thread without a copy: the caller keeps
   * that memory unchanged until the call settles.
   */
  call(request: Req, transfer?: ArrayBuffer): Promise<Res> {
    if (this.failure) return Promise.reject(this.dead())
    const id = this.nextId++
    const p = new Promise<Res>((resolve, reject) => this.waiting.set(id, { resolve, reject }))
    if (this.batch.length === 0) setImmediate(() => this.post())
    this.batch.push({ id, request: this.byNumbers(request) })
    if (transfer) this.transfer.push(transfer)
    this.last = p
    return p
  }

  /** `request` with its top-level `SharedArrayBuffer` views replaced by their numbers (see the module comment). */
  private byNumbers(request: Req): Req {
    if (!request || typeof request !== 'object') return request
    let out: Record<string, unknown> | null = null
    for (const [k, v] of Object.entries(request)) {
      if (!(v instanceof Uint8Array) || !isSharedView(v)) continue
      const sab = v.buffer as SharedArrayBuffer
      let sid = this.sharedIds.get(sab)
      if (sid === undefined) {
        sid = this.nextShared++
        this.sharedIds.set(sab, sid)
        this.share.push([sid, sab])
        this.released.register(sab, sid)
      }
      out ??= { ...(request as Record<string, unknown>) }
      out[k] = { [SHARED_VIEW]: sid, offset: v.byteOffset, length: v.byteLength }
    }
    return (out ?? request) as Req
  }

  /** Calls pending (sent and not yet answered). */
  get pending(): number {
    return this.waiting.size
  }

  /** Resolves once every call made before is answered (whatever the answer). */
  async drain(): Promise<void> {
    await this.last.catch(() => {})
  }

  /** Waits for the calls made before, then ends the thread. Never throws. */
  async close(): Promise<void> {
    await this.drain()
    const w = this.worker
    this.worker = null
    await w?.terminate().catch(() => {})
  }

  private dead(): ScriptThreadError {
    return new ScriptThreadError(`${this.name}: ${this.failure?.message}`)
  }

  private post(): void {
    const calls = this.batch
    const transfer = this.transfer
    const share = this.share
    this.batch = []
    this.transfer = []
    this.share = []
    if (calls.length === 0) return
    const w = this.thread()
    w.ref()
    w.postMessage({ share, drop: this.drop.splice(0), calls }, transfer)
  }

  private thread(): Worker {
    if (this.worker) return this.worker
    const w = new Worker(this.source, { eval: true })
    w.on('message', (answers: Answer<Res>[]) => {
      for (const a of answers) {
        const p = this.waiting.get(a.id)
        this.waiting.delete(a.id)
        if (a.error) p?.reject(new ScriptThreadError(a.error.message, a.error.code))
        else p?.resolve(a.result as Res)
      }
      // Idle: the thread no longer keeps the process alive.
      if (this.waiting.size === 0) w.unref()
    })
    const die = (e: unknown) => {
      this.failure = e instanceof Error ? e : new Error(`thread ended (${String(e)})`)
      for (const p of this.waiting.values()) p.reject(this.dead())
      this.waiting.clear()
    }
    w.on('error', die)
    w.on('exit', (code) => {
      if (this.worker === w) die(new Error(`thread exited with code ${code}`))
    })
    this.worker = w
    return w
  }
}
