/**
 * Bounded inspects: at most `concurrency` inspects run at a time, each in a
 * worker thread of a small pool (the server's event loop keeps answering while a descriptor is
 * parsed); up to `queue` more wait their turn; beyond that the request is refused at once with
 * HTTP 503 `E_MIG_CONFLICT` and `Retry-After` (seconds), instead of piling parse trees up in memory.
 */
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { Worker } from 'node:worker_threads'
import { MigError, type ErrorCode, type ErrorDetails } from '../lib/errors.ts'
import type { InspectResult } from '../lib/importers/index.ts'
import type { InspectContext } from '../lib/importers/types.ts'
import type { ImporterKind } from '../lib/kinds.ts'

/** A request to a pool worker. */
export interface InspectRequest {
  id: number
  absPath: string
  ctx: InspectContext
  kind?: ImporterKind
}

/** A pool worker's answer. */
export type InspectReply =
  | { id: number; ok: true; result: InspectResult }
  | { id: number; ok: false; error: { code: ErrorCode; message: string; details?: ErrorDetails; status: number } }

/** Settings of {@link InspectPool}. */
export interface InspectPoolOptions {
  /** Inspects running at once (worker threads). */
  concurrency: number
  /** Inspects waiting for a free worker; more are refused with 503. */
  queue: number
  /** `Retry-After` of a refusal, seconds. */
  retryAfterSeconds: number
}

/** Path of the worker entry next to this module (`.ts` under Bun, compiled `.js` under Node). */
function workerPath(): string {
  const here = fileURLToPath(import.meta.url)
  const ext = here.endsWith('.ts') ? '.ts' : '.js'
  const p = here.replace(/inspect-pool\.(ts|js)$/, `inspect-worker${ext}`)
  if (!existsSync(p)) throw new Error(`inspect worker entry ${p} missing`)
  return p
}

interface Slot {
  worker: Worker
  pending: Map<number, { resolve(r: InspectResult): void; reject(e: unknown): void }>
}

/** The inspect pool. `run` has the signature of `inspectInput`. */
export class InspectPool {
  private readonly slots: Slot[] = []
  private running = 0
  private readonly waiting: Array<() => void> = []
  private nextId = 1

  constructor(private readonly opts: InspectPoolOptions) {}

  /**
   * Inspects `absPath` in a worker thread. Throws what `inspectInput` throws, and 503
   * `E_MIG_CONFLICT` (with `details.retry_after_seconds`) when `concurrency` inspects run and
   * `queue` more wait.
   */
  async run(absPath: string, ctx: InspectContext, kind?: ImporterKind): Promise<InspectResult> {
    if (this.running >= this.opts.concurrency) {
      if (this.waiting.length >= this.opts.queue) {
        throw new MigError(
          'E_MIG_CONFLICT',
          `too many inspects in progress (${this.running} running, ${this.waiting.length} waiting); retry in ${this.opts.retryAfterSeconds} s`,
          {
            status: 503,
            details: { retry_after_seconds: this.opts.retryAfterSeconds },
          },
        )
      }
      await new Promise<void>((resolve) => this.waiting.push(resolve))
    } else this.running++
    try {
      return await this.inWorker({ id: this.nextId++, absPath, ctx, kind })
    } finally {
      const next = this.waiting.shift()
      if (next) next()
      else this.running--
    }
  }

  private slot(): Slot {
    const idle = this.slots.find((s) => s.pending.size === 0)
    if (idle) return idle
    const worker = new Worker(workerPath())
    worker.unref()
    const slot: Slot = { worker, pending: new Map() }
    worker.on('message', (r: InspectReply) => {
      const p = slot.pending.get(r.id)
      if (!p) return
      slot.pending.delete(r.id)
      if (r.ok) p.resolve(r.result)
      else p.reject(new MigError(r.error.code, r.error.message, { status: r.error.status, ...(r.error.details ? { details: r.error.details } : {}) }))
    })
    const fail = (why: string) => {
      const i = this.slots.indexOf(slot)
      if (i >= 0) this.slots.splice(i, 1)
      for (const p of slot.pending.values()) p.reject(new MigError('E_MIG_INTERNAL', `inspect worker ${why}`))
      slot.pending.clear()
    }
    worker.on('error', (e) => fail(`failed: ${e.message}`))
    worker.on('exit', (code) => fail(`exited (${code})`))
    this.slots.push(slot)
    return slot
  }

  private inWorker(req: InspectRequest): Promise<InspectResult> {
    const slot = this.slot()
    return new Promise((resolve, reject) => {
      slot.pending.set(req.id, { resolve, reject })
      slot.worker.postMessage(req)
    })
  }

  /** Ends the worker threads. */
  async close(): Promise<void> {
    await Promise.all(this.slots.splice(0).map((s) => s.worker.terminate()))
  }
}
