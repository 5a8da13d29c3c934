/**
 * Test boot before the cutover (docs/test-boot.md), end to end through the HTTP API and the CLI,
 * real libvirt + qemu (TCG), file sink (qcow2 overlays):
 * - warm vim_api jobs against govmomi's vCenter simulator (test/vcsim: a named test double of
 *   ESXi) waiting in DeltaSyncing; their boot disk is a boot sector that prints a marker on the
 *   serial console (cheap to boot under TCG; the server's MIGRATOR_BOOT_SERIAL_PATTERN makes the
 *   marker the boot evidence): a test boot that passes, with the clone's domain XML read while it
 *   runs (no interface, qcow2 overlay disks), delta passes held while the overlay exists and
 *   resumed after, the job still waiting, then a cutover that completes with the volumes equal
 *   to the source's disks; a test boot that fails (the marker never comes) with the job still
 *   waiting; a cancel during a test boot; a worker SIGKILLed during a test boot (the next worker
 *   removes the clone domain and overlays).
 * A real Debian guest's test boot (an offline import with `start: false`, `migrator test-boot
 * --wait`, the plan's checks in the test boot's isolated network) is asserted in
 * real-guests-shapes.guest.integ.test.ts, on the guest that boots there anyway.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, existsSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput } from '../../fixtures/inputs.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { runCli } from '../helpers/cli.ts'
import { call, livePlan, offlinePlan, openStream, submit, volumePath, waitJob, workerPid } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, virshText } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'
import { datastoreRaw, registerVcsim, startVcsim, type Vcsim, createTwoDiskVm } from '../helpers/vcsim.ts'

const PREFIX = 'i48-'
const MARKER = 'MIGRATOR-I48-TESTBOOT-5521'
const MiB = 1024 * 1024

describe('test boot before the cutover', () => {
  const t = tempDir('mig-i48-')
  let v: Vcsim
  let srv: RunningServer
  const sourceIds = new Map<RunningServer, string>()

  /** A warm VM: a 16 MiB boot disk printing `marker` (flat) and a 2 MiB data disk (sparse), one NIC. */
  async function makeVm(name: string, marker = MARKER): Promise<{ id: string; files: string[] }> {
    const boot = makeBootDisk(path.join(t.dir, `${name}-boot.raw`), marker, 16 * MiB).path
    const { id, files } = await createTwoDiskVm(v, t.dir, name, boot, { macs: ['00:50:56:01:48:01'] })
    // the guest writes 64 KiB on its data disk before every snapshot: each delta pass copies it
    await v.scheduleWrites(id, [{ before_snapshot: 1, every: true, file: files[1], offset: 0, length: 64 * 1024, pattern: name.length }])
    return { id, files }
  }

  const warmPlan = (s: RunningServer, vmId: string, name: string) =>
    livePlan(sourceIds.get(s)!, vmId, 'Warm', { name, start: false, cutover: { mode: 'manual' }, precopy_interval_seconds: 1 })

  /** Submits a warm job and waits until it waits in DeltaSyncing with at least one delta pass. */
  async function waiting(s: RunningServer, name: string, marker = MARKER): Promise<{ vm: { id: string; files: string[] }; job: any }> {
    const vm = await makeVm(name, marker)
    const job = await submit(s.base, warmPlan(s, vm.id, name))
    await waitJob(s.base, job.id, (j) => j.cutover?.passes_total >= 1 || !['running', 'queued'].includes(j.status), 90_000)
    return { vm, job }
  }

  const overlayDir = (dataDir: string, jobId: string) => path.join(dataDir, 'volumes', 'migrations', jobId, '.testboot')

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    v = await startVcsim({ cbtPage: 64 * 1024 })
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir, {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: '15',
      MIGRATOR_BOOT_SERIAL_PATTERN: MARKER,
      MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: '5',
    })
    sourceIds.set(srv, await registerVcsim(srv.base, v))
  }, 300_000)

  afterAll(async () => {
    await srv?.stop()
    await cleanupDomains(PREFIX)
    await v?.stop()
    t.cleanup()
  })

  test('warm job: the clone boots on no network while the source runs, passes are held then resume, the job still waits, a later cutover completes', async () => {
    const stream = openStream(srv.base)
    await stream.ready
    const { vm, job } = await waiting(srv, 'i48-warm')
    // before any request: none recorded
    expect((await call(srv.base, 'GET', `/migrations/${job.id}`)).body.test_boot).toBeNull()
    const r = await call(srv.base, 'POST', `/migrations/${job.id}/test-boot`)
    expect(r.status).toBe(202)
    expect(r.body.test_boot.state).toBe('requested')
    // the clone's domain while it runs: no interface at all, its disks the qcow2 overlays
    const clone = 'i48-warm-testboot'
    let xml = ''
    for (let i = 0; i < 300 && !xml.includes('<domain'); i++) {
      await Bun.sleep(50)
      xml = virshText('dumpxml', clone)
    }
    expect(xml).toContain('<domain')
    expect(xml).not.toContain('<interface')
    expect(xml).toContain(`${overlayDir(t.dir, job.id)}/`)
    expect(xml).toContain("type='qcow2'")
    const during = (await call(srv.base, 'GET', `/migrations/${job.id}`)).body
    expect(during.test_boot.state).toBe('running')
    const passesAtStart = during.cutover.passes_total
    const done = await waitJob(srv.base, job.id, (j) => ['passed', 'failed', 'cancelled'].includes(j.test_boot?.state), 60_000)
    console.log(`warm test boot: ${JSON.stringify({ ...done.test_boot, serial_tail: done.test_boot.serial_tail.slice(-3) })}`)
    const tb = done.test_boot
    expect([tb.state, tb.verified, tb.error]).toEqual(['passed', true, null])
    expect(tb.evidence).toContain(MARKER)
    expect(tb.domain).toBe(clone)
    expect(tb.clone).toBe('qcow2 overlay over the raw volume')
    expect(tb.seconds).toBeGreaterThan(0)
    expect(tb.hardware.firmware).toBe('bios')
    expect(tb.serial_tail.join('\n')).toContain(MARKER)
    // the overlay reads the raw volumes live: no delta pass ran while it existed
    expect(done.cutover.passes_total).toBe(passesAtStart)
    // the job still waits; the clone's domain and overlays are gone; the source still runs
    expect([done.state, done.status, done.last_error]).toEqual(['DeltaSyncing', 'running', null])
    expect(virshText('domstate', clone)).toBe('absent')
    expect(existsSync(overlayDir(t.dir, job.id))).toBe(false)
    expect((await v.vm(vm.id)).power_state).toBe('poweredOn')
    // passes resume after the test boot
    await waitJob(srv.base, job.id, (j) => j.cutover.passes_total >= passesAtStart + 1, 30_000)
    // the SSE stream carried each change of the test boot
    const seen = stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id && e.data.test_boot).map((e) => e.data.test_boot.state)
    expect(seen.filter((s, i) => s !== seen[i - 1])).toEqual(['requested', 'running', 'passed'])
    stream.close()
    // a later cutover completes; the destination volumes equal the source's final disks (the clone's writes never reached them)
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/cutover`)).status).toBe(202)
    const end = await waitJob(srv.base, job.id, undefined, 90_000)
    expect([end.state, end.last_error]).toEqual(['Completed', null])
    expect(end.test_boot.state).toBe('passed')
    for (const f of vm.files) {
      const label = path.basename(f, '.vmdk')
      expect([label, readFileSync(volumePath(t.dir, job.id, label)).equals(datastoreRaw(v, f, t.dir))]).toEqual([label, true])
    }
    // the real domain (defined at the cutover, not started) keeps its NIC
    expect(virshText('dumpxml', 'i48-warm')).toContain('<interface')
    virshText('undefine', 'i48-warm')
  }, 240_000)

  test('a clone that does not boot: the test boot fails with the reason and the serial tail, the job keeps waiting; cancel then removes everything', async () => {
    const { job } = await waiting(srv, 'i48-noboot', 'NOT-THE-EXPECTED-MARKER')
    const cli = await runCli(['--json', 'test-boot', '--wait', job.id], { env: { MIGRATOR_URL: srv.base } })
    const out = JSON.parse(cli.stdout)
    expect(cli.code).toBe(1)
    expect(out.test_boot.state).toBe('failed')
    expect(out.test_boot.error).toContain('E_MIG_GUEST_BOOT_FAILED')
    expect(out.test_boot.error).toContain(`did not match /${MARKER}/`)
    expect(out.test_boot.serial_tail.join('\n')).toContain('NOT-THE-EXPECTED-MARKER')
    const after = (await call(srv.base, 'GET', `/migrations/${job.id}`)).body
    expect([after.state, after.status, after.last_error]).toEqual(['DeltaSyncing', 'running', null])
    expect(virshText('domstate', 'i48-noboot-testboot')).toBe('absent')
    expect(existsSync(overlayDir(t.dir, job.id))).toBe(false)
    // cancel during a second test boot: the job ends Cancelled and nothing is left
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/test-boot`)).status).toBe(202)
    await waitJob(srv.base, job.id, (j) => j.test_boot?.state === 'running' && virshText('domstate', 'i48-noboot-testboot') === 'running', 30_000)
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
    const end = await waitJob(srv.base, job.id, undefined, 60_000)
    expect([end.state, end.test_boot.state]).toEqual(['Cancelled', 'cancelled'])
    expect(end.test_boot.error).toContain('cancelled')
    expect(virshText('domstate', 'i48-noboot-testboot')).toBe('absent')
    expect(existsSync(path.join(t.dir, 'volumes', 'migrations', job.id))).toBe(false)
  }, 240_000)

  test('a worker SIGKILLed during a test boot: the next worker removes the clone domain and overlays and records it cancelled', async () => {
    const { job } = await waiting(srv, 'i48-kill', 'NOT-THE-EXPECTED-MARKER')
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/test-boot`)).status).toBe(202)
    await waitJob(srv.base, job.id, (j) => j.test_boot?.state === 'running' && virshText('domstate', 'i48-kill-testboot') === 'running', 30_000)
    expect(existsSync(overlayDir(t.dir, job.id))).toBe(true)
    process.kill(workerPid(t.dir, job.id)!, 'SIGKILL')
    const after = await waitJob(srv.base, job.id, (j) => j.test_boot?.state === 'cancelled', 60_000)
    expect(after.test_boot.error).toContain('the worker running the test boot ended')
    expect(after.test_boot.error).toContain('its domain and clone were removed')
    expect(virshText('domstate', 'i48-kill-testboot')).toBe('absent')
    expect(existsSync(overlayDir(t.dir, job.id))).toBe(false)
    // the job goes on: back to waiting in DeltaSyncing
    const back = await waitJob(srv.base, job.id, (j) => j.state === 'DeltaSyncing' && j.cutover.passes_total >= 1, 90_000)
    expect(back.status).toBe('running')
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
    await waitJob(srv.base, job.id)
  }, 240_000)

  test('state checks: a job that is not waiting answers E_MIG_CONFLICT saying when a test boot is possible', async () => {
    const r = await call(srv.base, 'POST', '/migrations/00000000-0000-4000-8000-000000000000/test-boot')
    expect([r.status, r.body.error.code]).toEqual([404, 'E_MIG_NOT_FOUND'])
    const importRoot = path.join(t.dir, 'imports')
    mkdirSync(importRoot, { recursive: true })
    const boot = makeBootDisk(path.join(t.dir, 'conflict.raw'), MARKER, 4 * MiB).path
    const input = buildInput('qcow2', importRoot, 'i48-conflict', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'i48-conflict' }))
    const done = await waitJob(srv.base, job.id)
    expect(done.state).toBe('Completed')
    const c = await call(srv.base, 'POST', `/migrations/${job.id}/test-boot`)
    expect([c.status, c.body.error.code]).toEqual([409, 'E_MIG_CONFLICT'])
    expect(c.body.error.message).toContain('its destination domain was started already')
    expect(c.body.error.message).toContain('Completed with plan start: false')
    await cleanupDomains('i48-conflict')
  }, 120_000)
})
