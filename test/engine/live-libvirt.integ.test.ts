/**
 * Live `libvirt_remote` migrations end to end through the HTTP API: the real server (Bun) and its
 * worker migrate domains of this machine's libvirtd reached as a remote host over a real sshd
 * (`qemu+ssh://root@127.0.0.1:<port>/system`, test/helpers/sshd.ts) into the file sink, then
 * define, start and boot-check the destination domain under TCG.
 *
 * The source domains (`lvjob-src-*`) run the bootable test disk of fixtures/bootdisk.ts on qcow2
 * (one on raw); guest writes between passes are made through the running QEMU's block layer (HMP
 * `qemu-io` on the disk's device, the path a guest write takes), as the boot-sector guest does not
 * write by itself. Destination domains are `lvjob-dst-*`.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, readFileSync, readdirSync } from 'node:fs'
import * as path from 'node:path'
import { bootCheckEnv, call, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { startSshd, type RunningSshd } from '../helpers/sshd.ts'
import { tempDir } from '../helpers/tmp.ts'
import { defineSource, makeQcow2, qemuWrite, rawOf, removeTestDomains, virsh } from '../helpers/libvirt-source.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'

const PREFIX = 'lvjob-'
const MARKER = 'MIGRATOR-LVJOB-BOOT-4417'
const MiB = 1024 * 1024

describe('live libvirt_remote migrations through the HTTP API', () => {
  const t = tempDir('mig-lvjob-')
  let sshd: RunningSshd
  let srv: RunningServer
  let sourceId = ''

  const livePlan = (vmId: string, mode: 'Cold' | 'Warm', name: string, extra: Record<string, unknown> = {}) => ({
    source: { Live: 'libvirt_remote' },
    source_ref: { kind: 'live_vm', source_id: sourceId, vm_id: vmId },
    mode,
    name,
    start: true,
    ...extra,
  })

  function expectBitExact(jobId: string, label: string, sourceFile: string): void {
    const dest = readFileSync(volumePath(t.dir, jobId, label))
    expect([label, dest.equals(rawOf(sourceFile, t.dir))]).toEqual([label, true])
  }

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    await ensureLibvirt()
    removeTestDomains(PREFIX)
    sshd = await startSshd(path.join(t.dir, 'sshd'))
    srv = await startServer('bun', t.dir, {
      ...bootCheckEnv(MARKER),
      MIGRATOR_DELTA_CONVERGE_BYTES: String(MiB),
      MIGRATOR_DELTA_MAX_PASSES: '4',
      MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: '3',
    })
    // registration: the key sealed, never returned; the host key pinned
    const s = await call(srv.base, 'POST', '/sources', {
      name: 'kvm-local',
      kind: 'libvirt_remote',
      endpoint: `qemu+ssh://root@127.0.0.1:${sshd.port}/system`,
      username: 'root',
      private_key: sshd.privateKey,
      known_hosts: sshd.knownHosts,
    })
    expect(s.status).toBe(201)
    expect(JSON.stringify(s.body)).not.toContain('PRIVATE KEY')
    expect(s.body.known_hosts).toBe(sshd.knownHosts)
    sourceId = s.body.id
  }, 120_000)

  afterAll(async () => {
    await srv?.stop()
    removeTestDomains(PREFIX)
    await cleanupDomains(PREFIX)
    await sshd?.stop()
    t.cleanup()
  }, 60_000)

  test('registration errors name the field; test, list and inspect over HTTP', async () => {
    const bad = await call(srv.base, 'POST', '/sources', {
      name: 'kvm-bad',
      kind: 'libvirt_remote',
      endpoint: `qemu+ssh://root@127.0.0.1:${sshd.port}/system`,
      username: 'root',
      password: 'pw',
      known_hosts: 'not a key line',
    })
    expect(bad.status).toBe(400)
    expect(bad.body.error.details.issues.map((i: any) => i.path).sort()).toEqual(['known_hosts', 'password', 'private_key'])
    const probe = await call(srv.base, 'POST', `/sources/${sourceId}/test`)
    expect([probe.status, probe.body.ok, /^libvirt /.test(probe.body.product)]).toEqual([200, true, true])
    const q = makeQcow2(path.join(t.dir, 'list.qcow2'), MARKER, 8 * MiB)
    const uuid = defineSource(`${PREFIX}src-list`, [{ file: q, format: 'qcow2' }])
    const vms = await call(srv.base, 'GET', `/sources/${sourceId}/vms`)
    expect(vms.body.items.find((v: any) => v.vm_id === uuid)).toMatchObject({ name: `${PREFIX}src-list`, power_state: 'off', firmware: 'bios' })
    const m = await call(srv.base, 'GET', `/sources/${sourceId}/vms/${uuid}`)
    expect([m.status, m.body.source_format, m.body.disks[0].label, m.body.cbt_available]).toEqual([200, 'libvirt_remote', 'vda', true])
    const missing = await call(srv.base, 'GET', `/sources/${sourceId}/vms/${PREFIX}nosuch`)
    expect([missing.status, missing.body.error.code]).toEqual([404, 'E_MIG_VM_NOT_FOUND'])
  }, 60_000)

  test('cold: a shut-off domain copied bit-exact, the destination boots, the source stays off, marked, no checkpoint', async () => {
    const q = makeQcow2(path.join(t.dir, 'cold.qcow2'), MARKER, 16 * MiB)
    const uuid = defineSource(`${PREFIX}src-cold`, [{ file: q, format: 'qcow2' }], '52:54:00:4c:4a:01')
    const job = await submit(srv.base, livePlan(uuid, 'Cold', `${PREFIX}dst-cold`))
    const done = await waitJob(srv.base, job.id)
    expect([done.status, done.state, done.effective_mode, done.last_error]).toEqual(['completed', 'Completed', 'Cold', null])
    expect(done.hardware.boot.verified).toBe(true)
    expectBitExact(job.id, 'vda', q)
    // the zero areas of the sparse disk were skipped, not read
    expect(done.progress.bytes_zero).toBeGreaterThan(8 * MiB)
    expect(virsh('domstate', '--domain', uuid)).toBe('shut off')
    expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toBe('')
    expect(virsh('metadata', '--domain', uuid, '--uri', 'https://vm-migrator.invalid/libvirt-source/mark', '--config')).toContain(job.id)
    // the MAC travelled
    expect(virsh('dumpxml', '--domain', `${PREFIX}dst-cold`)).toContain('52:54:00:4c:4a:01')
    expect(readdirSync('/var/lib/libvirt/qemu').filter((f) => f.startsWith(`migrator-${job.id}`))).toEqual([])
  }, 240_000)

  test('warm: the guest writes between passes, cutover on command, bit-exact with its writes, booted, no checkpoint left', async () => {
    const q = makeQcow2(path.join(t.dir, 'warm.qcow2'), MARKER, 16 * MiB)
    const name = `${PREFIX}src-warm`
    const uuid = defineSource(name, [{ file: q, format: 'qcow2' }], '52:54:00:4c:4a:02')
    virsh('start', '--domain', uuid)
    const job = await submit(srv.base, livePlan(uuid, 'Warm', `${PREFIX}dst-warm`, { cutover: { mode: 'manual' }, precopy_interval_seconds: 2 }))
    await waitJob(srv.base, job.id, (j) => j.state === 'DeltaSyncing' && j.cutover?.passes_total >= 1, 180_000)
    qemuWrite(name, 'vda', 2 * MiB, 2 * MiB, 0x41)
    const seen = await waitJob(srv.base, job.id, (j) => j.cutover?.passes.some((p: any) => p.changed_bytes >= 2 * MiB), 120_000)
    // the pass that carried the write moved the written areas, not the disk
    expect(seen.cutover.passes.find((p: any) => p.changed_bytes >= 2 * MiB).changed_bytes).toBeLessThan(4 * MiB)
    qemuWrite(name, 'vda', 15 * MiB, 64 * 1024, 0x71)
    const c = await call(srv.base, 'POST', `/migrations/${job.id}/cutover`)
    expect(c.status).toBe(202)
    const done = await waitJob(srv.base, job.id, undefined, 240_000)
    expect([done.status, done.state, done.effective_mode, done.last_error]).toEqual(['completed', 'Completed', 'Warm', null])
    expect(done.hardware.boot.verified).toBe(true)
    expect(virsh('domstate', '--domain', uuid)).toBe('shut off')
    expectBitExact(job.id, 'vda', q)
    const dest = readFileSync(volumePath(t.dir, job.id, 'vda'))
    expect([dest[2 * MiB], dest[15 * MiB]]).toEqual([0x41, 0x71])
    expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toBe('')
    expect(execFileSync('qemu-img', ['info', '-U', '--output=json', q], { encoding: 'utf8' })).not.toContain('migrator-')
  }, 420_000)

  test('a raw source disk: a warm plan is downgraded to cold (E_MIG_CBT_UNSUPPORTED, non-fatal) and completes bit-exact', async () => {
    const raw = path.join(t.dir, 'rawsrc.raw')
    makeBootDisk(raw, MARKER, 8 * MiB)
    chmodSync(raw, 0o644)
    const uuid = defineSource(`${PREFIX}src-raw`, [{ file: raw, format: 'raw' }], '52:54:00:4c:4a:03')
    const job = await submit(srv.base, livePlan(uuid, 'Warm', `${PREFIX}dst-raw`, { start: false }))
    const done = await waitJob(srv.base, job.id, undefined, 180_000)
    expect([done.status, done.effective_mode, done.last_error?.code, done.last_error?.fatal]).toEqual(['completed', 'Cold', 'E_MIG_CBT_UNSUPPORTED', false])
    expect(readFileSync(volumePath(t.dir, job.id, 'vda')).equals(readFileSync(raw))).toBe(true)
    expect(virsh('domstate', '--domain', uuid)).toBe('shut off')
  }, 240_000)

  test('cancel mid-pass: the job is cancelled, its checkpoints and backup job removed, the running source left running', async () => {
    const q = makeQcow2(path.join(t.dir, 'cancel.qcow2'), MARKER, 16 * MiB)
    const uuid = defineSource(`${PREFIX}src-cancel`, [{ file: q, format: 'qcow2' }], '52:54:00:4c:4a:04')
    virsh('start', '--domain', uuid)
    const job = await submit(srv.base, livePlan(uuid, 'Warm', `${PREFIX}dst-cancel`, { cutover: { mode: 'manual' }, precopy_interval_seconds: 3600 }))
    await waitJob(srv.base, job.id, (j) => j.state === 'DeltaSyncing' && j.cutover?.passes_total >= 1, 180_000)
    expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toContain(`migrator-${job.id}`)
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
    const done = await waitJob(srv.base, job.id, undefined, 120_000)
    expect([done.status, done.last_error.code]).toEqual(['cancelled', 'E_MIG_CANCELLED'])
    expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toBe('')
    expect(virsh('domjobinfo', '--domain', uuid)).toMatch(/Job type:\s+None/)
    expect(virsh('domstate', '--domain', uuid)).toBe('running')
  }, 240_000)
})
