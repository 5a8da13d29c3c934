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
 */
import { MigError, asMigError } from '../errors.ts'
import type { CutoverStatus, DeltaPassRecord, HardwareRecord, Job, JobState, LastError } from '../job.ts'
import type { ManifestDisk, VmManifest } from '../manifest.ts'
import type { Plan } from '../plan.ts'
import type { SnapshotRef } from '../adapters/types.ts'
import type { JobPatch, JobsRepo } from '../store/jobs.ts'
import type { SinkVolume } from '../sink/types.ts'
import type { DiskArea } from '../contracts/disk-reader.ts'
import { ProgressTracker } from './progress.ts'
import { shortageOf, waitForSpace } from './space-wait.ts'
import { TrailingThrottle } from '../throttle.ts'
import type { PreparedSource } from './prepared-source.ts'
import { allocatedOnly, restrictTo } from './reader-wrappers.ts'
import { copyOne } from './copy-one.ts'
import { copyOffline, openFirstReader, remainingBytes, type EarlyReader } from './offline-copy.ts'
import type { CutoverTiming, DeltaPolicy, OrchestratorDeps, StartOutcome } from './orchestrator-deps.ts'

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
    if (signal.aborted) throw cancelled()
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
    if (source.strategy === 'offline' && copies) early = openFirstReader(source, resumed)
    await deps.preflight?.(job, manifest)
    volumes = []
    for (const d of manifest.disks) volumes.push(await deps.sink.create(jobId, d.label, d.capacity_bytes))
    deps.mark?.('volumes')

    if (!reached('CopyingFull')) {
      await setState('CopyingFull', { started_at: job.started_at ?? iso(), progress: tracker.snapshot() })
    }
    deps.mark?.('copying')

    if (copies) {
      if (source.strategy === 'offline') {
        for (;;) {
          try {
            await copyOffline(deps, source, volumes, tracker, resumed, emit, early)
            break
          } catch (e) {
            const remaining = await remainingBytes(deps, manifest)
            const shortage = deps.spaceWait && !signal.aborted ? shortageOf(e, deps.spaceWait, volumes[0]!.path, remaining) : null
            if (!shortage) throw e
            if (early && !early.taken) await early.reader.then((r) => r.close()).catch(() => {})
            early = null
            const before = notice
            await waitForSpace(shortage, deps.spaceWait!, signal, async (message) => {
              const waiting: LastError = { code: shortage.code, message: deps.redact ? deps.redact(message) : message, fatal: false }
              // The store may refuse this write too (its file system is the full one): the SSE
              // stream still carries the notice.
              job = await jobs.update(jobId, { last_error: waiting }, iso()).catch(() => ({ ...job, last_error: waiting }))
              deps.onJob(job)
            })
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
        await copyLive(deps, source, volumes, tracker, emit, { setState, patch, job: () => job, resumedInCutover: liveResumedInCutover })
      }
      emit(true)
    }
    deps.mark?.('copied')

    if (signal.aborted) throw cancelled()
    // The passthrough (virt-v2v) converted the guest already; in-place V2V is for copied disks.
    if (isWindows(job.plan, manifest) && source.strategy !== 'passthrough' && !reached('V2vProcessing')) {
      await setState('V2vProcessing')
      await deps.v2v(job, manifest, volumes, signal)
    }
    if (signal.aborted) throw cancelled()
    if (!reached('Starting')) await setState('Starting')
    const started = await deps.start(job, manifest, volumes, signal)
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
    // The source VM comes back when the job took it down and the destination does not run.
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

/** What the live copy may do to its job. */
interface LiveControl {
  setState(s: JobState, extra?: JobPatch): Promise<void>
  patch(extra: JobPatch): Promise<Job>
  job(): Job
  /** The job was resumed in `CuttingOver`: the source is down; copy it whole once, no deltas. */
  resumedInCutover: boolean
}

/** Resolves after `ms`, or rejects with `E_MIG_CANCELLED` as soon as `signal` aborts. */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(cancelled())
    const onAbort = () => {
      clearTimeout(t)
      reject(cancelled())
    }
    const t = setTimeout(() => {
      signal.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    signal.addEventListener('abort', onAbort, { once: true })
  })
}

/**
 * The projected downtime of a cutover started after `last` (see {@link ProjectedDowntime}):
 * shutdown estimate + the pass's fixed cost (its duration minus its copy time) + its changed
 * bytes over `rate` + start estimate. Seconds, rounded to 0.1.
 */
export function projectDowntime(last: DeltaPassRecord, rate: number, timing: CutoverTiming): NonNullable<CutoverStatus['projected_downtime']> {
  const r1 = (x: number) => Math.round(x * 10) / 10
  const copy = rate > 0 ? last.changed_bytes / rate : 0
  const snapshot = Math.max(0, last.duration_s - last.copy_s)
  return {
    total_s: r1(timing.shutdownEstimateSeconds + snapshot + copy + timing.startEstimateSeconds),
    shutdown_s: timing.shutdownEstimateSeconds,
    final_delta_bytes: last.changed_bytes,
    rate_bytes_per_s: Math.round(rate),
    copy_s: r1(copy),
    snapshot_s: r1(snapshot),
    start_s: timing.startEstimateSeconds,
  }
}

/**
 * Live copy: a full pass from a snapshot, then (warm) delta passes and the cutover. With changed
 * block tracking on, the full pass reads only the allocated areas (changeId `*`); when the source
 * cannot tell them, the whole disk. A warm job whose plan cuts over on command or at a time keeps
 * running a delta pass every `precopy_interval_seconds` in `DeltaSyncing` until the command
 * (`cutover_requested_at`) or the time; every pass is recorded on the job's `cutover` with the
 * projected downtime of a cutover then.
 */
async function copyLive(
  deps: OrchestratorDeps,
  source: Extract<PreparedSource, { strategy: 'live' }>,
  volumes: SinkVolume[],
  tracker: ProgressTracker,
  emit: (force?: boolean) => void,
  ctl: LiveControl,
): Promise<void> {
  const { session, vmId, manifest } = source
  const policy: DeltaPolicy = { convergeBelowBytes: 64 * 1024 * 1024, maxPasses: 8, ...deps.delta }
  const timing: CutoverTiming = { shutdownEstimateSeconds: 300, startEstimateSeconds: 10, pollMs: 1000, ...deps.cutover }
  const warm = () => ctl.job().effective_mode === 'Warm' && !ctl.resumedInCutover
  const snapshots: SnapshotRef[] = []
  const snap = async (n: number) => {
    const s = await session.createSnapshot(vmId, `migrator-${deps.jobId}-${n}`)
    snapshots.push(s)
    return s
  }
  const shutdownSource = async () => {
    if (await session.shutdown(vmId)) await ctl.patch({ source_vm: { shut_down_at: deps.now().toISOString(), powered_on_at: null } })
  }
  try {
    await session.mark(vmId, `migrating to this host, job ${deps.jobId}`)
    if (!warm()) await shutdownSource()
    else await session.enableCbt(vmId)
    let current = await snap(ctl.resumedInCutover ? 1000 : 0)
    const cbtOn = warm() || manifest.cbt_available
    const fullStarted = deps.now().getTime()
    let fullBytes = 0
    for (let i = 0; i < manifest.disks.length; i++) {
      let reader = await session.openDisk(vmId, current, manifest.disks[i])
      if (cbtOn) {
        const used = await session.changedAreas(vmId, current, manifest.disks[i], '*').catch(() => null)
        if (used) reader = allocatedOnly(reader, used)
      }
      try {
        await copyOne(deps, reader, volumes[i], manifest.disks[i], 0, tracker, emit)
      } finally {
        await reader.close().catch(() => {})
      }
      fullBytes += tracker.snapshot().disks[i].bytes_done - tracker.snapshot().disks[i].bytes_zero
    }
    if (!warm()) return
    // the measured copy rate: the full pass's, then each delta pass's that moved data
    let rate = fullBytes / Math.max(0.001, (deps.now().getTime() - fullStarted) / 1000)

    // An invalidated changeId (E_MIG_CBT_RESET) is answered with a full copy of the disk from the
    // new snapshot, in one pass only (a CBT reset on the VM hits all its disks at once); a reset in
    // a later pass fails the job.
    let resetPass: number | null = null
    const areasOf = async (next: SnapshotRef, disk: ManifestDisk, pass: number): Promise<DiskArea[] | null> => {
      try {
        const since = current.change_ids[disk.label]
        if (!since) throw new MigError('E_MIG_CBT_RESET', `disk ${disk.label}: no changeId recorded at the previous snapshot`)
        return await session.changedAreas(vmId, next, disk, since)
      } catch (e) {
        if (!(e instanceof MigError) || e.code !== 'E_MIG_CBT_RESET' || (resetPass !== null && resetPass !== pass)) throw e
        resetPass = pass
        return null
      }
    }
    /** Copies what changed since the last pass; `startedAt`: the pass's recorded start (default now). */
    const deltaPass = async (n: number, startedAt = deps.now()): Promise<DeltaPassRecord> => {
      const next = await snap(n)
      let changed = 0
      let copyMs = 0
      for (let i = 0; i < manifest.disks.length; i++) {
        const disk = manifest.disks[i]
        const areas = (await areasOf(next, disk, n)) ?? [{ offset: 0, length: disk.capacity_bytes }]
        changed += areas.reduce((s, a) => s + a.length, 0)
        const reader = restrictTo(await session.openDisk(vmId, next, disk), areas)
        const t0 = deps.now().getTime()
        try {
          await deps.copyDisk(reader, volumes[i], { from: 0, signal: deps.signal, onProgress: () => emit(), onWatermark: async () => {} })
        } finally {
          copyMs += deps.now().getTime() - t0
          await reader.close().catch(() => {})
        }
      }
      await session.removeSnapshot(vmId, current)
      snapshots.splice(snapshots.indexOf(current), 1)
      current = next
      const copy_s = copyMs / 1000
      const passRate = changed > 0 && copy_s > 0 ? changed / copy_s : 0
      if (passRate > 0) rate = passRate
      return {
        pass: n,
        started_at: startedAt.toISOString(),
        duration_s: Math.round(deps.now().getTime() - startedAt.getTime()) / 1000,
        changed_bytes: changed,
        copy_s,
        rate_bytes_per_s: Math.round(passRate),
      }
    }
    /** Runs pass `n` and records it (and the projected downtime) on the job. */
    const recordedPass = async (n: number, startedAt?: Date): Promise<DeltaPassRecord> => {
      const rec = await deltaPass(n, startedAt)
      const c = ctl.job().cutover
      if (c) {
        const passes = [...c.passes, rec].slice(-20)
        await ctl.patch({ cutover: { ...c, passes_total: c.passes_total + 1, passes, projected_downtime: projectDowntime(rec, rate, timing) } })
      }
      return rec
    }

    await ctl.setState('DeltaSyncing')
    const plan = ctl.job().cutover
    let passes = 0
    // The test boot (docs/test-boot.md): taken between passes, so its clone is of a pass boundary.
    let testBoot: { stop: AbortController; holdsWrites: boolean; done: Promise<void>; ended: boolean } | null = null
    const stopTestBoot = async (why: string) => {
      if (!testBoot) return
      testBoot.stop.abort(why)
      await testBoot.done
    }
    const offerTestBoot = async () => {
      if (!deps.testBoot || (testBoot && !testBoot.ended) || !(await deps.testBoot.requested())) return
      for (const v of volumes) await v.flush()
      const stop = new AbortController()
      const onAbort = () => stop.abort('the job was cancelled')
      deps.signal.addEventListener('abort', onAbort, { once: true })
      const h = deps.testBoot.start(ctl.job(), manifest, volumes, stop.signal, deps.onJob)
      const tb = { stop, holdsWrites: h.holdsWrites, done: h.done, ended: false }
      testBoot = tb
      void h.done.then(() => {
        tb.ended = true
        deps.signal.removeEventListener('abort', onAbort)
      })
      // the next pass waits for the clone (quick)
      await h.cloned
    }
    const passesHeld = () => testBoot !== null && !testBoot.ended && testBoot.holdsWrites
    // a plan that requires a passing test boot cuts over at its time only once one passed
    const gateOk = async () => !ctl.job().plan.cutover?.require_test_boot || (await deps.jobs.testBoot(deps.jobId))?.state === 'passed'
    if (!plan || plan.mode === 'auto') {
      let converged = false
      for (let pass = 1; pass <= policy.maxPasses && !converged; pass++) {
        if (deps.signal.aborted) throw cancelled()
        converged = (await recordedPass(pass)).changed_bytes < policy.convergeBelowBytes
        passes = pass
      }
      if (!converged) throw new MigError('E_MIG_DELTA_TOO_LARGE', `deltas did not fall below ${policy.convergeBelowBytes} bytes in ${policy.maxPasses} passes`)
    } else {
      const at = plan.at ? Date.parse(plan.at) : null
      const intervalMs = (plan.precopy_interval_seconds ?? 300) * 1000
      const due = async () => (await deps.jobs.cutoverRequestedAt(deps.jobId)) !== null || (at !== null && deps.now().getTime() >= at && (await gateOk()))
      try {
        for (;;) {
          if (deps.signal.aborted) throw cancelled()
          // the pass records as its start the instant the interval is timed from
          const startedAt = deps.now()
          const started = startedAt.getTime()
          // a test boot whose clone reads the volumes live holds the passes until it ends
          if (!passesHeld()) await recordedPass(++passes, startedAt)
          if (await due()) break
          await offerTestBoot()
          let fired = false
          for (let left = started + intervalMs - deps.now().getTime(); left > 0 && !fired; left = started + intervalMs - deps.now().getTime()) {
            await sleep(Math.min(timing.pollMs, left), deps.signal)
            fired = await due()
            if (!fired) await offerTestBoot()
          }
          if (fired) break
        }
        // A cutover does not wait for a test boot: the test boot is cancelled (the operator chose
        // to cut over; the real start runs the same boot check on the real volumes).
        await stopTestBoot('cancelled: the cutover was requested')
      } finally {
        await stopTestBoot('cancelled: the job was cancelled or failed')
      }
    }
    const c = ctl.job().cutover
    await ctl.setState('CuttingOver', c ? { cutover: { ...c, started_at: deps.now().toISOString() } } : {})
    await shutdownSource()
    await recordedPass(passes + 1)
  } finally {
    await session.cleanup(vmId)
  }
}
