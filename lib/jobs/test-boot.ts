/**
 * Where test boots run (docs/test-boot.md):
 * - a warm job waiting in `DeltaSyncing`: in the job's worker, which owns the volumes and the
 *   job's lease; its delta loop takes the request at a pass boundary ({@link testBootHook}, the
 *   orchestrator's `TestBootHook`);
 * - a job that ended `Completed` with `plan.start: false`: no worker runs any more, nothing writes
 *   its volumes; the server runs it ({@link TestBootService}).
 * A crash leaves a record `running` and maybe a domain and a clone: a resumed worker removes its
 * job's ({@link recoverTestBoot}); the server's sweep (at start and every minute) removes those of
 * jobs no worker runs.
 */
import { mkdir } from 'node:fs/promises'
import * as path from 'node:path'
import { cleanupTestBoot, manifestOfDefinedDomain, runTestBoot, testBootDomainName } from '../domain/test-boot.ts'
import { MigError } from '../errors.ts'
import { TERMINAL_STATES, type Job, type TestBootRecord } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { TestBootHook } from './orchestrator-deps.ts'
import type { Sink } from '../sink/types.ts'
import type { Store } from '../store/index.ts'
import { bootCheckOf, sinkFromConfig, virshOf } from './destination.ts'
import type { JobLogger, JobPaths, JobSettings } from './settings.ts'

/** What a test boot needs of the process it runs in. */
interface TestBootEnv {
  config: JobSettings
  paths: JobPaths
  store: Store
  logger: JobLogger
}

/** Path of job `jobId`'s test boot serial log: `<data dir>/logs/<job id>.testboot.serial.log`. */
export function testBootSerialLog(paths: Pick<JobPaths, 'logs'>, jobId: string): string {
  return path.join(paths.logs, `${jobId}.testboot.serial.log`)
}

/** The sink of job `job` (its plan's pool for the zvol sink); `E_MIG_CONFLICT` when that sink cannot clone. */
function cloneOf(config: JobSettings, job: Job): { sink: Sink; clone: NonNullable<ReturnType<NonNullable<Sink['testBootClone']>>> } {
  const sink = sinkFromConfig(config, job.plan.destination?.pool)
  if (!sink.testBootClone) throw new MigError('E_MIG_CONFLICT', `the ${config.sink} sink cannot clone volumes for a test boot`)
  return { sink, clone: sink.testBootClone(job.id) }
}

/** Runs one test boot of `job` over its volumes (see lib/domain/test-boot.ts), recording every change on the job. */
function startTestBoot(
  env: TestBootEnv,
  job: Job,
  manifest: VmManifest,
  signal: AbortSignal,
  onJob: (job: Job) => void | Promise<void>,
): { holdsWrites: boolean; cloned: Promise<void>; done: Promise<TestBootRecord | null> } {
  const { config, paths, store, logger } = env
  let clonedResolve!: () => void
  const cloned = new Promise<void>((r) => (clonedResolve = r))
  let holdsWrites = true
  let clone: ReturnType<typeof cloneOf>['clone'] | null = null
  try {
    clone = cloneOf(config, job).clone
    holdsWrites = clone.holdsWrites
  } catch {
    /* recorded as the test boot's failure below */
  }
  const record = async (r: TestBootRecord) => {
    const j = await store.jobs.update(job.id, { test_boot: r }, new Date().toISOString())
    await onJob(j)
  }
  const done = (async () => {
    try {
      if (!clone) {
        const now = new Date().toISOString()
        const rec: TestBootRecord = {
          ...(job.test_boot as TestBootRecord),
          state: 'failed',
          started_at: now,
          finished_at: now,
          seconds: 0,
          error: `E_MIG_CONFLICT: the ${config.sink} sink cannot clone volumes for a test boot`,
        }
        await record(rec)
        return rec
      }
      await mkdir(paths.logs, { recursive: true, mode: 0o750 })
      const rec = await runTestBoot({
        job,
        manifest,
        clone,
        virsh: virshOf(config),
        domainType: config.domain.type,
        serialLogPath: testBootSerialLog(paths, job.id),
        bootCheck: bootCheckOf(config),
        signal,
        now: () => new Date(),
        record,
        onCloned: clonedResolve,
      })
      logger.info({ job: job.id, test_boot: { ...rec, serial_tail: undefined } }, 'test boot ended')
      return rec
    } catch (e) {
      logger.warn({ job: job.id, err: e }, 'test boot could not be recorded')
      return null
    } finally {
      clonedResolve()
    }
  })()
  return { holdsWrites, cloned, done }
}

/**
 * Removes what an interrupted test boot of `job` left (its domain, its clone) and records it
 * `cancelled` with `why`. Never throws: a failed removal is in the record's `error` and logged.
 */
export async function recoverTestBoot(env: TestBootEnv, job: Job, why: string, onJob: (job: Job) => void | Promise<void>): Promise<void> {
  const tb = job.test_boot
  if (!tb) return
  let error = why
  try {
    const name = tb.domain ?? testBootDomainName(job)
    await cleanupTestBoot(virshOf(env.config), name, job.id, cloneOf(env.config, job).clone)
    error += '; its domain and clone were removed'
  } catch (e) {
    error += `; removing its domain or clone failed: ${(e as Error).message}`
    env.logger.warn({ job: job.id, err: e }, 'could not remove an interrupted test boot')
  }
  const now = new Date().toISOString()
  try {
    const j = await env.store.jobs.update(job.id, { test_boot: { ...tb, state: 'cancelled', finished_at: now, error } }, now)
    await onJob(j)
  } catch (e) {
    env.logger.warn({ job: job.id, err: e }, 'could not record an interrupted test boot')
  }
}

/** The worker's test boot hook of job `jobId` (the orchestrator's `TestBootHook`). */
export function testBootHook(env: TestBootEnv, jobId: string): TestBootHook {
  return {
    requested: async () => (await env.store.jobs.testBoot(jobId))?.state === 'requested',
    start(job, manifest, _volumes, signal, onJob) {
      const h = startTestBoot(env, job, manifest, signal, onJob)
      return { holdsWrites: h.holdsWrites, cloned: h.cloned, done: h.done.then(() => {}) }
    },
    recover: (job, onJob) => recoverTestBoot(env, job, 'cancelled: the worker running the test boot ended (crash or restart)', onJob),
  }
}

/**
 * What the server's test boots need of the server: a test boot's environment, the clock, and
 * where each change of a job is published (the server's SSE hub). The server's handler context
 * (`runtime/context.ts` `Ctx`) has all of it.
 */
export interface TestBootServiceEnv extends TestBootEnv {
  now(): Date
  hub: { publishJob(job: Job): Promise<void> }
}

/**
 * The server's test boots: those of `Completed` jobs with `plan.start: false` (no worker), and the
 * sweep that removes what any interrupted test boot left. One test boot per job at a time.
 */
export class TestBootService {
  private readonly running = new Map<string, { stop: AbortController; done: Promise<unknown> }>()
  private timer: ReturnType<typeof setInterval> | null = null

  constructor(private readonly ctx: TestBootServiceEnv) {}

  private env(): TestBootEnv {
    return { config: this.ctx.config, paths: this.ctx.paths, store: this.ctx.store, logger: this.ctx.logger }
  }

  /** Sweeps now, then every `everyMs` (default 60 s). */
  start(everyMs = 60_000): void {
    void this.sweep()
    this.timer = setInterval(() => void this.sweep(), everyMs)
    this.timer.unref?.()
  }

  /**
   * Starts the test boot of `job` (a `Completed` job with `plan.start: false` whose test boot is
   * `requested`) in this process, its manifest rebuilt from the job's defined domain and its plan
   * (lib/domain/test-boot.ts `manifestOfDefinedDomain`). Returns once the domain is read; the test
   * boot goes on in the background. Throws `E_MIG_CONFLICT` (the test boot recorded `failed`) when
   * the job's domain is not defined any more.
   */
  async runDefined(job: Job): Promise<void> {
    if (this.running.has(job.id)) return
    const xml = await virshOf(this.ctx.config).run(['dumpxml', '--domain', job.domain!])
    if (xml.code !== 0) {
      const now = this.ctx.now().toISOString()
      const why = xml.stderr.trim()
      const failed = await this.ctx.store.jobs.update(
        job.id,
        { test_boot: { ...job.test_boot!, state: 'failed', finished_at: now, error: `the job's domain ${job.domain} cannot be read: ${why}` } },
        now,
      )
      await this.ctx.hub.publishJob(failed)
      throw new MigError('E_MIG_CONFLICT', `migration ${job.id}: its domain ${job.domain} is not defined any more (${why}): nothing to test-boot`)
    }
    this.run(job, manifestOfDefinedDomain(job, xml.stdout))
  }

  private run(job: Job, manifest: VmManifest): void {
    const stop = new AbortController()
    const h = startTestBoot(this.env(), job, manifest, stop.signal, (j) => this.ctx.hub.publishJob(j))
    const done = h.done.finally(() => this.running.delete(job.id))
    this.running.set(job.id, { stop, done })
  }

  /** Whether this server runs the test boot of `jobId` now. */
  has(jobId: string): boolean {
    return this.running.has(jobId)
  }

  /**
   * Finds test boots recorded `running` (or `requested` on a job that ended) that nobody runs: a
   * job that ended (no worker) and whose test boot this server does not run, the server having
   * died during it, or a worker given up. Removes their domain and clone and records them
   * `cancelled`. A running job's worker recovers its own. Never throws.
   */
  async sweep(): Promise<void> {
    try {
      for (const id of await this.ctx.store.jobs.withActiveTestBoot()) {
        if (this.running.has(id)) continue
        const job = await this.ctx.store.jobs.get(id)
        if (!TERMINAL_STATES.includes(job.state)) continue
        // a request a handler of this server is about to run is left alone for a while
        const tb = job.test_boot
        if (tb?.state === 'requested' && Date.now() - Date.parse(tb.requested_at) < 300_000) continue
        await recoverTestBoot(this.env(), job, 'cancelled: the server ended during the test boot (crash or restart)', (j) => this.ctx.hub.publishJob(j))
      }
    } catch (e) {
      this.ctx.logger.warn({ err: e }, 'test boot sweep failed')
    }
  }

  /** Cancels every test boot this server runs and waits for their cleanup. */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer)
    for (const r of this.running.values()) r.stop.abort('cancelled: the server stopped')
    await Promise.all([...this.running.values()].map((r) => r.done))
  }
}
