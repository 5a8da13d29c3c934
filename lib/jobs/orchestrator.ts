/**
 * The orchestrator: the state machine of spec 1.2 and 3 for one job.
 *
 *   live warm:   CopyingFull -> DeltaSyncing -> CuttingOver -> [V2vProcessing] -> Starting -> Completed
 *   live cold:   CopyingFull -> [V2vProcessing] -> Starting -> Completed
 *   offline:     CopyingFull (read_disk loop) -> [V2vProcessing] -> Starting -> Completed
 *   passthrough: CopyingFull (run_full_import: virt-v2v copies and converts) -> Starting -> Completed
 *
 * plus `Queued` (initial), `Failed` and `Cancelled`. V2vProcessing runs for Windows guests only.
 * A warm plan is downgraded to cold when the adapter cannot do warm or the VM has no CBT
 * (spec 1.4): `last_error` gets the non-fatal `E_MIG_CBT_UNSUPPORTED` and the job goes on.
 * A delta loop that does not converge within the configured passes fails with
 * `E_MIG_DELTA_TOO_LARGE`; an invalidated changeId (`E_MIG_CBT_RESET`) is answered in one pass
 * with a full copy of the reset disks from the new snapshot, a reset in a later pass fails the job. Cancellation ends in `Cancelled` with `E_MIG_CANCELLED` and removes
 * what the job created on the destination unless told to keep it.
 *
 * Resume: a job re-run after its worker died continues from its persisted state; offline copies
 * continue from each disk's durable watermark. Live copies restart from a fresh snapshot
 * (a changeId chain cannot be trusted across a crash).
 *
 * This file runs the states; the bytes are moved by the copy passes it calls: offline-copy.ts,
 * live-copy.ts (snapshots, deltas, cutover), the passthrough's `runFullImport`.
 */
import { MigError, asMigError } from '../errors.ts'
import type { HardwareRecord, Job, JobState, LastError } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { Plan } from '../plan.ts'
import type { JobPatch, JobsRepo } from '../store/jobs.ts'
import type { SinkVolume } from '../sink/types.ts'
import { ProgressTracker } from '../pipeline/progress.ts'
import { isSourceIoError, ReadRetryWindow } from '../pipeline/read-retry.ts'
import { shortageOf, waitForSpace } from '../pipeline/space-wait.ts'
import { TrailingThrottle } from '../throttle.ts'
import type { PreparedSource } from './prepared-source.ts'
import { copyOffline, openFirstReader, remainingBytes, type EarlyReader } from './offline-copy.ts'
import { coldSnapshotSource, copyLive } from './live-copy.ts'
import type { OrchestratorDeps, StartCarried, StartOutcome } from './orchestrator-deps.ts'

/** Least time between two progress snapshots of a job (ms); the job's stored progress and SSE `progress`. */
export const PROGRESS_EVERY_MS = 500

const ORDER: JobState[] = ['Queued', 'CopyingFull', 'DeltaSyncing', 'CuttingOver', 'V2vProcessing', 'Starting', 'Completed']

function cancelled(): MigError {
  return new MigError('E_MIG_CANCELLED', 'cancelled by operator')
}

/** True when the guest needs V2V: `plan.guest_os` wins over the manifest's detection. */
export function isWindows(plan: Plan, manifest: VmManifest): boolean {
  return (plan.guest_os ?? manifest.guest_os.family) === 'windows'
}

/** Runs (or resumes) job `deps.jobId` to a terminal state. Never throws for job failures. */
export async function runJob(deps: OrchestratorDeps): Promise<Job> {
  const { jobs, jobId, signal } = deps
  const iso = () => deps.now().toISOString()
  let job = await jobs.get(jobId)
  if (job.status === 'completed' || job.status === 'failed' || job.status === 'cancelled') return job
  const resumedAt = ORDER.indexOf(job.state)
  let notice: LastError | null = job.last_error && !job.last_error.fatal ? job.last_error : null

  const setState = async (state: JobState, extra: Parameters<JobsRepo['update']>[1] = {}) => {
    job = await jobs.update(jobId, { state, ...extra }, iso())
    deps.onJob(job)
  }
  const reached = (state: JobState) => resumedAt > ORDER.indexOf(state)
  const patch = async (extra: JobPatch) => {
    job = await jobs.update(jobId, extra, iso())
    deps.onJob(job)
    return job
  }
  // The destination domain was started: from then on a failure never brings the source back.
  let destinationRunning = false

  let source: PreparedSource | null = null
  let early: EarlyReader | null = null
  let volumes: SinkVolume[] = []
  let tracker: ProgressTracker | null = null
  // A throttled update goes out when its interval ends, so the last one is never lost.
  const progressThrottle = new TrailingThrottle<void>(
    PROGRESS_EVERY_MS,
    () => {
      if (!tracker) return
      const progress = tracker.snapshot()
      void jobs.update(jobId, { progress }, iso()).catch(() => {})
      deps.onProgress({ id: jobId, state: job.state, progress })
    },
    () => {},
    () => deps.now().getTime(),
  )
  const emit = (force = false) => {
    if (tracker) void progressThrottle.offer(undefined, force).catch(() => {})
  }

  try {
    // A cancel that came while no worker ran a live import whose guest runs (the server was down)
    // reaches the live import, which honours its choice (docs/live-import.md); any other ends here.
    if (signal.aborted && !(job.plan.live_import && job.domain && job.state === 'CopyingFull')) throw cancelled()
    // a test boot the previous worker of this job left (a crash): its domain and clone go first
    if (job.test_boot?.state === 'running') {
      await deps.testBoot?.recover(job, deps.onJob)
      job = await jobs.get(jobId)
    }
    source = await deps.prepare(job, signal)
    deps.mark?.('inspected')
    const manifest = source.manifest
    if (manifest.disks.length === 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${manifest.name}: the source has no disks to migrate`)
    if (deps.reserveDomainName && !job.domain) {
      await deps.reserveDomainName(job, manifest)
      job = await jobs.get(jobId) // published with the next state change
    }
    if (job.plan.restore_point && job.restore_point === null) {
      if (!deps.takeRestorePoint)
        throw new MigError('E_MIG_SNAPSHOT_FAILED', 'the plan asks for a restore point but no backup API is configured (MIGRATOR_BACKUP_URL)')
      const point = await deps.takeRestorePoint(job, signal)
      job = await jobs.update(jobId, { restore_point: point }, iso())
      deps.onJob(job)
    }
    let resumed = new Map((await deps.watermarks.list(jobId)).map((w) => [w.disk_label, w.watermark_bytes]))
    if (source.strategy === 'live') resumed.clear()
    tracker = new ProgressTracker(manifest.disks, resumed, () => deps.now().getTime())
    // A live job resumed in CuttingOver copies again (the source is down: one snapshot, full copy).
    const liveResumedInCutover = source.strategy === 'live' && job.state === 'CuttingOver'
    const copies = (!reached('DeltaSyncing') && !reached('CuttingOver')) || liveResumedInCutover
    if (source.strategy === 'offline' && copies && !job.plan.live_import) early = openFirstReader(source, resumed)
    await deps.preflight?.(job, manifest)
    volumes = []
    for (const d of manifest.disks) volumes.push(await deps.sink.create(jobId, d.label, d.capacity_bytes))
    deps.mark?.('volumes')

    if (!reached('CopyingFull')) {
      await setState('CopyingFull', { started_at: job.started_at ?? iso(), progress: tracker.snapshot() })
    }
    deps.mark?.('copying')

    let liveOutcome: StartOutcome | null = null
    let carried: StartCarried = {}
    if (copies) {
      if (job.plan.live_import) {
        if (!deps.liveImport || source.strategy === 'passthrough')
          throw new MigError('E_MIG_INVALID_PLAN', 'plan.live_import: this source or worker cannot run a live import (docs/live-import.md)')
        // a live adapter's VM is shut down and read from one snapshot, kept while the guest's
        // overlays may need it (a failure after the guest started keeps its writes over it)
        const from = source.strategy === 'live' ? await coldSnapshotSource(deps, source, patch) : { served: source, nvram: null, release: null }
        carried = { nvram: from.nvram }
        try {
          liveOutcome = await deps.liveImport(job, from.served, volumes, { progress: (label, done) => (tracker!.setDone(label, done), emit()), patch }, carried)
        } catch (e) {
          if (!job.hardware?.boot || signal.aborted) await from.release?.()
          throw e
        }
        await from.release?.()
        for (const d of manifest.disks) tracker.finish(d.label)
      } else if (source.strategy === 'offline') {
        const readRetry = deps.readRetry && deps.readRetry.seconds > 0 ? new ReadRetryWindow(deps.readRetry) : null
        for (;;) {
          try {
            await copyOffline(deps, source, volumes, tracker, resumed, emit, early)
            break
          } catch (e) {
            const remaining = await remainingBytes(deps, manifest)
            const shortage = deps.spaceWait && !signal.aborted ? shortageOf(e, deps.spaceWait, volumes[0]!.path, remaining) : null
            const ioError = !shortage && readRetry && !signal.aborted && isSourceIoError(e)
            if (!shortage && !ioError) throw e
            if (early && !early.taken) await early.reader.then((r) => r.close()).catch(() => {})
            early = null
            const before = notice
            const announce = (code: LastError['code']) => async (message: string) => {
              const waiting: LastError = { code, message: deps.redact ? deps.redact(message) : message, fatal: false }
              // The store may refuse this write too (its file system is the full one): the SSE
              // stream still carries the notice.
              job = await jobs.update(jobId, { last_error: waiting }, iso()).catch(() => ({ ...job, last_error: waiting }))
              deps.onJob(job)
            }
            if (shortage) await waitForSpace(shortage, deps.spaceWait!, signal, announce(shortage.code))
            else await readRetry!.wait(e as MigError, signal, announce('E_MIG_DISK_READ_FAILED'))
            // Fresh handles (a failed write may have left one in error), the durable watermarks again.
            for (let i = 0; i < volumes.length; i++) {
              await volumes[i]!.close().catch(() => {})
              volumes[i] = await deps.sink.create(jobId, manifest.disks[i]!.label, manifest.disks[i]!.capacity_bytes)
            }
            resumed = new Map((await deps.watermarks.list(jobId)).map((w) => [w.disk_label, w.watermark_bytes]))
            for (const d of manifest.disks) tracker.setDone(d.label, Math.min(resumed.get(d.label) ?? 0, d.capacity_bytes))
            notice = before
            await patch({ last_error: notice })
          }
        }
      } else if (source.strategy === 'passthrough') {
        await source.runFullImport(volumes, (label, done) => (tracker!.setDone(label, done), emit()), signal)
        for (const d of manifest.disks) tracker.finish(d.label)
      } else {
        const warm = job.effective_mode === 'Warm'
        if (warm && (!source.session.supportsWarm() || !manifest.cbt_available)) {
          const why = !source.session.supportsWarm()
            ? 'the source adapter does not support warm migration'
            : 'changed block tracking is not available on this VM'
          notice = { code: 'E_MIG_CBT_UNSUPPORTED', message: `warm migration downgraded to cold: ${why}`, fatal: false }
          job = await jobs.update(jobId, { effective_mode: 'Cold', last_error: notice }, iso())
          deps.onJob(job)
        }
        carried = { nvram: await copyLive(deps, source, volumes, tracker, emit, { setState, patch, job: () => job, resumedInCutover: liveResumedInCutover }) }
      }
      emit(true)
    }
    deps.mark?.('copied')

    // a live import that ended runs the guest on the volumes: a cancel then came too late, or
    // asked to finish the copy of the running guest (docs/live-import.md)
    if (signal.aborted && !liveOutcome) throw cancelled()
    if (signal.aborted && liveOutcome)
      notice = {
        code: 'E_MIG_CANCELLED',
        message: `cancel requested while the guest ${liveOutcome.domain} ran: its copy was finished (live_guest "finish"); it runs on its volumes`,
        fatal: false,
      }
    // The passthrough (virt-v2v) converted the guest already; in-place V2V is for copied disks.
    if (!liveOutcome && isWindows(job.plan, manifest) && source.strategy !== 'passthrough' && !reached('V2vProcessing')) {
      await setState('V2vProcessing')
      await deps.v2v(job, manifest, volumes, signal)
    }
    if (signal.aborted && !liveOutcome) throw cancelled()
    if (!liveOutcome && !reached('Starting')) await setState('Starting')
    const started = liveOutcome ?? (await deps.start(job, manifest, volumes, signal, carried))
    deps.mark?.('started')
    const outcome: StartOutcome = typeof started === 'string' ? { domain: started, hardware: null, notice: null } : started
    if (outcome.networkNotice) {
      // The guest conversion could not carry an interface over: a non-fatal V2V notice.
      const earlier = notice ? ` (earlier notice ${notice.code}: ${notice.message})` : ''
      notice = { code: 'E_MIG_V2V_FAILED', message: `${outcome.networkNotice}${earlier}`, fatal: false }
    }
    if (outcome.notice) {
      // An unverified boot is the notice the operator must see first; an earlier one is kept in the message.
      const earlier = notice ? ` (earlier notice ${notice.code}: ${notice.message})` : ''
      notice = { code: 'E_MIG_GUEST_BOOT_FAILED', message: `${outcome.notice}${earlier}`, fatal: false }
    }
    destinationRunning = job.plan.start !== false
    await setState('Completed', {
      domain: outcome.domain,
      hardware: outcome.hardware ?? undefined,
      finished_at: iso(),
      last_error: notice,
      progress: tracker.snapshot(),
    })
    deps.mark?.('completed')
    return job
  } catch (e) {
    const err = signal.aborted ? cancelled() : asMigError(e, 'E_MIG_INTERNAL', 'job')
    // The source VM comes back when the job took it down and the destination does not run (a
    // live import's guest ran once started, unless a cancel destroyed it).
    if (job.plan.live_import && job.hardware?.boot && err.code !== 'E_MIG_CANCELLED') destinationRunning = true
    let sourceNote = ''
    if (source?.strategy === 'live' && job.source_vm?.shut_down_at && !job.source_vm.powered_on_at && !destinationRunning) {
      try {
        await source.session.powerOn(source.vmId)
        await patch({ source_vm: { ...job.source_vm, powered_on_at: iso() } })
        sourceNote = `; the source VM ${source.vmId} was powered on again`
      } catch (pe) {
        sourceNote = `; powering the source VM ${source.vmId} on again failed: ${(pe as Error).message}`
      }
    }
    if (err.code === 'E_MIG_CANCELLED') {
      for (const v of volumes) await v.close().catch(() => {})
      if (!deps.keepOnCancel) {
        await deps.sink.remove(jobId).catch(() => {})
        await deps.watermarks.clear(jobId).catch(() => {})
      }
      await setState('Cancelled', { finished_at: iso(), last_error: { code: 'E_MIG_CANCELLED', message: `cancelled by operator${sourceNote}`, fatal: true } })
    } else {
      // A domain left defined by a failed start (or boot check) is named on the job for the operator.
      // A name only reserved (nothing defined) is released.
      const domain = typeof err.details?.domain === 'string' ? err.details.domain : null
      const hardware = err.details?.hardware && typeof err.details.hardware === 'object' ? (err.details.hardware as HardwareRecord) : undefined
      await setState('Failed', {
        domain,
        hardware,
        finished_at: iso(),
        last_error: { code: err.code, message: `${deps.redact ? deps.redact(err.message) : err.message}${sourceNote}`, fatal: true },
      })
    }
    return job
  } finally {
    progressThrottle.drop()
    for (const v of volumes) await v.close().catch(() => {})
    if (early && !early.taken) await early.reader.then((r) => r.close()).catch(() => {})
    await source?.close().catch(() => {})
  }
}
