/**
 * `Ctx`: the dependencies every handler receives (DESIGN.md section 1). Tests build one over a
 * temporary data directory with {@link createContext}.
 */
import { chmodSync, mkdirSync, statSync } from 'node:fs'
import { loadOrCreateKey } from '../lib/crypto/keyring.ts'
import { Sealer } from '../lib/crypto/seal.ts'
import { MigratorMetrics } from '../lib/metrics/registry.ts'
import { openStore, type Store } from '../lib/store/index.ts'
import { dataPaths, type Config } from './config.ts'
import { createLogger, type Logger } from './logger.ts'
import { SseHub } from './sse-hub.ts'
import type { Job } from '../lib/job.ts'
import type { inspectInput } from '../lib/importers/index.ts'
import type { TestBootService } from '../lib/jobs/test-boot.ts'

/** What handlers may ask of the job runner (the supervisor), when one runs. */
export interface JobRunner {
  /** Look at the queue now. */
  notify(): void
  /** Tell the worker of a running job to cancel; false when no worker here runs it. */
  cancel(jobId: string): boolean
}

/** Handler dependencies. `now()` is the clock (tests may replace it). */
export interface Ctx {
  config: Config
  paths: ReturnType<typeof dataPaths>
  store: Store
  sealer: Sealer
  hub: SseHub
  logger: Logger
  /** The metrics of `GET /metrics` (lib/metrics/registry.ts), fed by the hub's job events. */
  metrics: MigratorMetrics
  now(): Date
  /** The job runner; absent in contexts that do not run jobs (handler unit tests). */
  runner?: JobRunner
  /** Bounded inspect in worker threads (`runtime/inspect-pool.ts`); absent: `inspectInput` in-line (handler unit tests). */
  inspect?: typeof inspectInput
  /** The server's test boots (lib/jobs/test-boot.ts); absent in contexts that do not run jobs. */
  testBoots?: TestBootService
}

/**
 * Prepares the data directory (search bits added for qemu: 0700 becomes 0711; import root 0750,
 * `.uploads` 0750, keyring 0700, store 0700, volumes 0711), loads or creates the sealing key, opens the store and builds the context.
 * Throws `KeyringError` (bad key file) or `E_MIG_PERSIST_FAILED` (store cannot open).
 */
export async function createContext(config: Config, opts: { logger?: Logger; now?: () => Date } = {}): Promise<Ctx> {
  const paths = dataPaths(config)
  // 0711 on the data dir and volumes/: qemu (libvirt's unprivileged user) must traverse to the
  // destination images of the file sink; nobody else may list them.
  mkdirSync(config.dataDir, { recursive: true, mode: 0o711 })
  // A data dir made elsewhere (`mktemp -d` is 0700) gets the search bits it needs, nothing more.
  const mode = statSync(config.dataDir).mode & 0o7777
  if ((mode & 0o011) !== 0o011) chmodSync(config.dataDir, mode | 0o011)
  for (const dir of [paths.importRoot, paths.uploads]) {
    mkdirSync(dir, { recursive: true, mode: 0o750 })
    chmodSync(dir, 0o750)
  }
  mkdirSync(paths.volumes, { recursive: true, mode: 0o711 })
  chmodSync(paths.volumes, 0o711)
  const key = loadOrCreateKey(paths.keyFile)
  const logger = opts.logger ?? createLogger(config.logLevel)
  const now = opts.now ?? (() => new Date())
  const store = await openStore(paths.dbFile)
  const hub = new SseHub(store.events, logger, config.eventReplayWindow, now)
  const metrics = await observedMetrics(store, hub)
  return { config, paths, store, sealer: new Sealer(key), hub, logger, now, metrics }
}

/**
 * The metrics over `store`, seeded with what the store holds and counting every job the hub
 * publishes from now on. Throws `E_MIG_PERSIST_FAILED`.
 */
async function observedMetrics(store: Store, hub: SseHub): Promise<MigratorMetrics> {
  const metrics = new MigratorMetrics(store.jobFacts)
  await metrics.seed()
  hub.observeJobs((job) => metrics.observeJob(job as Job))
  return metrics
}
