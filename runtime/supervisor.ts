/**
 * The supervisor (DESIGN.md section 4): claims queued jobs from the SQLite job table with a
 * lease, respects the concurrency limit, runs each job in a worker child process (Bun when the
 * server runs under Bun, Node under Node) given the server's resolved configuration over IPC, relays the worker's events to the SSE hub, and
 * notices a worker that exits or stops heart-beating. A job whose worker died is retried
 * (bounded), resuming from its durable watermarks; a live job given up on has the snapshots its
 * attempts took removed from the source VM; a server restart resumes every job whose lease
 * expired.
 *
 * A warm spare worker (`MIGRATOR_WARM_WORKER`, on by default) is forked before any job is
 * claimed: it loads its modules, takes the configuration and opens the store while the server
 * is idle, and the next job is handed to it with an `assign` message instead of a fork (about
 * 100-150 ms of every job's fixed cost). A new spare is forked when a job's worker
 * ends. Each running worker's pid is in `<data dir>/workers/<job id>.pid` while it runs.
 */
import { removeOrphanSocketDirs, removeSocketDirsOf } from '../lib/pipeline/qemu-nbd.ts'
import { fork, type ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { fileURLToPath } from 'node:url'
import { readLivePid } from '../lib/exec.ts'
import { TERMINAL_STATES } from '../lib/job.ts'
import { giveUpJob } from '../lib/jobs/give-up.ts'
import type { Ctx } from './context.ts'
import { SPARE_ARG, type SupervisorMessage, type WorkerMessage } from './ipc.ts'
import { freshWorkerBundle } from './worker-bundle.ts'
import { ensureStoreReserve } from '../lib/store/persist.ts'

/** First and longest pause of the queue poll after the store failed, ms (doubling in between). */
const STORE_BACKOFF_MS = { first: 1000, max: 30_000 }

/**
 * The store's failures as the supervisor sees them (a full or read-only file system): the poll
 * backs off exponentially (1 s doubling to 30 s) while they last, and one warning is logged per
 * back-off step instead of one a second, with the store's own reason; its end is logged once.
 */
class StoreTrouble {
  private delay = 0
  private until = 0
  private lastLog = 0
  private failures = 0

  /** Whether the poll should wait (a back-off runs). */
  waiting(now: number): boolean {
    return now < this.until
  }

  /** Records a failure of `what`; returns whether to log it (the first of each back-off step). */
  failed(now: number): boolean {
    this.failures++
    this.delay = this.delay === 0 ? STORE_BACKOFF_MS.first : Math.min(STORE_BACKOFF_MS.max, this.delay * 2)
    this.until = now + this.delay
    if (now - this.lastLog < this.delay) return false
    this.lastLog = now
    return true
  }

  /** Records a success; returns the failures counted since the last success (0: none). */
  ok(): number {
    const n = this.failures
    this.failures = 0
    this.delay = 0
    this.until = 0
    return n
  }

  /** The current back-off, ms. */
  get backoffMs(): number {
    return this.delay
  }
}

/** Timing and retry settings (seconds unless the name says ms). */
export interface SupervisorOptions {
  /** How long a claim lasts without a heartbeat renewing it (default 30 s). */
  leaseSeconds: number
  /** A worker silent for this long is killed (default 20 s). */
  heartbeatTimeoutSeconds: number
  /** Worker runs of one job before it fails (default 3). */
  maxAttempts: number
  /** Queue poll interval in ms (default 1000). */
  pollMs: number
}

/** A worker process: a job's, or the spare until it is assigned one. */
interface Running {
  child: ChildProcess
  lastBeat: number
  /** The entry module it was forked with (the bundle or the `.ts`/`.js` worker). */
  entryPath: string
  /** The job it runs; null for the spare. */
  job: string | null
  /** It said `ready` and was sent the configuration. */
  ready: boolean
  /** A spare given a job before it was ready: the `assign` goes out with the configuration. */
  assignPending: boolean
}

/**
 * Under Bun, the worker's JavaScriptCore heap is sized as if the machine had 128 MiB of RAM
 * (`BUN_JSC_forceRAMSize`, unless the operator set it), so its collector keeps up with the
 * garbage of socket reads (a vim_api copy's datastore HTTPS reads) and the copy loop's buffer
 * churn and the worker stays under the 200 MiB a job may take, at no measurable cost in speed
 * (bench/vim-job.ts, bench/import.ts; docs/benchmarks.md). Node's collector needs no such hint.
 */
const BUN_WORKER_ENV: Record<string, string> =
  process.versions.bun && !process.env.BUN_JSC_forceRAMSize ? { BUN_JSC_forceRAMSize: String(128 * 1024 * 1024) } : {}

/**
 * Under Node, job workers run with `--expose-gc`: a worker thread (lib/script-thread.ts) collects
 * its heap when it forgets the copy loop's shared buffers, which otherwise stay in memory until
 * that thread's heap is collected on its own (Bun has `Bun.gc` in every thread).
 */
const WORKER_EXEC_ARGV: string[] = process.versions.bun ? [] : ['--expose-gc']

/**
 * Path of the worker entry: under Bun the bytecode bundle when it is fresh
 * (runtime/worker-bundle.ts), else the `.ts` module next to this one; under Node the compiled `.js`.
 */
function workerPath(): string {
  const here = fileURLToPath(import.meta.url)
  const ext = here.endsWith('.ts') ? '.ts' : '.js'
  if (ext === '.ts') {
    const bundle = freshWorkerBundle(path.dirname(path.dirname(here)))
    if (bundle) return bundle
  }
  const p = here.replace(/supervisor\.(ts|js)$/, `worker${ext}`)
  if (!existsSync(p)) throw new Error(`worker entry ${p} missing`)
  return p
}

/** Directory of the running workers' pid files of the server on `dataDir`: `<data dir>/workers`. */
function workerPidDir(dataDir: string): string {
  return path.join(dataDir, 'workers')
}

/** Path of the pid file of the worker running job `jobId` of the server on `dataDir`. */
export function workerPidFile(dataDir: string, jobId: string): string {
  return path.join(workerPidDir(dataDir), `${jobId}.pid`)
}

/** Runs jobs in worker processes. */
export class Supervisor {
  readonly owner = `${process.pid}-${randomUUID()}`
  private readonly running = new Map<string, Running>()
  private spare: Running | null = null
  private timer: ReturnType<typeof setInterval> | null = null
  private polling = false
  private stopped = false
  private readonly opts: SupervisorOptions
  private readonly storeTrouble = new StoreTrouble()
  private readonly leaseTrouble = new StoreTrouble()

  constructor(
    private readonly ctx: Ctx,
    opts: Partial<SupervisorOptions> = {},
  ) {
    this.opts = { leaseSeconds: 30, heartbeatTimeoutSeconds: 20, maxAttempts: 3, pollMs: 1000, ...opts }
  }

  /**
   * Removes the qemu-nbd socket directories and pid files of dead workers (a server killed with
   * its workers), forks the spare worker, then starts polling the queue.
   */
  start(): void {
    const orphans = removeOrphanSocketDirs()
    if (orphans) this.ctx.logger.info({ removed: orphans }, 'removed qemu-nbd socket directories of workers that no longer exist')
    this.removeDeadPidFiles()
    this.refillSpare()
    this.timer = setInterval(() => void this.poll(), this.opts.pollMs)
    this.timer.unref?.()
    void this.poll()
  }

  private writePidFile(job: string, pid: number | undefined): void {
    if (pid === undefined) return
    const file = workerPidFile(this.ctx.config.dataDir, job)
    try {
      mkdirSync(workerPidDir(this.ctx.config.dataDir), { recursive: true, mode: 0o700 })
      writeFileSync(file, `${pid}\n`, { mode: 0o600 })
    } catch (e) {
      this.ctx.logger.warn({ err: e, job }, 'could not write the worker pid file')
    }
  }

  private removePidFile(job: string): void {
    rmSync(workerPidFile(this.ctx.config.dataDir, job), { force: true })
  }

  /** Pid files whose process is gone (another server's live workers keep theirs). Never throws. */
  private removeDeadPidFiles(): void {
    const dir = workerPidDir(this.ctx.config.dataDir)
    try {
      for (const n of readdirSync(dir)) if (readLivePid(path.join(dir, n)) === null) rmSync(path.join(dir, n), { force: true })
    } catch {
      /* no directory yet */
    }
  }

  /** Forks a worker for `arg` (a job id or the spare's argument) and wires its messages and exit. */
  private fork(arg: string, job: string | null): Running {
    const entry = workerPath()
    const child = fork(entry, [arg], {
      execPath: process.execPath,
      execArgv: WORKER_EXEC_ARGV,
      detached: true,
      serialization: 'json',
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      env: { ...process.env, ...BUN_WORKER_ENV },
    })
    const w: Running = { child, entryPath: entry, lastBeat: Date.now(), job, ready: false, assignPending: false }
    child.on('message', (m: WorkerMessage) => void this.onMessage(w, m))
    child.once('exit', (code, signal) => {
      // A worker that died (SIGKILL, crash) cannot end its children: end its whole process group,
      // so no qemu-nbd or V2V tool outlives it.
      this.killGroup(child, 'SIGKILL')
      if (child.pid !== undefined) removeSocketDirsOf(child.pid)
      if (this.spare === w) this.spare = null
      if (w.job !== null) void this.onExit(w.job, code, signal)
    })
    return w
  }

  /** Forks the spare worker when there is none and the configuration asks for one. */
  private refillSpare(): void {
    if (this.spare || this.stopped || !this.ctx.config.warmWorker) return
    try {
      this.spare = this.fork(SPARE_ARG, null)
    } catch (e) {
      this.ctx.logger.warn({ err: e }, 'could not fork the spare worker')
    }
  }

  /** Looks at the queue now (after a submission). */
  notify(): void {
    void this.poll()
  }

  /** Number of workers running now. */
  get size(): number {
    return this.running.size
  }

  /** Asks the worker of `jobId`, if it runs here, to cancel. Returns whether one was told. */
  cancel(jobId: string): boolean {
    const r = this.running.get(jobId)
    if (!r?.child.connected) return false
    r.child.send({ type: 'cancel' } satisfies SupervisorMessage)
    return true
  }

  /**
   * Stops claiming and ends the workers (their jobs stay `running` and are resumed from their
   * watermarks by the next server once the lease expires).
   */
  async stop(): Promise<void> {
    this.stopped = true
    if (this.timer) clearInterval(this.timer)
    const all = [...this.running.values(), ...(this.spare ? [this.spare] : [])]
    const exits = all.map(
      (r) => new Promise<void>((resolve) => (r.child.exitCode !== null || r.child.signalCode !== null ? resolve() : r.child.once('exit', () => resolve()))),
    )
    for (const r of all) this.killGroup(r.child, 'SIGTERM')
    const hard = setTimeout(() => {
      for (const r of all) this.killGroup(r.child, 'SIGKILL')
    }, 5000)
    await Promise.all(exits)
    clearTimeout(hard)
  }

  private killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
    try {
      if (child.pid) process.kill(-child.pid, signal)
    } catch {
      child.kill(signal)
    }
  }

  private async poll(): Promise<void> {
    if (this.polling || this.stopped) return
    this.polling = true
    try {
      this.watchdog()
      if (this.storeTrouble.waiting(Date.now())) return
      while (this.running.size < this.ctx.config.maxJobs && !this.stopped) {
        const id = await this.ctx.store.jobs.claimNext(this.owner, this.opts.leaseSeconds, this.ctx.now(), this.ctx.config.maxJobsPerSource, [
          ...this.running.keys(),
        ])
        if (id === null) break
        await this.launch(id)
      }
      const failures = this.storeTrouble.ok()
      if (failures > 0) this.ctx.logger.warn({ failures }, 'supervisor: the store takes writes again')
      ensureStoreReserve()
    } catch (e) {
      if (this.storeTrouble.failed(Date.now()))
        this.ctx.logger.warn({ err: (e as Error).message, retry_in_ms: this.storeTrouble.backoffMs }, 'supervisor poll failed; backing off')
    } finally {
      this.polling = false
    }
  }

  private watchdog(): void {
    const limit = this.opts.heartbeatTimeoutSeconds * 1000
    for (const [id, r] of this.running) {
      if (Date.now() - r.lastBeat > limit) {
        this.ctx.logger.warn({ job: id }, 'worker stopped heart-beating; killing it')
        this.killGroup(r.child, 'SIGKILL')
      }
    }
  }

  private async launch(id: string): Promise<void> {
    const { jobs } = this.ctx.store
    const attempts = await jobs.addAttempt(id)
    if (attempts > this.opts.maxAttempts) {
      // the source VM is released (snapshots removed, powered on again) before the job ends Failed
      await this.ctx.hub.publishJob(await giveUpJob(this.ctx, id, attempts))
      return
    }
    const forkedAt = Date.now()
    const spare = this.spare?.child.connected ? this.spare : null
    let entry: Running
    if (spare) {
      this.spare = null
      entry = spare
      entry.job = id
      entry.lastBeat = Date.now()
      if (entry.ready) entry.child.send({ type: 'assign', jobId: id } satisfies SupervisorMessage)
      else entry.assignPending = true
    } else entry = this.fork(id, id)
    this.running.set(id, entry)
    this.writePidFile(id, entry.child.pid)
    this.ctx.logger.info({ job: id, pid: entry.child.pid, attempt: attempts, entry: entry.entryPath, forked_at: forkedAt, spare: !!spare }, 'worker started')
  }

  private async onMessage(entry: Running, m: WorkerMessage): Promise<void> {
    entry.lastBeat = Date.now()
    const id = entry.job
    try {
      if (m.type === 'ready') {
        entry.ready = true
        entry.child.send({ type: 'start', config: this.ctx.config } satisfies SupervisorMessage)
        if (entry.assignPending && id !== null) entry.child.send({ type: 'assign', jobId: id } satisfies SupervisorMessage)
        entry.assignPending = false
      } else if (id === null) return
      else if (m.type === 'heartbeat') {
        try {
          await this.ctx.store.jobs.renewLease(id, this.owner, this.opts.leaseSeconds, this.ctx.now())
          this.leaseTrouble.ok()
        } catch (e) {
          // The worker still runs the job (claimNext skips it): a lease the store cannot renew is no reason to stop it.
          if (this.leaseTrouble.failed(Date.now())) this.ctx.logger.warn({ err: (e as Error).message, job: id }, 'renewing a job lease failed')
        }
      } else if (m.type === 'job') await this.ctx.hub.publishJob(m.job)
      else if (m.type === 'progress') await this.ctx.hub.publishProgress({ id: m.id, state: m.state, progress: m.progress }, false)
    } catch (e) {
      this.ctx.logger.warn({ err: e, job: id }, 'relaying a worker message failed')
    }
  }

  private async onExit(id: string, code: number | null, signal: NodeJS.Signals | null): Promise<void> {
    this.running.delete(id)
    this.removePidFile(id)
    this.refillSpare()
    try {
      const job = await this.ctx.store.jobs.get(id)
      if (!TERMINAL_STATES.includes(job.state) && !this.stopped) {
        this.ctx.logger.warn({ job: id, code, signal, state: job.state }, 'worker ended before its job did; it will be retried')
        await this.ctx.store.jobs.releaseLease(id)
      }
    } catch (e) {
      this.ctx.logger.warn({ err: e, job: id }, 'inspecting an ended worker failed')
    }
    this.notify()
  }
}
