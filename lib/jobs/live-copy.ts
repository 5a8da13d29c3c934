/**
 * The live copy of a vSphere (live adapter) source, spec 1.2 and 3: a full pass from a snapshot
 * (the allocated areas only when changed block tracking tells them), then for a warm job the
 * delta passes from successive snapshots (CBT changeIds), each recorded with the projected
 * downtime, the wait for a manual or timed cutover with the test boot offered between passes,
 * and the cutover (source shutdown, final pass). Driven by the orchestrator (orchestrator.ts),
 * which owns the job's states; this file moves the bytes and reports through `LiveControl`.
 */
import type { CarriedNvram, SnapshotRef } from '../adapters/types.ts'
import type { DiskArea } from '../contracts/disk-reader.ts'
import { MigError } from '../errors.ts'
import type { CutoverStatus, DeltaPassRecord, Job, JobState } from '../job.ts'
import type { ManifestDisk } from '../manifest.ts'
import type { SinkVolume } from '../sink/types.ts'
import { sleep } from '../retry.ts'
import type { JobPatch } from '../store/jobs.ts'
import { copyOne } from './copy-one.ts'
import type { CutoverTiming, DeltaPolicy, OrchestratorDeps } from './orchestrator-deps.ts'
import type { PreparedSource } from './prepared-source.ts'
import type { ProgressTracker } from '../pipeline/progress.ts'
import { allocatedOnly, restrictTo } from '../pipeline/reader-wrappers.ts'

/** The error of a live copy stopped by the job's signal (the orchestrator records it as `Cancelled`). */
function cancelled(): MigError {
  return new MigError('E_MIG_CANCELLED', 'cancelled by operator')
}

/** What the live copy may do to its job. */
export interface LiveControl {
  setState(s: JobState, extra?: JobPatch): Promise<void>
  patch(extra: JobPatch): Promise<Job>
  job(): Job
  /** The job was resumed in `CuttingOver`: the source is down; copy it whole once, no deltas. */
  resumedInCutover: boolean
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

/** Shuts the source VM down, recording the time on the job's `source_vm` when it was running. */
async function shutDownSource(source: Extract<PreparedSource, { strategy: 'live' }>, now: () => Date, patch: (extra: JobPatch) => Promise<Job>): Promise<void> {
  if (await source.session.shutdown(source.vmId)) await patch({ source_vm: { shut_down_at: now().toISOString(), powered_on_at: null } })
}

/** The source VM's UEFI variable store when the session carries one (a UEFI guest), else null. */
function readSourceNvram(source: Extract<PreparedSource, { strategy: 'live' }>): Promise<CarriedNvram | null> {
  const { session, vmId, manifest } = source
  return manifest.firmware === 'efi' && session.readNvram ? session.readNvram(vmId) : Promise.resolve(null)
}

/**
 * The source of a live import from a live adapter (plan `live_import`, cold; docs/live-import.md):
 * the VM marked, shut down (recorded on the job's `source_vm`), its UEFI variable store read, one
 * snapshot taken; the returned source reads its disks from that snapshot, at any offset, through
 * the adapter's readers, and `release()` removes what the job made on the source (its snapshots).
 * A resumed job finds the VM off and takes a snapshot of the same content again. Throws what the
 * adapter throws (`E_MIG_SOURCE_UNREACHABLE`, `E_MIG_SNAPSHOT_FAILED`, ...).
 */
export async function coldSnapshotSource(
  deps: Pick<OrchestratorDeps, 'jobId' | 'now'>,
  source: Extract<PreparedSource, { strategy: 'live' }>,
  patch: (extra: JobPatch) => Promise<Job>,
): Promise<{ served: Extract<PreparedSource, { strategy: 'offline' }>; nvram: CarriedNvram | null; release(): Promise<void> }> {
  const { session, vmId, manifest } = source
  await session.mark(vmId, `migrating to this host (live import), job ${deps.jobId}`)
  await shutDownSource(source, deps.now, patch)
  const nvram = await readSourceNvram(source)
  const snapshot = await session.createSnapshot(vmId, `migrator-${deps.jobId}-live`)
  return {
    served: { strategy: 'offline', manifest, openReader: (disk) => session.openDisk(vmId, snapshot, disk), close: async () => {} },
    nvram,
    release: () => session.cleanup(vmId),
  }
}

/**
 * Live copy: a full pass from a snapshot, then (warm) delta passes and the cutover. With changed
 * block tracking on, the full pass reads only the allocated areas (changeId `*`); when the source
 * cannot tell them, the whole disk. A warm job whose plan cuts over on command or at a time keeps
 * running a delta pass every `precopy_interval_seconds` in `DeltaSyncing` until the command
 * (`cutover_requested_at`) or the time; every pass is recorded on the job's `cutover` with the
 * projected downtime of a cutover then. Returns the source's UEFI variable store when the session
 * carries one (`readNvram`), read with the source stopped: a cold job's before its copy, a warm
 * one's at the cutover, after the shutdown (and once at its start, to fail early when it cannot
 * be read).
 */
export async function copyLive(
  deps: OrchestratorDeps,
  source: Extract<PreparedSource, { strategy: 'live' }>,
  volumes: SinkVolume[],
  tracker: ProgressTracker,
  emit: (force?: boolean) => void,
  ctl: LiveControl,
): Promise<CarriedNvram | null> {
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
  const shutdownSource = () => shutDownSource(source, deps.now, ctl.patch)
  const readNvram = () => readSourceNvram(source)
  let nvram: CarriedNvram | null = null
  try {
    await session.mark(vmId, `migrating to this host, job ${deps.jobId}`)
    if (!warm()) {
      await shutdownSource()
      nvram = await readNvram()
    } else {
      await session.enableCbt(vmId)
      // read once now (and again at the cutover): a store that cannot be carried fails the job
      // before the copy, not after the source was shut down
      await readNvram()
    }
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
    if (!warm()) return nvram
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
            await sleep(Math.min(timing.pollMs, left), deps.signal, cancelled)
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
    nvram = await readNvram()
    await recordedPass(passes + 1)
    return nvram
  } finally {
    await session.cleanup(vmId)
  }
}
