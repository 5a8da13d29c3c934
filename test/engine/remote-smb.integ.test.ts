/**
 * Remote offline inputs from an SMB share (`smb://server:port/share/file`, docs/remote-sources.md)
 * against a real Samba (Debian `samba`, default NTLMv2-only authentication) started by the test
 * on 127.0.0.1 (test/helpers/smbd.ts), with the real server, workers and file sink: a qcow2, a
 * VMDK, a VHDX and a two-disk OVA bit-exact against `qemu-img convert` of the same files read
 * locally, with a registered `smb` credential (sealed, never returned); a wrong password; a
 * missing file named; a worker killed half-way (resumed from its watermark: the bytes smbd sent
 * after the kill, counted by a TCP proxy, are at most the data above the watermark plus one
 * flush interval); a file replaced mid-copy.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { mkdirSync, readdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput, fileSha256, makeRawImage, rawSha256 } from '../helpers/inputs.ts'
import { runCli } from '../helpers/cli.ts'
import { call, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { startCuttingProxy, type CuttingProxy } from '../helpers/nginx.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { SMBD_USER, startSmbd, type RunningSmbd } from '../helpers/smbd.ts'
import { randomImage } from '../helpers/random-image.ts'
import { expectResumedFromWatermark, killWorkerHalfway, replaceMidCopy, stageReplacement } from '../helpers/remote-faults.ts'

const PREFIX = 'migsmb-'
const MiB = 1024 * 1024
const FLUSH = 16 * MiB
const BIG_DATA = 160 * MiB
const SLOW = { MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(48 * MiB), MIGRATOR_FLUSH_EVERY_BYTES: String(FLUSH), MIGRATOR_DOMAIN_TYPE: 'qemu' }

describe('remote offline inputs over SMB (real smbd, server, workers, file sink)', () => {
  let smbd: RunningSmbd
  /** A TCP proxy in front of smbd counting the bytes it sends. */
  let counter: CuttingProxy
  let credential = ''
  const files: Record<string, string> = {}
  const { t, srv } = serverSuite({ prefix: PREFIX, tmpPrefix: 'mig-smbjob-', env: SLOW, stop: (s) => [s, counter, smbd] })
  const share = path.join(t.dir, 'share')
  const scratch = path.join(t.dir, 'scratch')

  beforeAll(async () => {
    mkdirSync(path.join(share, 'exports'), { recursive: true })
    mkdirSync(scratch)
    mkdirSync(path.join(t.dir, 'imports'), { recursive: true })
    const raws = [makeRawImage(path.join(scratch, 'a.raw'), 64 * MiB, 1), makeRawImage(path.join(scratch, 'b.raw'), 40 * MiB, 2)]
    files.qcow2 = buildInput('qcow2', share, 'q', [raws[0]!]).path
    files.vmdk = buildInput('vmdk', share, 'v', [raws[0]!]).path
    files.vhdx = buildInput('vhdx', share, 'h', [raws[0]!]).path
    files.ova = buildInput('ova_archive', path.join(share, 'exports'), 'o', raws).path
    files.big = buildInput('qcow2', share, 'big', [randomImage(path.join(scratch, 'big.raw'), 256 * MiB, BIG_DATA)]).path
    smbd = await startSmbd(share, path.join(t.dir, 'smbd'))
    // passes every connection through, counting the bytes smbd sends
    counter = await startCuttingProxy(smbd.port, 0, 0)
    const c = await call(srv.base, 'POST', '/remote-credentials', { name: 'share', kind: 'smb', ...SMBD_USER, domain: 'WORKGROUP' })
    expect(c.status).toBe(201)
    credential = c.body.id
  }, 180_000)

  const url = (file: string, base = smbd.base) => `${base}/${path.relative(share, file).split('/').map(encodeURIComponent).join('/')}`
  const plan = (kind: string, u: string, name: string, credential_id = credential) => ({
    source: { Offline: kind },
    source_ref: { kind: 'offline_url', url: u, credential_id },
    mode: 'Cold',
    name: `${PREFIX}${name}`,
    start: false,
  })
  const nothingStaged = () => {
    const staging = path.join(t.dir, 'tmp', 'staging')
    try {
      return readdirSync(staging, { recursive: true }).length === 0
    } catch {
      return true
    }
  }

  test('the smb credential is sealed: listed as DOMAIN\\user, its password never returned nor stored in clear', async () => {
    const list = await call(srv.base, 'GET', '/remote-credentials')
    expect(list.body.items.map((c: { kind: string; username: string }) => [c.kind, c.username])).toEqual([['smb', `WORKGROUP\\${SMBD_USER.username}`]])
    expect(JSON.stringify(list.body)).not.toContain(SMBD_USER.password)
    const dbDir = path.join(t.dir, 'migrator.db')
    for (const f of readdirSync(dbDir)) expect(readFileSync(path.join(dbDir, f)).includes(SMBD_USER.password)).toBe(false)
    const spec = (await call(srv.base, 'GET', '/openapi.json')).body
    expect(JSON.stringify(spec)).toContain('"smb"')
  })

  for (const kind of ['qcow2', 'vmdk', 'vhdx'] as const)
    test(`a ${kind} image over SMB lands bit-exact, read in place`, async () => {
      const job = await submit(srv.base, plan(kind, url(files[kind]!), kind))
      const done = await waitJob(srv.base, job.id)
      expect([done.state, done.last_error]).toEqual(['Completed', null])
      expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(rawSha256(files[kind]!, kind, scratch))
      expect(nothingStaged()).toBe(true)
    }, 120_000)

  test('a two-disk OVA over SMB: each disk read in place, both bit-exact; inspect without copying', async () => {
    const u = url(files.ova!)
    const i = await call(srv.base, 'POST', '/remote-files/inspect', { url: u, credential_id: credential })
    expect([i.status, i.body.detected_kind, i.body.manifest?.disks.length]).toEqual([200, 'ova_archive', 2])
    const job = await submit(srv.base, plan('ova_archive', u, 'ova'))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    const x = path.join(scratch, 'ova-x')
    mkdirSync(x)
    execFileSync('tar', ['-xf', files.ova!, '-C', x])
    for (const [n, d] of done.progress.disks.entries())
      expect(fileSha256(volumePath(t.dir, job.id, d.label))).toBe(rawSha256(path.join(x, `o-disk${n + 1}.vmdk`), 'vmdk', scratch))
    expect(nothingStaged()).toBe(true)
  }, 120_000)

  test('migrator import <smb URL> --credential: inspected remotely, submitted as offline_url, followed to Completed', async () => {
    const target = url(files.vmdk!)
    const r = await runCli(['import', target, '--credential', credential, '--name', `${PREFIX}cli`, '--no-start'], {
      env: { MIGRATOR_URL: srv.base },
      timeoutMs: 90_000,
    })
    // the operator's view (README "Remote exports" shows it)
    console.log(`$ migrator import ${target} --credential ${credential} --name ${PREFIX}cli --no-start\n${r.stdout}`)
    expect([r.code, r.stderr]).toEqual([0, ''])
    const id = /^migration ([0-9a-f-]{36}) submitted$/m.exec(r.stdout)![1]!
    expect(r.stdout.split('\n')).toContain(`migration ${id} Completed`)
    const job = (await call(srv.base, 'GET', `/migrations/${id}`)).body
    expect(job.plan.source_ref).toEqual({ kind: 'offline_url', url: target, credential_id: credential })
    expect(fileSha256(volumePath(t.dir, id, job.progress.disks[0].label))).toBe(rawSha256(files.vmdk!, 'vmdk', scratch))
  }, 120_000)

  test('a wrong password fails E_MIG_AUTH_FAILED; a missing file E_MIG_NOT_FOUND naming it; an http credential for smb:// is refused at submission', async () => {
    const bad = await call(srv.base, 'POST', '/remote-credentials', { name: 'bad', kind: 'smb', username: SMBD_USER.username, password: 'wrong-password-7' })
    const no = await submit(srv.base, plan('qcow2', url(files.qcow2!), 'noauth', bad.body.id))
    const missing = `${smbd.base}/exports/none.ova`
    const nf = await submit(srv.base, plan('ova_archive', missing, 'nf'))
    const [noDone, nfDone] = [await waitJob(srv.base, no.id), await waitJob(srv.base, nf.id)]
    expect([noDone.state, noDone.last_error.code]).toEqual(['Failed', 'E_MIG_AUTH_FAILED'])
    expect(noDone.last_error.message).toContain('STATUS_LOGON_FAILURE')
    expect([nfDone.state, nfDone.last_error.code]).toEqual(['Failed', 'E_MIG_NOT_FOUND'])
    expect(nfDone.last_error.message).toContain(`${missing}: no file "exports\\none.ova" in share "exports"`)
    const basic = await call(srv.base, 'POST', '/remote-credentials', { name: 'basic', kind: 'http_basic', username: 'u', password: 'p' })
    const wrong = await call(srv.base, 'POST', '/migrations', { plan: plan('qcow2', url(files.qcow2!), 'wrongkind', basic.body.id) })
    expect([wrong.status, wrong.body.error.code, wrong.body.error.details.issues[0].path]).toEqual([400, 'E_MIG_INVALID_PLAN', 'plan.source_ref.credential_id'])
    const noFile = await call(srv.base, 'POST', '/migrations', { plan: plan('qcow2', `${smbd.base}`, 'noshare') })
    expect([noFile.status, noFile.body.error.details.issues[0].path]).toEqual([400, 'plan.source_ref.url'])
    const tls = await call(srv.base, 'POST', '/migrations', {
      plan: { ...plan('qcow2', url(files.qcow2!), 'tls'), source_ref: { kind: 'offline_url', url: url(files.qcow2!), tls: { insecure: true } } },
    })
    expect([tls.status, tls.body.error.details.issues[0].path]).toEqual([400, 'plan.source_ref.tls'])
  }, 120_000)

  test('kill -9 of the worker half-way: the retried job resumes from its watermark and completes bit-exact', async () => {
    const counted = plan('qcow2', url(files.big!, `smb://127.0.0.1:${new URL(counter.base).port}/exports`), 'wkill')
    const { job, done, durable, servedAtKill } = await killWorkerHalfway(srv.base, t.dir, counted, () => counter.bytes)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(rawSha256(files.big!, 'qcow2', scratch))
    // from zero the restarted worker would read all 160 MiB; it reads the data above the durable
    // watermark plus at most one flush interval (and the image's tables, SMB headers)
    expectResumedFromWatermark(done, durable, counter.bytes - servedAtKill, { data: BIG_DATA, flush: FLUSH, slack: 2 * MiB })
  }, 120_000)

  test('the file replaced on the share mid-copy: the job fails E_MIG_DISK_READ_FAILED, never a mixed disk', async () => {
    const f = path.join(share, 'swap.qcow2')
    stageReplacement(f, files.big!, path.join(scratch, 'big.raw'))
    const job = await submit(srv.base, plan('qcow2', url(f), 'swap'))
    const done = await replaceMidCopy(srv.base, job.id, f)
    expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_DISK_READ_FAILED'])
    expect(done.last_error.message).toContain('the file changed on the server since the copy began')
  }, 120_000)
})
