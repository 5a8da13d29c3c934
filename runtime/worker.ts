/**
 * A job's worker process (DESIGN.md section 4), forked by the supervisor with the job id as its
 * argument, or with `--spare` as the warm spare worker that gets its job later (an `assign`
 * message; the module loading, the configuration and the store are done by then); it
 * says `ready` over IPC and receives the server's resolved configuration (`start`;
 * it never reads the environment for settings, so an app created in-process with a config object gets workers on
 * the same settings). It runs the orchestrator, writes state, progress and watermarks to SQLite, and
 * reports to the supervisor over IPC. A `cancel` message or the job's cancel flag aborts the job
 * (which ends `Cancelled`); losing the supervisor (IPC disconnect) or SIGTERM ends the process
 * and its children at once, leaving the job to be resumed from its durable watermarks.
 */
import { cpuTimes } from '../lib/cpu-time.ts'
import { loadOrCreateKey } from '../lib/crypto/keyring.ts'
import { Sealer } from '../lib/crypto/seal.ts'
import { runJob } from '../lib/jobs/orchestrator.ts'
import { openStore } from '../lib/store/index.ts'
import { dataPaths, type Config } from './config.ts'
import { SPARE_ARG, type SupervisorMessage, type WorkerMessage } from './ipc.ts'
import { buildJobDeps } from '../lib/jobs/job-deps.ts'
import { createLogger } from './logger.ts'
import { testBootHook } from '../lib/jobs/test-boot.ts'

/** The job id, or {@link SPARE_ARG} until a spare worker is assigned its job. */
let jobId = process.argv[2] ?? ''

/**
 * Phase boundaries of this worker run, epoch ms (the fixed-cost breakdown, logged as `job
 * timings` at info level when the job ends): `process` (the process started), `loaded` (every
 * module evaluated), `config` (the supervisor's configuration arrived), `assigned` (a spare
 * worker got its job), `deps` (store, key and job wiring ready), then the orchestrator's marks
 * (`inspected`, `volumes`, `copying`, `reader`, `copied`, `started`, `completed`).
 */
const timings: Array<[string, number]> = [
  ['process', Math.round(performance.timeOrigin)],
  ['loaded', Date.now()],
]
const mark = (name: string) => timings.push([name, Date.now()])

/** This process's CPU seconds so far, its threads and waited-for children (qemu-nbd, qemu-img, virsh) together. */
function cpuSeconds(): { user: number; system: number } | null {
  const t = cpuTimes()
  return t && { user: t.user + t.childUser, system: t.system + t.childSystem }
}
const send = (m: WorkerMessage) => {
  if (process.connected) process.send?.(m)
}

/** Ends this worker and everything it started (its own process group). */
function die(): never {
  try {
    process.kill(-process.pid, 'SIGKILL')
  } catch {}
  process.exit(1)
}

/** Tells the supervisor it listens, then waits for its `start` message with the configuration (fails after 30 s without it). */
function receiveConfig(): Promise<Config> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no configuration from the supervisor within 30 s')), 30_000)
    const onMessage = (m: SupervisorMessage) => {
      if (m.type !== 'start') return
      clearTimeout(timer)
      process.off('message', onMessage)
      resolve(m.config)
    }
    process.on('message', onMessage)
    process.once('disconnect', die)
    send({ type: 'ready' })
  })
}

/**
 * A spare worker's job: the supervisor's `assign` message. Listened for from the module's start,
 * before `ready` is sent, since it may arrive while the store is being opened; waits as long as
 * the supervisor keeps the spare.
 */
const assignment: Promise<string> | null =
  jobId === SPARE_ARG
    ? new Promise((resolve) => {
        const onMessage = (m: SupervisorMessage) => {
          if (m.type !== 'assign') return
          process.off('message', onMessage)
          resolve(m.jobId)
        }
        process.on('message', onMessage)
      })
    : null

async function main(): Promise<void> {
  const config = await receiveConfig()
  mark('config')
  const paths = dataPaths(config)
  const store = await openStore(paths.dbFile)
  const sealer = new Sealer(loadOrCreateKey(paths.keyFile))
  if (assignment) {
    jobId = await assignment
    mark('assigned')
  }
  // A spare's loading and configuration were done before its job existed: not the job's cost.
  const cpuAtStart = assignment ? cpuSeconds() : { user: 0, system: 0 }
  const logger = createLogger(config.logLevel).child({ job: jobId, worker: process.pid })
  const controller = new AbortController()

  process.on('message', (m: SupervisorMessage) => {
    if (m.type === 'cancel') controller.abort()
  })
  process.on('disconnect', die)
  process.on('SIGTERM', die)

  const beat = setInterval(async () => {
    send({ type: 'heartbeat' })
    if (!controller.signal.aborted && (await store.jobs.cancelRequested(jobId).catch(() => false))) controller.abort()
  }, 1000)

  const deps = await buildJobDeps({ config, paths, store, sealer, logger, jobId, signal: controller.signal })
  mark('deps')
  const job = await runJob({
    ...deps,
    mark,
    testBoot: testBootHook({ config, paths, store, logger }, jobId),
    onJob: (j) => send({ type: 'job', job: j }),
    onProgress: (p) => send({ type: 'progress', ...p }),
  })
  clearInterval(beat)
  logger.info({ state: job.state, last_error: job.last_error }, 'job ended')
  const cpuNow = cpuSeconds()
  // `cpu`: the job's CPU seconds (this process's threads and its waited-for children)
  const cpu = cpuNow && cpuAtStart ? { user: cpuNow.user - cpuAtStart.user, system: cpuNow.system - cpuAtStart.system } : null
  logger.info({ timings, cpu }, 'job timings')
  send({ type: 'done', job })
  await store.close()
  process.exit(0)
}

main().catch((e) => {
  process.stderr.write(`worker ${jobId}: ${e instanceof Error ? e.stack : String(e)}\n`)
  process.exit(2)
})
