/**
 * The migrator's metrics in the Prometheus text exposition format 0.0.4 (served at
 * `{base}/metrics`, docs/operations.md), built with prom-client. Names follow the Prometheus
 * naming conventions: the `migrator_` prefix, base units (bytes, seconds) in the name, `_total`
 * on counters.
 *
 * Two kinds of figures:
 * - derived from the store at every scrape (they survive a restart): jobs by state and source
 *   kind, bytes copied and zero bytes skipped, copy rate, delta passes, boot checks, test boots by
 *   state, failures by `E_MIG_*` code, worker restarts, jobs waiting for space, the time of each
 *   running job's last update;
 * - counted by this process from the job events it publishes (they start at 0 with the process,
 *   which Prometheus' `rate()`/`increase()` treat as a counter reset): delta pass durations, test
 *   boots finished, space waits begun.
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client'
import type { Job } from '../job.ts'
import { SPACE_WAIT_NOTICE } from '../pipeline/space-wait.ts'
import type { JobFacts } from '../store/job-facts.ts'

/** Where the store-derived figures come from (`store.jobFacts`). */
export interface JobFactsSource {
  list(): Promise<JobFacts[]>
}

/** States of a job that has a worker (or a test boot) at work. */
const RUNNING_STATES = new Set(['CopyingFull', 'DeltaSyncing', 'CuttingOver', 'V2vProcessing', 'Starting'])

/** Test boot states that end a test boot. */
const TEST_BOOT_ENDED = new Set(['passed', 'failed', 'cancelled'])

/** Seconds: delta passes run from seconds (a few changed blocks) to hours (a busy multi-TiB VM). */
const DELTA_PASS_BUCKETS = [1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200]

/** Seconds: a boot check waits from seconds (serial evidence) to its grace period (minutes under TCG). */
const BOOT_CHECK_BUCKETS = [5, 15, 30, 60, 120, 180, 300, 600, 900]

/** Whether a job's notice says it waits for space (lib/pipeline/space-wait.ts). */
function waitingForSpace(fatal: boolean | null, message: string | null): boolean {
  return fatal === false && message !== null && message.startsWith(SPACE_WAIT_NOTICE)
}

/** The metrics of one migrator process over its store. */
export class MigratorMetrics {
  /** The registry rendered by {@link render}; holds only the migrator's metrics. */
  readonly registry = new Registry()
  /** The media type of {@link render}'s text (`text/plain; version=0.0.4; charset=utf-8`). */
  readonly contentType: string = this.registry.contentType

  private readonly jobs: Gauge
  private readonly copied: Counter
  private readonly zero: Counter
  private readonly rate: Gauge
  private readonly deltaPasses: Counter
  private readonly bootChecks: Histogram
  private readonly testBoots: Gauge
  private readonly failures: Counter
  private readonly restarts: Counter
  private readonly spaceWaiting: Gauge
  private readonly lastUpdate: Gauge
  private readonly deltaPassSeconds: Histogram
  private readonly testBootsFinished: Counter
  private readonly spaceWaits: Counter

  /** Per job, what the process-lifetime counters have seen already. */
  private readonly seen = new Map<string, { passes: number; testBoot: string | null; spaceWait: boolean }>()
  private rendering: Promise<unknown> = Promise.resolve()

  constructor(private readonly facts: JobFactsSource) {
    const registers = [this.registry]
    this.jobs = new Gauge({ name: 'migrator_jobs', help: 'Jobs in the store by state and source kind.', labelNames: ['state', 'source_kind'], registers })
    this.copied = new Counter({
      name: 'migrator_copied_bytes_total',
      help: 'Bytes of disk data written to destination volumes (zero runs excluded), over all jobs in the store.',
      labelNames: ['source_kind'],
      registers,
    })
    this.zero = new Counter({
      name: 'migrator_zero_skipped_bytes_total',
      help: 'Bytes found zero (or unallocated) and skipped instead of written, over all jobs in the store.',
      labelNames: ['source_kind'],
      registers,
    })
    this.rate = new Gauge({
      name: 'migrator_copy_rate_bytes_per_second',
      help: 'Copy rate of the running jobs together, bytes per second over their last 5 s.',
      registers,
    })
    this.deltaPasses = new Counter({ name: 'migrator_delta_passes_total', help: 'Delta passes of warm jobs, over all jobs in the store.', registers })
    this.bootChecks = new Histogram({
      name: 'migrator_boot_check_duration_seconds',
      help: 'Boot checks of started destination domains: seconds from the start to the verdict, by verdict (verified or unverified).',
      labelNames: ['verdict'],
      buckets: BOOT_CHECK_BUCKETS,
      registers,
    })
    this.testBoots = new Gauge({ name: 'migrator_test_boots', help: 'Jobs by the state of their latest test boot.', labelNames: ['state'], registers })
    this.failures = new Counter({ name: 'migrator_job_failures_total', help: 'Failed jobs in the store by E_MIG_* code.', labelNames: ['code'], registers })
    this.restarts = new Counter({
      name: 'migrator_worker_restarts_total',
      help: 'Job workers started again for a job that had one before (a worker died, or the server restarted).',
      registers,
    })
    this.spaceWaiting = new Gauge({ name: 'migrator_jobs_waiting_for_space', help: 'Jobs waiting for free space on a full file system.', registers })
    this.lastUpdate = new Gauge({
      name: 'migrator_job_last_update_timestamp_seconds',
      help: 'Unix time of the last update (state or progress) of each running job.',
      labelNames: ['job_id', 'state'],
      registers,
    })
    this.deltaPassSeconds = new Histogram({
      name: 'migrator_delta_pass_duration_seconds',
      help: 'Delta pass durations (snapshot, changed-area queries, copy), seen by this process.',
      buckets: DELTA_PASS_BUCKETS,
      registers,
    })
    this.testBootsFinished = new Counter({
      name: 'migrator_test_boots_finished_total',
      help: 'Test boots ended, by result (passed, failed, cancelled), seen by this process.',
      labelNames: ['result'],
      registers,
    })
    this.spaceWaits = new Counter({ name: 'migrator_space_waits_total', help: 'Space waits begun by jobs, seen by this process.', registers })
  }

  /**
   * Marks what the store holds already as seen, so that the process-lifetime counters count only
   * what happens from now on (a restarted server does not count a job's old passes again).
   * Throws `E_MIG_PERSIST_FAILED`.
   */
  async seed(): Promise<void> {
    for (const f of await this.facts.list()) {
      this.seen.set(f.id, {
        passes: f.delta_passes,
        testBoot: f.test_boot_state !== null && TEST_BOOT_ENDED.has(f.test_boot_state) ? f.test_boot_requested_at : null,
        spaceWait: waitingForSpace(f.error_fatal, f.error_message),
      })
    }
  }

  /**
   * Counts what a published job shows for the first time: delta passes recorded since the last
   * event (their durations), a test boot that ended, a space wait that began.
   */
  observeJob(job: Job): void {
    let s = this.seen.get(job.id)
    if (!s) {
      s = { passes: 0, testBoot: null, spaceWait: false }
      this.seen.set(job.id, s)
    }
    const c = job.cutover
    if (c && c.passes_total > s.passes) {
      for (const p of c.passes) if (p.pass > s.passes) this.deltaPassSeconds.observe(p.duration_s)
      s.passes = c.passes_total
    }
    const tb = job.test_boot
    if (tb && TEST_BOOT_ENDED.has(tb.state) && s.testBoot !== tb.requested_at) {
      this.testBootsFinished.inc({ result: tb.state })
      s.testBoot = tb.requested_at
    }
    const waiting = waitingForSpace(job.last_error?.fatal ?? null, job.last_error?.message ?? null)
    if (waiting && !s.spaceWait) this.spaceWaits.inc()
    s.spaceWait = waiting
  }

  /** The exposition text: the store-derived figures read now, then every metric. Throws `E_MIG_PERSIST_FAILED`. */
  render(): Promise<string> {
    const next = this.rendering
      .catch(() => {})
      .then(async () => {
        this.fill(await this.facts.list())
        return this.registry.metrics()
      })
    this.rendering = next
    return next
  }

  /** Sets the store-derived metrics from `facts` (all of them: a label that no job has any more disappears). */
  private fill(facts: JobFacts[]): void {
    for (const m of [
      this.jobs,
      this.copied,
      this.zero,
      this.rate,
      this.deltaPasses,
      this.bootChecks,
      this.testBoots,
      this.failures,
      this.restarts,
      this.spaceWaiting,
      this.lastUpdate,
    ]) {
      m.reset()
    }
    let rate = 0
    let waiting = 0
    let restarts = 0
    let passes = 0
    const jobs = new Map<string, { state: string; source_kind: string; n: number }>()
    const copied = new Map<string, number>()
    const zero = new Map<string, number>()
    const failures = new Map<string, number>()
    const testBoots = new Map<string, number>()
    for (const f of facts) {
      const key = `${f.state}\u0000${f.source_kind}`
      const j = jobs.get(key) ?? { state: f.state, source_kind: f.source_kind, n: 0 }
      j.n++
      jobs.set(key, j)
      copied.set(f.source_kind, (copied.get(f.source_kind) ?? 0) + Math.max(0, f.bytes_done - f.bytes_zero))
      zero.set(f.source_kind, (zero.get(f.source_kind) ?? 0) + f.bytes_zero)
      if (RUNNING_STATES.has(f.state)) {
        rate += f.rate_bytes_per_s
        this.lastUpdate.set({ job_id: f.id, state: f.state }, Date.parse(f.updated_at) / 1000)
      }
      if (RUNNING_STATES.has(f.state) && waitingForSpace(f.error_fatal, f.error_message)) waiting++
      if (f.state === 'Failed') failures.set(f.error_code ?? 'unknown', (failures.get(f.error_code ?? 'unknown') ?? 0) + 1)
      if (f.test_boot_state !== null) testBoots.set(f.test_boot_state, (testBoots.get(f.test_boot_state) ?? 0) + 1)
      if (f.boot_verified !== null && f.boot_seconds !== null) this.bootChecks.observe({ verdict: f.boot_verified ? 'verified' : 'unverified' }, f.boot_seconds)
      restarts += Math.max(0, f.attempts - 1)
      passes += f.delta_passes
    }
    for (const j of jobs.values()) this.jobs.set({ state: j.state, source_kind: j.source_kind }, j.n)
    for (const [source_kind, n] of copied) this.copied.inc({ source_kind }, n)
    for (const [source_kind, n] of zero) this.zero.inc({ source_kind }, n)
    for (const [code, n] of failures) this.failures.inc({ code }, n)
    for (const [state, n] of testBoots) this.testBoots.set({ state }, n)
    this.rate.set(rate)
    this.spaceWaiting.set(waiting)
    this.restarts.inc(restarts)
    this.deltaPasses.inc(passes)
  }
}
