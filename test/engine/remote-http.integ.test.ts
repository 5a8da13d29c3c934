/**
 * Remote offline inputs over HTTP(S) end to end (roadmap v0.3, docs/remote-sources.md): the
 * server (Bun) and its worker processes import plans whose `source_ref` is `offline_url`, from a
 * real nginx on 127.0.0.1 (test/helpers/nginx.ts). A qcow2, a VMDK, a VHDX and a two-disk OVA
 * land bit-exact (against `qemu-img convert` of the same files read locally), read in place with
 * ranged requests and nothing staged on the host; a server without ranges, basic auth with a
 * registered credential (sealed, never returned), TLS with a test CA, 404, a worker killed
 * half-way (resumed from its watermark without reading the durable bytes again) and an object
 * replaced mid-copy (E_MIG_DISK_READ_FAILED).
 *
 * Copies are slowed with `MIGRATOR_COPY_MAX_BYTES_PER_SECOND` and checkpointed every 16 MiB so
 * "half-way" is a moment a test can hit. Plans use `start: false` (define the domain, no boot).
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, readdirSync, statSync, utimesSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput, fileSha256, makeRawImage, rawSha256 } from '../helpers/inputs.ts'
import { runCli } from '../helpers/cli.ts'
import { call, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { makeTestCa, NGINX_USER, startNginx, type RunningNginx } from '../helpers/nginx.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { randomImage } from '../helpers/random-image.ts'
import { expectResumedFromWatermark, killWorkerHalfway, replaceMidCopy, stageReplacement } from '../helpers/remote-faults.ts'

const PREFIX = 'migurl-'
const MiB = 1024 * 1024
const FLUSH = 16 * MiB
const BIG_DATA = 160 * MiB
const SLOW = { MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(48 * MiB), MIGRATOR_FLUSH_EVERY_BYTES: String(FLUSH), MIGRATOR_DOMAIN_TYPE: 'qemu' }

/** A plan importing `url` as `kind`. */
function urlPlan(kind: string, url: string, name: string, ref: Record<string, unknown> = {}): Record<string, unknown> {
  return { source: { Offline: kind }, source_ref: { kind: 'offline_url', url, ...ref }, mode: 'Cold', name: `${PREFIX}${name}`, start: false }
}

describe('remote offline inputs over HTTP(S) (real nginx, server, workers, file sink)', () => {
  let web: RunningNginx
  let tlsWeb: RunningNginx
  const { t, srv } = serverSuite({ prefix: PREFIX, tmpPrefix: 'mig-remote-', env: SLOW, stop: (s) => [s, web, tlsWeb] })
  const www = path.join(t.dir, 'www')
  const scratch = path.join(t.dir, 'scratch')
  let ca: ReturnType<typeof makeTestCa>
  const raws: string[] = []
  const files: Record<string, string> = {}

  beforeAll(async () => {
    mkdirSync(www, { recursive: true })
    mkdirSync(scratch)
    mkdirSync(path.join(t.dir, 'imports'), { recursive: true })
    raws.push(makeRawImage(path.join(scratch, 'a.raw'), 64 * MiB, 1), makeRawImage(path.join(scratch, 'b.raw'), 40 * MiB, 2))
    files.qcow2 = buildInput('qcow2', www, 'q', [raws[0]!]).path
    files.vmdk = buildInput('vmdk', www, 'v', [raws[0]!]).path
    files.vhdx = buildInput('vhdx', www, 'h', [raws[0]!]).path
    files.ova = buildInput('ova_archive', www, 'o', raws).path
    files.big = buildInput('qcow2', www, 'big', [randomImage(path.join(scratch, 'big.raw'), 256 * MiB, BIG_DATA)]).path
    ca = makeTestCa(path.join(t.dir, 'ca'))
    web = await startNginx(www, path.join(t.dir, 'nginx'))
    tlsWeb = await startNginx(www, path.join(t.dir, 'nginx-tls'), { tls: { cert: ca.cert, key: ca.key } })
  }, 180_000)

  const url = (file: string, prefix = '') => `${web.base}${prefix}/${path.relative(www, file)}`
  const requestsOf = (file: string) => web.requests().filter((r) => r.uri === `/${path.relative(www, file)}`)
  /** Nothing of a remote input was written to the host: no staging directory holds a file. */
  const nothingStaged = () => {
    const staging = path.join(t.dir, 'tmp', 'staging')
    return !existsSync(staging) || readdirSync(staging, { recursive: true }).length === 0
  }

  for (const kind of ['qcow2', 'vmdk', 'vhdx'] as const)
    test(`a ${kind} image over HTTP lands bit-exact, read with ranged requests only`, async () => {
      const job = await submit(srv.base, urlPlan(kind, url(files[kind]!), kind))
      const done = await waitJob(srv.base, job.id)
      expect([done.state, done.last_error]).toEqual(['Completed', null])
      const format = kind === 'vhdx' ? 'vhdx' : kind
      expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(rawSha256(files[kind]!, format, scratch))
      const reqs = requestsOf(files[kind]!)
      expect(reqs.length).toBeGreaterThan(1)
      expect(reqs.every((r) => r.status === 206 && r.range.startsWith('bytes='))).toBe(true)
      expect(nothingStaged()).toBe(true)
    }, 120_000)

  test('a two-disk OVA over HTTP: members found from the tar headers, each disk read in place, both bit-exact', async () => {
    const job = await submit(srv.base, urlPlan('ova_archive', url(files.ova!), 'ova'))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(done.progress.disks.length).toBe(2)
    // the reference: qemu-img convert of the OVA's stream-optimized members, extracted locally
    const x = path.join(scratch, 'ova-x')
    mkdirSync(x)
    execFileSync('tar', ['-xf', files.ova!, '-C', x])
    for (const [i, d] of done.progress.disks.entries())
      expect(fileSha256(volumePath(t.dir, job.id, d.label))).toBe(rawSha256(path.join(x, `o-disk${i + 1}.vmdk`), 'vmdk', scratch))
    const reqs = requestsOf(files.ova!)
    expect(reqs.every((r) => r.status === 206)).toBe(true)
    // read in place: the bytes served are about one pass over the archive (the .mf digests of the
    // disks, checked alongside the copy, read each member once more), never a download per block
    const served = reqs.reduce((s, r) => s + r.bytes, 0)
    expect(served).toBeLessThan(3 * (statSync(files.ova!).size + MiB))
    expect(nothingStaged()).toBe(true)
  }, 120_000)

  test('a server without ranges (nginx max_ranges 0): the object is read once whole, bit-exact', async () => {
    const job = await submit(srv.base, urlPlan('qcow2', url(files.qcow2!, '/noranges'), 'noranges'))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(rawSha256(files.qcow2!, 'qcow2', scratch))
    const reqs = web.requests().filter((r) => r.uri === `/noranges/${path.relative(www, files.qcow2!)}`)
    expect(reqs.every((r) => r.status === 200)).toBe(true)
  }, 120_000)

  test('basic auth: a registered credential reads; its secret is never returned nor stored in clear; a wrong one is E_MIG_AUTH_FAILED', async () => {
    const good = await call(srv.base, 'POST', '/remote-credentials', { name: 'web', kind: 'http_basic', ...NGINX_USER })
    expect(good.status).toBe(201)
    expect(JSON.stringify(good.body)).not.toContain(NGINX_USER.password)
    const bad = await call(srv.base, 'POST', '/remote-credentials', { name: 'web-bad', kind: 'http_basic', username: 'user', password: 'not-the-password-42' })
    const list = await call(srv.base, 'GET', '/remote-credentials')
    expect(list.body.items.map((c: { name: string }) => c.name)).toEqual(['web', 'web-bad'])
    expect(JSON.stringify(list.body)).not.toMatch(/secret|not-the-password-42/)
    const dbDir = path.join(t.dir, 'migrator.db')
    for (const f of readdirSync(dbDir)) expect(readFileSync(path.join(dbDir, f)).includes('not-the-password-42')).toBe(false)
    const ok = await submit(srv.base, urlPlan('qcow2', url(files.qcow2!, '/private'), 'auth', { credential_id: good.body.id }))
    const no = await submit(srv.base, urlPlan('qcow2', url(files.qcow2!, '/private'), 'noauth', { credential_id: bad.body.id }))
    const [okDone, noDone] = [await waitJob(srv.base, ok.id), await waitJob(srv.base, no.id)]
    expect(okDone.state).toBe('Completed')
    expect(fileSha256(volumePath(t.dir, ok.id, okDone.progress.disks[0].label))).toBe(rawSha256(files.qcow2!, 'qcow2', scratch))
    expect([noDone.state, noDone.last_error.code]).toEqual(['Failed', 'E_MIG_AUTH_FAILED'])
    expect(noDone.last_error.message).toContain('HTTP 401')
    // an unknown credential is refused at submission, naming the field
    const unknown = await call(srv.base, 'POST', '/migrations', {
      plan: urlPlan('qcow2', url(files.qcow2!), 'x', { credential_id: '00000000-0000-4000-8000-000000000000' }),
    })
    expect([unknown.status, unknown.body.error.code]).toEqual([404, 'E_MIG_NOT_FOUND'])
    expect(unknown.body.error.message).toContain('plan.source_ref.credential_id')
  }, 120_000)

  test('HTTPS with a test CA in the plan lands bit-exact; without it the job fails E_MIG_SOURCE_UNREACHABLE (TLS)', async () => {
    const tlsUrl = `${tlsWeb.base}/${path.relative(www, files.vmdk!)}`
    const ok = await submit(srv.base, urlPlan('vmdk', tlsUrl, 'tls', { tls: { ca_pem: ca.caPem } }))
    const no = await submit(srv.base, urlPlan('vmdk', tlsUrl, 'notls'))
    const [okDone, noDone] = [await waitJob(srv.base, ok.id), await waitJob(srv.base, no.id)]
    expect(okDone.state).toBe('Completed')
    expect(fileSha256(volumePath(t.dir, ok.id, okDone.progress.disks[0].label))).toBe(rawSha256(files.vmdk!, 'vmdk', scratch))
    expect([noDone.state, noDone.last_error.code]).toEqual(['Failed', 'E_MIG_SOURCE_UNREACHABLE'])
    expect(noDone.last_error.message).toContain('TLS')
  }, 120_000)

  test('migrator import <https URL> --ca-file --credential: inspected remotely, submitted as offline_url, followed to Completed', async () => {
    writeFileSync(path.join(scratch, 'ca.pem'), ca.caPem)
    const cred = await call(srv.base, 'POST', '/remote-credentials', { name: 'cli', kind: 'http_basic', ...NGINX_USER })
    const target = `${tlsWeb.base}/private/${path.relative(www, files.qcow2!)}`
    const r = await runCli(
      ['import', target, '--ca-file', path.join(scratch, 'ca.pem'), '--credential', cred.body.id, '--name', `${PREFIX}cli`, '--no-start'],
      {
        env: { MIGRATOR_URL: srv.base },
        timeoutMs: 90_000,
      },
    )
    expect([r.code, r.stderr]).toEqual([0, ''])
    const lines = r.stdout.split('\n')
    expect(lines).toContain('qcow2: q, 1 vCPU, 2.0 GiB, bios, guest unknown')
    expect(lines).toContain('  disk q: 64.0 MiB qcow2')
    const id = /^migration ([0-9a-f-]{36}) submitted$/m.exec(r.stdout)![1]!
    expect(lines).toContain(`migration ${id} Completed`)
    const job = (await call(srv.base, 'GET', `/migrations/${id}`)).body
    expect(job.plan.source_ref).toEqual({ kind: 'offline_url', url: target, credential_id: cred.body.id, tls: { ca_pem: ca.caPem } })
    expect(fileSha256(volumePath(t.dir, id, job.progress.disks[0].label))).toBe(rawSha256(files.qcow2!, 'qcow2', scratch))
  }, 120_000)

  test('404: the job fails E_MIG_NOT_FOUND naming the URL', async () => {
    const missing = `${web.base}/no/such.ova`
    const job = await submit(srv.base, urlPlan('ova_archive', missing, 'nf'))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_NOT_FOUND'])
    expect(done.last_error.message).toContain(missing)
  }, 60_000)

  test('POST /remote-files/inspect reads the manifest without copying; bad URLs and kinds are refused naming the field', async () => {
    const served = (file: string) => requestsOf(file).reduce((s, r) => s + r.bytes, 0)
    let before = served(files.ova!)
    const r = await call(srv.base, 'POST', '/remote-files/inspect', { url: url(files.ova!) })
    expect(r.status).toBe(200)
    expect(r.body.detected_kind).toBe('ova_archive')
    expect(r.body.manifest.disks.map((d: { capacity_bytes: number }) => d.capacity_bytes)).toEqual([64 * MiB, 40 * MiB])
    // members under 64 MiB have their .mf digest checked at inspect: one pass over the archive,
    // plus the open's first 64 KiB and the heads and tails of the disk members read for their format
    expect(served(files.ova!) - before).toBeLessThanOrEqual(statSync(files.ova!).size + 512 * 1024)
    // a 160 MiB qcow2: its header and tables only, never the data
    before = served(files.big!)
    const q = await call(srv.base, 'POST', '/remote-files/inspect', { url: url(files.big!), kind: 'qcow2' })
    expect([q.status, q.body.manifest?.disks[0].capacity_bytes]).toEqual([200, 256 * MiB])
    expect(served(files.big!) - before).toBeLessThan(MiB)
    const badBody = await call(srv.base, 'POST', '/remote-files/inspect', { url: 'ftp://127.0.0.1/x.ova' })
    expect([badBody.status, badBody.body.error.code, badBody.body.error.details.issues[0].path]).toEqual([400, 'E_MIG_BAD_REQUEST', 'url'])
    const cases: Array<[Record<string, unknown>, string, string]> = [
      [urlPlan('qcow2', 'ftp://127.0.0.1/x.qcow2', 'p'), 'plan.source_ref.url', 'scheme ftp'],
      [urlPlan('qcow2', 'https://user:pw@127.0.0.1/x.qcow2', 'p'), 'plan.source_ref.url', 'must not carry credentials'],
      [urlPlan('qcow2', 'smb://127.0.0.1/x.qcow2', 'p'), 'plan.source_ref.url', 'must name a share and a file in it'],
      [urlPlan('qcow2', 'smb://127.0.0.1/share/x.qcow2?a=1', 'p'), 'plan.source_ref.url', 'without a query'],
      [urlPlan('vbox_folder', `${web.base}/x/x.vbox`, 'p'), 'plan.source.Offline', 'must be in the import root'],
      [urlPlan('ovf_folder', `${web.base}/x/x.ova`, 'p'), 'plan.source_ref.url', 'the URL of its .ovf descriptor'],
      [urlPlan('qcow2', `${web.base}/x.qcow2`, 'p', { tls: { thumbprint: 'zz' } }), 'plan.source_ref.tls.thumbprint', 'SHA-256'],
    ]
    for (const [plan, field, why] of cases) {
      const s = await call(srv.base, 'POST', '/migrations', { plan })
      expect([s.status, s.body.error.code]).toEqual([400, 'E_MIG_INVALID_PLAN'])
      const issue = s.body.error.details.issues.find((i: { path: string }) => i.path === field)
      expect(issue?.message ?? JSON.stringify(s.body.error.details.issues)).toContain(why)
    }
  }, 60_000)

  test('kill -9 of the worker half-way: the retried job resumes from its watermark with ranged reads and completes bit-exact', async () => {
    const plan = urlPlan('qcow2', url(files.big!), 'wkill')
    const { job, done, durable, servedAtKill } = await killWorkerHalfway(srv.base, t.dir, plan, () => requestsOf(files.big!).length)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(rawSha256(files.big!, 'qcow2', scratch))
    // the restarted worker read at most the data above the durable watermark plus one flush
    // interval, from the source and as nginx served it (plus the image's tables); from zero it
    // would read all 160 MiB
    const servedAfter = requestsOf(files.big!)
      .slice(servedAtKill)
      .reduce((s, r) => s + r.bytes, 0)
    expectResumedFromWatermark(done, durable, servedAfter, { data: BIG_DATA, flush: FLUSH, slack: 2 * MiB })
  }, 120_000)

  test('the object replaced on the server mid-copy: the job fails E_MIG_DISK_READ_FAILED, never a mixed disk', async () => {
    const f = path.join(www, 'swap.qcow2')
    stageReplacement(f, files.big!, path.join(scratch, 'big.raw'))
    // nginx's validators are the file's size and modification second: a version of the same size
    // written in the same second is the same object to HTTP, so the new one is a minute newer
    const later = new Date(Date.now() + 60_000)
    utimesSync(`${f}.new`, later, later)
    const job = await submit(srv.base, urlPlan('qcow2', url(f), 'swap'))
    const done = await replaceMidCopy(srv.base, job.id, f)
    expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_DISK_READ_FAILED'])
    expect(done.last_error.message).toContain('the object changed on the server since the copy began')
  }, 120_000)
})
