/**
 * Wires the orchestrator of one job to the real outer systems, from the settings (DESIGN.md
 * sections 4-6): one step module each, composed here into `OrchestratorDeps`: the source
 * preparation (prepare.ts), the destination sink and libvirt (destination.ts), the domain name
 * reservation (reserve.ts), the pre-copy checks (preflight.ts), the restore point
 * (restore-point.ts), the copy loop (copy.ts), the Windows V2V (convert.ts), the start with its
 * boot check (start.ts), a live import's run (lib/live-import/job.ts). Used by the job worker (`runtime/worker.ts`) with the configuration it
 * received (`settings.ts`); the test boot hook is test-boot.ts.
 */
import type { Sealer } from '../crypto/seal.ts'
import { readQemuUser } from '../host/qemu-access.ts'
import { redactHostPaths } from '../hostpath.ts'
import { runJobLiveImport } from '../live-import/job.ts'
import type { Store } from '../store/index.ts'
import { convertInPlace, windowsConversion } from './convert.ts'
import { copySteps } from './copy.ts'
import { sinkFromConfig, virshOf } from './destination.ts'
import type { OrchestratorDeps } from './orchestrator-deps.ts'
import { precopyChecks } from './preflight.ts'
import { sourcePreparation } from './prepare.ts'
import { domainNameReservation } from './reserve.ts'
import { restorePointStep } from './restore-point.ts'
import type { JobLogger, JobPaths, JobSettings } from './settings.ts'
import { domainStart, startStep } from './start.ts'

/** What the worker has at hand. `signal` aborts the job (cancel). */
export interface JobDepsInput {
  config: JobSettings
  paths: JobPaths
  store: Store
  sealer: Sealer
  logger: JobLogger
  jobId: string
  signal: AbortSignal
}

/**
 * Everything of `OrchestratorDeps` but the IPC callbacks (`onJob`, `onProgress`), for job
 * `input.jobId` (read to pick its destination pool). Throws `E_MIG_NOT_FOUND` for an unknown job,
 * `E_MIG_PERSIST_FAILED` when the store fails.
 */
export async function buildJobDeps(input: JobDepsInput): Promise<Omit<OrchestratorDeps, 'onJob' | 'onProgress'>> {
  const { config, paths, store, sealer, logger, jobId, signal } = input
  const pool = (await store.jobs.get(jobId)).plan.destination?.pool
  const sink = sinkFromConfig(config, pool)
  const virsh = virshOf(config)
  const now = () => new Date()
  // Both start work now that runs while the job inspects its source: `virsh list` for the name
  // reservation, the user qemu runs as for the pre-copy checks.
  const names = domainNameReservation({ jobs: store.jobs, virsh, now })
  const qemuUser = readQemuUser(config.qemuConf)
  qemuUser.catch(() => {}) // an unreadable qemu.conf fails the pre-copy checks, which await it
  const preflight = precopyChecks({ settings: config, paths, jobId, sink, pool, jobs: store.jobs, qemuUser })
  const convert = convertInPlace({ settings: config, sink, logger })
  const copy = copySteps(config, paths)
  const startDomain = domainStart({ settings: config, paths, jobId, virsh, convert, rename: names.rename, logger })

  return {
    jobId,
    jobs: store.jobs,
    watermarks: store.watermarks,
    now,
    signal,
    sink,
    keepOnCancel: config.keepOnCancel,
    spaceWait: copy.spaceWait,
    readRetry: copy.readRetry,
    redact: (message: string) => redactHostPaths(message, paths.importRoot, config.dataDir),
    reserveDomainName: names.reserve,
    delta: config.delta,
    cutover: { shutdownEstimateSeconds: config.guestShutdownTimeoutSeconds, startEstimateSeconds: config.domain.bootGraceSeconds },
    takeRestorePoint: restorePointStep(config, logger),
    preflight,
    prepare: sourcePreparation({ settings: config, paths, store, sealer, now }),
    copyDisk: copy.copyDisk,
    v2v: windowsConversion(convert),
    start: startStep(startDomain),
    liveImport: (job, source, volumes, hooks, carried) =>
      runJobLiveImport({
        job,
        source,
        volumes,
        hooks,
        carried,
        virsh,
        dataDir: config.dataDir,
        qemuUser,
        startDomain,
        signal,
        logger,
        cancelChoice: () => store.jobs.cancelChoice(job.id),
        bytesPerSecond: config.copy.maxBytesPerSecond,
        spaceWait: copy.spaceWait,
      }),
  }
}
