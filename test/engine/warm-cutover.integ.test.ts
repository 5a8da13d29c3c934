/**
 * Warm vim_api migrations the operator controls (roadmap v0.6), end to end through the HTTP API
 * against govmomi's vCenter simulator (test/vcsim harness; guest writes applied with qemu-io to
 * the active disks before each snapshot):
 * - `cutover: {mode: "manual"}`: the job waits in DeltaSyncing, one delta pass per
 *   `precopy_interval_seconds`, each recorded with its changed bytes and duration and the projected
 *   downtime; `POST /migrations/:id/cutover` starts CuttingOver; the images equal the final disks;
 * - `cutover: {at}`: the cutover starts at that time without a command;
 * - the source comes back: a destination that does not boot after the cutover, a cancel during
 *   CuttingOver, and a worker SIGKILLed during the final delta (the supervisor gives up) each end
 *   with the source VM powered on again and no migrator snapshot left.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeBootDisk, makePowerOffBootDisk } from '../helpers/bootdisk.ts'
import { runCli } from '../helpers/cli.ts'
import { call, openStream, streamSaw, submit, volumePath, waitJob, workerPid } from '../helpers/jobs.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { datastoreRaw, registerVcsim, startVcsim, type Vcsim, createTwoDiskVm } from '../helpers/vcsim.ts'

const PREFIX = 'i16-'
const MARKER = 'MIGRATOR-I16-BOOT-7730'
const MiB = 1024 * 1024
/** Both servers' boot check and guest shutdown. */
const BOOT_ENV = {
  MIGRATOR_DOMAIN_TYPE: 'qemu',
  MIGRATOR_BOOT_GRACE_SECONDS: '1',
  MIGRATOR_BOOT_TIMEOUT_SECONDS: '6',
  MIGRATOR_BOOT_SERIAL_PATTERN: MARKER,
  MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: '5',
}

describe('warm cutover on command (vCenter simulator)', () => {
  let v: Vcsim
  /** A server whose copy is capped at 512 KiB/s and that gives a job up after one worker death. */
  let slow: RunningServer
  const { t, srv } = serverSuite({
    prefix: PREFIX,
    tmpPrefix: 'mig-i16-cutover-',
    traversable: true,
    env: { ...BOOT_ENV, MIGRATOR_DELTA_CONVERGE_BYTES: String(MiB) },
    stop: (s) => [s, slow, v],
  })
  const sourceIds = new Map<RunningServer, string>()

  /** A VM with a 16 MiB boot disk (flat; bootable unless `bootable` is false) and a 2 MiB sparse data disk. */
  async function makeVm(name: string, bootable = true): Promise<{ id: string; files: string[] }> {
    const boot = bootable
      ? makeBootDisk(path.join(t.dir, `${name}-boot.raw`), MARKER, 16 * MiB).path
      : // a destination that prints something else and powers itself off: never the operator's
        // pattern, so the boot check sees the domain stop (with the marker it could race the
        // power-off on a loaded host and verify the boot first)
        makePowerOffBootDisk(path.join(t.dir, `${name}-boot.raw`), 'I16-NOT-THE-MARKER', 16 * MiB).path
    return createTwoDiskVm(v, t.dir, name, boot, { macs: ['00:50:56:01:16:01'] })
  }

  function expectBitExact(jobId: string, files: string[]): void {
    for (const f of files) {
      const label = path.basename(f, '.vmdk')
      expect([label, readFileSync(volumePath(t.dir, jobId, label)).equals(datastoreRaw(v, f, t.dir))]).toEqual([label, true])
    }
  }

  const plan = (s: RunningServer, vmId: string, name: string, extra: Record<string, unknown> = {}) => ({
    source: { Live: 'vim_api' },
    source_ref: { kind: 'live_vm', source_id: sourceIds.get(s)!, vm_id: vmId },
    mode: 'Warm',
    name,
    start: false,
    ...extra,
  })

  async function waitVm(id: string, pred: (s: Awaited<ReturnType<Vcsim['vm']>>) => boolean, timeoutMs = 30_000) {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const s = await v.vm(id)
      if (pred(s) || Date.now() > deadline) return s
      await new Promise((r) => setTimeout(r, 100))
    }
  }

  beforeAll(async () => {
    v = await startVcsim({ cbtPage: 4 * MiB })
    slow = await startServer('bun', path.join(t.dir, 'slow'), {
      ...BOOT_ENV,
      MIGRATOR_MAX_ATTEMPTS: '1',
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(512 * 1024),
    })
    for (const s of [srv, slow]) sourceIds.set(s, await registerVcsim(s.base, v))
  }, 300_000)

  test('manual: >= 3 timed passes in DeltaSyncing while the guest writes, projected downtime shown, cutover on POST, bit-exact', async () => {
    const vm = await makeVm('i16-manual')
    // the guest writes before every snapshot from the first delta pass on: 192 KiB on the boot disk, 64 KiB on the data disk
    await v.scheduleWrites(vm.id, [
      { before_snapshot: 1, every: true, file: vm.files[0], offset: 3 * MiB, length: 192 * 1024, pattern: 0x20 },
      { before_snapshot: 1, every: true, file: vm.files[1], offset: 1536 * 1024, length: 64 * 1024, pattern: 0x30 },
    ])
    const stream = openStream(srv.base)
    await stream.ready
    const job = await submit(srv.base, plan(srv, vm.id, 'i16-manual', { cutover: { mode: 'manual' }, precopy_interval_seconds: 1 }))
    expect(job.cutover).toEqual({
      mode: 'manual',
      at: null,
      precopy_interval_seconds: 1,
      requested_at: null,
      started_at: null,
      passes_total: 0,
      passes: [],
      projected_downtime: null,
    })
    const waiting = await waitJob(srv.base, job.id, (j) => j.cutover?.passes_total >= 3 || (j.status !== 'running' && j.status !== 'queued'), 90_000)
    expect([waiting.state, waiting.status]).toEqual(['DeltaSyncing', 'running'])
    // the guest still runs: no shutdown while waiting
    expect((await v.vm(vm.id)).power_state).toBe('poweredOn')
    const passes = waiting.cutover.passes
    for (const p of passes) {
      // every pass copied what the guest wrote since the previous one (64 KiB CBT blocks)
      expect(p.changed_bytes).toBe(256 * 1024)
      expect(p.duration_s).toBeGreaterThan(0)
      expect(p.copy_s).toBeLessThanOrEqual(p.duration_s)
    }
    // passes are one interval (1 s) apart: timed, not back to back (each pass records as its
    // started_at the instant the scheduler times the interval from)
    for (let i = 1; i < passes.length; i++) expect(Date.parse(passes[i].started_at) - Date.parse(passes[i - 1].started_at)).toBeGreaterThanOrEqual(1000)
    const pd = waiting.cutover.projected_downtime
    expect(pd.final_delta_bytes).toBe(256 * 1024)
    expect([pd.shutdown_s, pd.start_s]).toEqual([5, 1])
    expect(pd.rate_bytes_per_s).toBeGreaterThan(0)
    expect(pd.total_s).toBeCloseTo(pd.shutdown_s + pd.snapshot_s + pd.copy_s + pd.start_s, 0)

    const cut = await call(srv.base, 'POST', `/migrations/${job.id}/cutover`)
    expect(cut.status).toBe(202)
    expect(typeof cut.body.cutover.requested_at).toBe('string')
    const done = await waitJob(srv.base, job.id)
    await streamSaw(stream, job.id, 'Completed')
    stream.close()
    expect([done.status, done.state, done.effective_mode, done.last_error]).toEqual(['completed', 'Completed', 'Warm', null])
    expect(Date.parse(done.cutover.started_at)).toBeGreaterThanOrEqual(Date.parse(done.cutover.requested_at))
    const states = stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id).map((e) => e.data.state)
    expect(states.filter((s, i) => s !== states[i - 1])).toEqual(['Queued', 'CopyingFull', 'DeltaSyncing', 'CuttingOver', 'Starting', 'Completed'])
    const state = await v.vm(vm.id)
    expect([state.power_state, state.snapshots]).toEqual(['poweredOff', []])
    // the full copy's snapshot, one per delta pass, the final delta's
    expect(state.snapshots_taken).toBe(done.cutover.passes_total + 1)
    expect(done.source_vm.powered_on_at).toBeNull()
    expectBitExact(job.id, vm.files)
    // a job that is not waiting any more: 409
    const again = await call(srv.base, 'POST', `/migrations/${job.id}/cutover`)
    expect([again.status, again.body.error.code]).toEqual([409, 'E_MIG_CONFLICT'])
  }, 120_000)

  test('a scheduled cutover ({at}) fires at its time without a command', async () => {
    const vm = await makeVm('i16-at')
    await v.scheduleWrites(vm.id, [{ before_snapshot: 1, every: true, file: vm.files[1], offset: 0, length: 64 * 1024, pattern: 0x40 }])
    const at = new Date(Date.now() + 10_000)
    const job = await submit(srv.base, plan(srv, vm.id, 'i16-at', { cutover: { at: at.toISOString() }, precopy_interval_seconds: 1 }))
    expect([job.cutover.mode, job.cutover.at]).toEqual(['scheduled', at.toISOString()])
    const done = await waitJob(srv.base, job.id, undefined, 90_000)
    expect([done.status, done.last_error]).toEqual(['completed', null])
    const started = Date.parse(done.cutover.started_at)
    expect(started).toBeGreaterThanOrEqual(at.getTime())
    // the time is looked at every second and after each pass (a pass under way finishes first)
    expect(started - at.getTime()).toBeLessThan(5000)
    expect(done.cutover.requested_at).toBeNull()
    // at least one pass while waiting, then the final delta
    expect(done.cutover.passes_total).toBeGreaterThanOrEqual(2)
    expectBitExact(job.id, vm.files)
  }, 120_000)

  test('a destination that does not boot after the cutover: E_MIG_GUEST_BOOT_FAILED, the source VM is powered on again, no snapshot left', async () => {
    const vm = await makeVm('i16-noboot', false)
    const job = await submit(srv.base, plan(srv, vm.id, 'i16-noboot', { start: true }))
    const done = await waitJob(srv.base, job.id, undefined, 90_000)
    expect([done.status, done.last_error.code]).toEqual(['failed', 'E_MIG_GUEST_BOOT_FAILED'])
    expect(done.last_error.message).toContain(`the source VM ${vm.id} was powered on again`)
    expect(Date.parse(done.source_vm.powered_on_at)).toBeGreaterThan(Date.parse(done.source_vm.shut_down_at))
    const state = await v.vm(vm.id)
    expect([state.power_state, state.snapshots]).toEqual(['poweredOn', []])
  }, 120_000)

  /**
   * A manual-cutover job on the slow server whose guest writes 1 MiB before every snapshot (each
   * delta pass copies about 2 s at 512 KiB/s), cut over with `command` after its first pass;
   * resolves once it is CuttingOver with the source shut down (the final delta running).
   */
  async function inFinalDelta(
    name: string,
    pattern: number,
    command: (jobId: string) => Promise<void>,
  ): Promise<{ vm: { id: string; files: string[] }; job: any }> {
    const vm = await makeVm(name)
    await v.scheduleWrites(vm.id, [{ before_snapshot: 1, every: true, file: vm.files[0], offset: 6 * MiB, length: MiB, pattern }])
    const job = await submit(slow.base, plan(slow, vm.id, name, { cutover: { mode: 'manual' }, precopy_interval_seconds: 1 }))
    await waitJob(slow.base, job.id, (j) => j.cutover?.passes_total >= 1, 90_000)
    await command(job.id)
    await waitJob(slow.base, job.id, (j) => j.state === 'CuttingOver' && j.source_vm?.shut_down_at, 60_000)
    expect((await v.vm(vm.id)).power_state).toBe('poweredOff')
    return { vm, job }
  }

  test('cancel during CuttingOver: Cancelled, the source VM is powered on again, no snapshot left', async () => {
    const { vm, job } = await inFinalDelta('i16-cancel', 0x50, async (id) => {
      // the operator's command, through the CLI
      const cli = await runCli(['--json', 'cutover', id], { env: { MIGRATOR_URL: slow.base } })
      expect([cli.code, typeof JSON.parse(cli.stdout).cutover.requested_at]).toEqual([0, 'string'])
    })
    const c = await call(slow.base, 'POST', `/migrations/${job.id}/cancel`)
    expect(c.status).toBe(202)
    const done = await waitJob(slow.base, job.id)
    expect([done.status, done.last_error.code]).toEqual(['cancelled', 'E_MIG_CANCELLED'])
    expect(done.last_error.message).toContain('was powered on again')
    expect(typeof done.source_vm.powered_on_at).toBe('string')
    const late = await runCli(['cutover', job.id], { env: { MIGRATOR_URL: slow.base } })
    expect([late.code, late.stderr]).toEqual([1, expect.stringContaining('E_MIG_CONFLICT: migration')])
    const state = await v.vm(vm.id)
    expect([state.power_state, state.snapshots]).toEqual(['poweredOn', []])
  }, 120_000)

  test('a worker SIGKILLed during the final delta, given up: the supervisor powers the source VM on and removes its snapshots', async () => {
    const { vm, job } = await inFinalDelta('i16-kill', 0x60, async (id) =>
      expect((await call(slow.base, 'POST', `/migrations/${id}/cutover`)).status).toBe(202),
    )
    process.kill(workerPid(path.join(t.dir, 'slow'), job.id)!, 'SIGKILL')
    const done = await waitJob(slow.base, job.id)
    expect([done.status, done.last_error.code]).toEqual(['failed', 'E_MIG_INTERNAL'])
    expect(done.last_error.message).toContain(`the source VM ${vm.id} was powered on again`)
    const state = await waitVm(vm.id, (s) => s.power_state === 'poweredOn' && s.snapshots.length === 0)
    expect([state.power_state, state.snapshots]).toEqual(['poweredOn', []])
  }, 120_000)
})
