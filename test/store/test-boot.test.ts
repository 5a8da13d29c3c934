/**
 * The test boot's store side (docs/test-boot.md) on a real SQLite store: which jobs may
 * test-boot (`JobsRepo.requestTestBoot`: a warm job waiting for a manual cutover, a job Completed
 * with `start: false`; anything else `E_MIG_CONFLICT` saying when it becomes possible), one
 * active request at a time, the plan gate `cutover.require_test_boot` on the cutover command, and
 * the manifest a Completed job's test boot rebuilds from its defined domain.
 */
import { afterAll, expect, test } from 'bun:test'
import * as path from 'node:path'
import { manifestOfDefinedDomain } from '../../lib/domain/test-boot.ts'
import { initialCutover } from '../../lib/store/jobs.ts'
import { openStore } from '../../lib/store/index.ts'
import { Plan } from '../../lib/plan.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const t = tempDir('mig-i48-store-')
afterAll(() => t.cleanup())

const warm = (extra: Record<string, unknown> = {}) =>
  Plan.parse({
    source: { Live: 'vim_api' },
    source_ref: { kind: 'live_vm', source_id: '00000000-0000-4000-8000-000000000001', vm_id: 'vm-1' },
    mode: 'Warm',
    cutover: { mode: 'manual', ...extra },
  })

test('requestTestBoot: states, one active request, the require_test_boot gate on the cutover command', async () => {
  const store = await openStore(path.join(t.dir, 'db.sqlite'))
  const now = new Date().toISOString()
  const id = (n: number) => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`
  const plan = warm({ require_test_boot: true })
  await store.jobs.create({ id: id(1), plan, strategy: 'live', effective_mode: 'Warm', now, cutover: initialCutover(plan, 'live', 60) })
  // still copying: not yet
  let e = await thrown(() => store.jobs.requestTestBoot(id(1), now))
  expect([e.code, e.message]).toEqual(['E_MIG_CONFLICT', expect.stringContaining('it is Queued')])
  expect(e.message).toContain('a warm job with a manual or scheduled cutover waiting in DeltaSyncing')
  await store.jobs.update(id(1), { state: 'DeltaSyncing' }, now)
  // the gate: no test boot yet
  e = await thrown(() => store.jobs.requestCutover(id(1), now))
  expect([e.code, e.message]).toEqual(['E_MIG_CONFLICT', expect.stringContaining('requires a passing test boot (cutover.require_test_boot) and none was run')])
  const first = await store.jobs.requestTestBoot(id(1), now)
  expect([first.runner, first.changed, first.job.test_boot?.state]).toEqual(['worker', true, 'requested'])
  // asked again while requested: answered as it is
  const again = await store.jobs.requestTestBoot(id(1), new Date(Date.now() + 1000).toISOString())
  expect([again.changed, again.job.test_boot?.requested_at]).toEqual([false, now])
  expect(await store.jobs.withActiveTestBoot()).toEqual([id(1)])
  // a failed test boot does not open the gate; a passed one does
  await store.jobs.update(id(1), { test_boot: { ...first.job.test_boot!, state: 'failed' } }, now)
  e = await thrown(() => store.jobs.requestCutover(id(1), now))
  expect(e.message).toContain('the latest test boot is failed')
  expect(await store.jobs.withActiveTestBoot()).toEqual([])
  await store.jobs.update(id(1), { test_boot: { ...first.job.test_boot!, state: 'passed' } }, now)
  expect((await store.jobs.requestCutover(id(1), now)).cutover?.requested_at).toBe(now)
  // the cutover is requested: no test boot any more
  e = await thrown(() => store.jobs.requestTestBoot(id(1), now))
  expect(e.message).toContain('its cutover was requested already')

  // an offline job: only Completed with start: false
  const off = Plan.parse({ source: { Offline: 'qcow2' }, source_ref: { kind: 'offline_host_path', path: 'a.qcow2' }, mode: 'Cold', start: false })
  await store.jobs.create({ id: id(2), plan: off, strategy: 'offline', effective_mode: 'Cold', now })
  await store.jobs.update(id(2), { state: 'Completed', domain: 'vm-a' }, now)
  const srv = await store.jobs.requestTestBoot(id(2), now)
  expect([srv.runner, srv.changed]).toEqual(['server', true])
  const started = Plan.parse({ ...off, start: true })
  await store.jobs.create({ id: id(3), plan: started, strategy: 'offline', effective_mode: 'Cold', now })
  await store.jobs.update(id(3), { state: 'Completed', domain: 'vm-b' }, now)
  e = await thrown(() => store.jobs.requestTestBoot(id(3), now))
  expect(e.message).toContain('its destination domain was started already')
  await store.close()
})

test('plan: require_test_boot with an automatic cutover is refused', () => {
  const r = Plan.safeParse({ ...warm(), cutover: { mode: 'auto', require_test_boot: true } })
  expect(r.success).toBe(false)
  expect(JSON.stringify(r.error?.issues)).toContain('an automatic cutover does not wait for a test boot')
  expect(warm({ require_test_boot: true }).cutover).toEqual({ mode: 'manual', require_test_boot: true })
})

test('manifestOfDefinedDomain: disks from the job, memory, vCPUs, firmware and family from the defined domain', () => {
  const job = {
    id: 'j',
    domain: 'vm-a',
    plan: { source: { Offline: 'qcow2' } },
    hardware: null,
    progress: { disks: [{ label: 'Hard disk 1', capacity_bytes: 2 << 30 }] },
  } as never
  const xml = `<domain type='qemu'><name>vm-a</name><description>Guest OS: linux (debian12)</description><memory unit='KiB'>1048576</memory><vcpu placement='static'>2</vcpu><os><loader readonly='yes' secure='no' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader></os></domain>`
  const m = manifestOfDefinedDomain(job, xml)
  expect([m.name, m.memory_bytes, m.cpu.count, m.firmware, m.secure_boot, m.guest_os.family, m.nics]).toEqual(['vm-a', 1 << 30, 2, 'efi', false, 'linux', []])
  expect(m.disks.map((d) => [d.label, d.capacity_bytes])).toEqual([['Hard disk 1', 2 << 30]])
})

test("manifestOfDefinedDomain: the defined domain's NICs (MAC and model, in order) for a test boot with checks", () => {
  const job = {
    id: 'j',
    domain: 'vm-b',
    plan: { source: { Offline: 'vmx_folder' } },
    hardware: null,
    progress: { disks: [{ label: 'd', capacity_bytes: 1 << 30 }] },
  } as never
  const xml = `<domain type='qemu'><name>vm-b</name><memory unit='KiB'>524288</memory><vcpu>1</vcpu><devices>
    <interface type='bridge'><mac address='00:0c:29:aa:bb:cc'/><source bridge='br0'/><model type='virtio'/></interface>
    <interface type='user'><mac address='52:54:00:00:00:02'/><model type='e1000e'/></interface>
    <interface type='bridge'><source bridge='br1'/></interface>
  </devices></domain>`
  expect(manifestOfDefinedDomain(job, xml).nics).toEqual([
    { label: 'nic0', mac: '00:0c:29:aa:bb:cc', model: 'virtio', network: null },
    { label: 'nic1', mac: '52:54:00:00:00:02', model: 'e1000e', network: null },
    { label: 'nic2', mac: null, model: 'virtio', network: null },
  ])
})
