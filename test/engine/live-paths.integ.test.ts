/**
 * Live-path cases against govmomi's vCenter simulator (test/vcsim harness) that the scripted
 * double of test/pipeline/orchestrator.integ.test.ts covered alone before: cancel of a live job (its
 * snapshots removed, its volumes removed, or kept with MIGRATOR_KEEP_ON_CANCEL=1), a changeId
 * reset (E_MIG_CBT_RESET: one answered with a full copy, one in a later pass fails the job), a
 * snapshot the source refuses (E_MIG_SNAPSHOT_FAILED), a guest that ignores the shutdown request
 * (powered off after MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS), and a Windows warm job through CuttingOver
 * then V2vProcessing. The V2V tool is a TEST DOUBLE of virt-v2v-in-place (a shell script that
 * records its call): injecting drivers needs a real Windows guest image, which this machine
 * cannot have.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeRawImage } from '../helpers/inputs.ts'
import { call, openStream, streamSaw, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { registerVcsim, startVcsim, type Vcsim, createTwoDiskVm } from '../helpers/vcsim.ts'

const PREFIX = 'i16lp-'
const MiB = 1024 * 1024

describe('live paths against the vCenter simulator', () => {
  let v: Vcsim
  /** The same as `srv` with MIGRATOR_KEEP_ON_CANCEL=1. */
  let keep: RunningServer
  /** Copy capped at 512 KiB/s (cancel has time to land), V2V test double, volumes removed on cancel. */
  const { t, srv } = serverSuite({ prefix: PREFIX, tmpPrefix: 'mig-i16-live-', traversable: true, env: () => env, stop: (s) => [s, keep, v] })
  const record = path.join(t.dir, 'v2v-calls.log')
  const iso = path.join(t.dir, 'virtio-win.iso')
  const double = path.join(t.dir, 'virt-v2v-in-place-test-double')
  const env = {
    MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(512 * 1024),
    MIGRATOR_V2V_BINARY: double,
    MIGRATOR_VIRTIO_WIN_ISO: iso,
    MIGRATOR_DELTA_CONVERGE_BYTES: String(MiB),
    MIGRATOR_DOMAIN_TYPE: 'qemu',
    MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: '2',
  }
  const sources = new Map<RunningServer, string>()

  async function makeVm(name: string, guestId = 'debian10_64Guest'): Promise<{ id: string; files: string[] }> {
    const a = makeRawImage(path.join(t.dir, `${name}-a.raw`), 4 * MiB, 5)
    return createTwoDiskVm(v, t.dir, name, a, { guestId, dataPattern: 6 })
  }
  const plan = (s: RunningServer, vmId: string, name: string, mode: 'Cold' | 'Warm', extra: Record<string, unknown> = {}) => ({
    source: { Live: 'vim_api' },
    source_ref: { kind: 'live_vm', source_id: sources.get(s)!, vm_id: vmId },
    mode,
    name,
    start: false,
    ...extra,
  })

  beforeAll(async () => {
    writeFileSync(iso, 'not really an ISO: the test double never opens it')
    // records its command line and the libvirt XML it was given (the last argument), then succeeds
    writeFileSync(
      double,
      `#!/bin/bash\n# TEST DOUBLE of virt-v2v-in-place: records the call and succeeds.\necho "argv: $*" >> ${JSON.stringify(record)}\ncat "\${@: -1}" >> ${JSON.stringify(record)}\necho "[   1.0] Finishing off"\nexit 0\n`,
      { mode: 0o755 },
    )
    v = await startVcsim({ cbtPage: 4 * MiB })
    keep = await startServer('bun', path.join(t.dir, 'keep'), { ...env, MIGRATOR_KEEP_ON_CANCEL: '1' })
    for (const s of [srv, keep]) sources.set(s, await registerVcsim(s.base, v))
  }, 300_000)

  for (const keepOnCancel of [false, true]) {
    test(`cancel of a live job during its copy removes its snapshots, powers the source on again and ${keepOnCancel ? 'keeps (MIGRATOR_KEEP_ON_CANCEL=1)' : 'removes'} its volumes`, async () => {
      const s = keepOnCancel ? keep : srv
      const name = keepOnCancel ? 'i16lp-keep' : 'i16lp-cancel'
      const vm = await makeVm(name)
      const job = await submit(s.base, plan(s, vm.id, name, 'Cold'))
      await waitJob(s.base, job.id, (j) => j.state === 'CopyingFull' && j.progress.bytes_done > 0, 60_000)
      expect((await v.vm(vm.id)).snapshots.length).toBe(1)
      const dataDir = keepOnCancel ? path.join(t.dir, 'keep') : t.dir
      expect(existsSync(volumePath(dataDir, job.id, name))).toBe(true)
      expect((await call(s.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
      const done = await waitJob(s.base, job.id)
      expect([done.status, done.last_error.code]).toEqual(['cancelled', 'E_MIG_CANCELLED'])
      expect(done.last_error.message).toContain('was powered on again')
      const state = await v.vm(vm.id)
      expect([state.snapshots, state.power_state]).toEqual([[], 'poweredOn'])
      expect(existsSync(volumePath(dataDir, job.id, name))).toBe(keepOnCancel)
    }, 120_000)
  }

  test('a changeId reset while waiting for the cutover is answered with a full copy; a reset in a later pass fails the job E_MIG_CBT_RESET', async () => {
    const vm = await makeVm('i16lp-cbt')
    await v.scheduleWrites(vm.id, [{ before_snapshot: 1, every: true, file: vm.files[1], offset: 0, length: 64 * 1024, pattern: 0x11 }])
    const job = await submit(srv.base, plan(srv, vm.id, 'i16lp-cbt', 'Warm', { cutover: { mode: 'manual' }, precopy_interval_seconds: 2 }))
    const first = await waitJob(srv.base, job.id, (j) => j.cutover?.passes_total >= 1, 90_000)
    expect(first.cutover.passes.at(-1).changed_bytes).toBe(64 * 1024)
    await v.resetCbt(vm.id)
    const n = first.cutover.passes_total
    const after = await waitJob(srv.base, job.id, (j) => j.cutover?.passes_total > n || j.status !== 'running', 60_000)
    // the reset pass copied both disks whole (4 + 2 MiB) and the job goes on waiting
    expect([after.state, after.cutover.passes.at(-1).changed_bytes]).toEqual(['DeltaSyncing', 6 * MiB])
    await v.resetCbt(vm.id)
    const done = await waitJob(srv.base, job.id, undefined, 60_000)
    expect([done.status, done.last_error.code]).toEqual(['failed', 'E_MIG_CBT_RESET'])
    const state = await v.vm(vm.id)
    // warm never shut the guest down; every snapshot is gone
    expect([state.snapshots, state.power_state]).toEqual([[], 'poweredOn'])
  }, 120_000)

  test('a snapshot the source refuses: E_MIG_SNAPSHOT_FAILED, nothing copied, the source powered on again', async () => {
    const vm = await makeVm('i16lp-nosnap')
    await v.disableMethod(vm.id, 'CreateSnapshot_Task')
    const job = await submit(srv.base, plan(srv, vm.id, 'i16lp-nosnap', 'Cold'))
    const done = await waitJob(srv.base, job.id, undefined, 60_000)
    expect([done.status, done.last_error.code, done.progress.bytes_done]).toEqual(['failed', 'E_MIG_SNAPSHOT_FAILED', 0])
    expect(done.last_error.message).toContain('was powered on again')
    const state = await v.vm(vm.id)
    expect([state.snapshots, state.power_state]).toEqual([[], 'poweredOn'])
  }, 60_000)

  test('a guest that ignores ShutdownGuest is powered off after MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS (2 s); the job completes', async () => {
    const vm = await makeVm('i16lp-deaf')
    await v.ignoreShutdown(vm.id)
    const job = await submit(srv.base, plan(srv, vm.id, 'i16lp-deaf', 'Cold'))
    const done = await waitJob(srv.base, job.id, undefined, 60_000)
    expect([done.status, done.last_error]).toEqual(['completed', null])
    expect((await v.vm(vm.id)).power_state).toBe('poweredOff')
    // the shutdown waited out the timeout before the power-off
    expect(Date.parse(done.source_vm.shut_down_at) - Date.parse(done.started_at)).toBeGreaterThanOrEqual(2000)
  }, 60_000)

  test('a Windows warm job: DeltaSyncing, CuttingOver, then V2vProcessing (TEST DOUBLE tool) over the copied volumes, then Starting', async () => {
    const vm = await makeVm('i16lp-win', 'windows9Server64Guest')
    await v.scheduleWrites(vm.id, [{ before_snapshot: 1, file: vm.files[0], offset: MiB, length: 128 * 1024, pattern: 0x21 }])
    const stream = openStream(srv.base)
    await stream.ready
    const job = await submit(srv.base, plan(srv, vm.id, 'i16lp-win', 'Warm', { guest_os: 'windows' }))
    const done = await waitJob(srv.base, job.id, undefined, 90_000)
    await streamSaw(stream, job.id, 'Completed')
    stream.close()
    expect([done.status, done.last_error]).toEqual(['completed', null])
    const states = stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id).map((e) => e.data.state)
    expect(states.filter((s, i) => s !== states[i - 1])).toEqual([
      'Queued',
      'CopyingFull',
      'DeltaSyncing',
      'CuttingOver',
      'V2vProcessing',
      'Starting',
      'Completed',
    ])
    // the tool ran (once) over the job's volumes after the cutover's final delta
    const calls = readFileSync(record, 'utf8')
    expect(calls.match(/^argv: /gm)?.length).toBe(1)
    expect(calls).toContain(volumePath(t.dir, job.id, 'i16lp-win'))
    expect(calls).toContain(volumePath(t.dir, job.id, 'i16lp-win_1'))
    expect((await v.vm(vm.id)).power_state).toBe('poweredOff')
  }, 120_000)
})
