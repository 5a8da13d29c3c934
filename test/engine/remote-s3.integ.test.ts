/**
 * Remote offline inputs from S3 (`s3://bucket/key`, docs/remote-sources.md) against s3rver, an
 * S3-compatible server in Node (devDependency; Debian has no MinIO) started by the test on
 * 127.0.0.1 with a temp directory: SigV4-signed ranged reads (lib/remote/s3-object.ts) and a
 * missing key or bucket (404) named. s3rver checks neither SigV4 signatures nor, on GET, the
 * access key id: these tests do not prove the signature (aws4fetch's) nor the 403 mapping over
 * S3 (the same code as HTTP's 401/403, tested against nginx in test/remote/http-object.integ.test.ts).
 * Also an object replaced between two reads, and jobs
 * importing a qcow2 and a two-disk OVA bit-exact with a registered S3 credential.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { AwsClient } from 'aws4fetch'
import S3rver from 's3rver'
import { openS3Object } from '../../lib/remote/s3-object.ts'
import { buildInput, fileSha256, makeRawImage, rawSha256 } from '../helpers/inputs.ts'
import { execFileSync } from 'node:child_process'
import { call, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, tearDownJobs } from '../helpers/libvirt.ts'
import { freePort, startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const PREFIX = 'migs3-'
const MiB = 1024 * 1024
const KEYS = { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' } // s3rver's built-in account
const ACCESS = { kind: 's3' as const, ...KEYS }

describe('remote offline inputs from S3 (s3rver, server, workers, file sink)', () => {
  const t = tempDir('mig-s3-')
  const scratch = path.join(t.dir, 'scratch')
  let s3: S3rver
  let endpoint = ''
  let srv: RunningServer
  const files: Record<string, string> = {}
  const client = new AwsClient({ ...KEYS, service: 's3', region: 'us-east-1' })
  const put = async (key: string, body: Buffer) => {
    const r = await client.fetch(`${endpoint}/disks/${key}`, { method: 'PUT', body: new Uint8Array(body) })
    if (r.status !== 200) throw new Error(`PUT ${key}: ${r.status} ${await r.text()}`)
  }

  beforeAll(async () => {
    mkdirSync(scratch, { recursive: true })
    mkdirSync(path.join(t.dir, 'imports'))
    const port = await freePort()
    s3 = new S3rver({ address: '127.0.0.1', port, directory: path.join(t.dir, 's3'), silent: true, vhostBuckets: false, configureBuckets: [{ name: 'disks' }] })
    await s3.run()
    endpoint = `http://127.0.0.1:${port}`
    const raws = [makeRawImage(path.join(scratch, 'a.raw'), 48 * MiB, 3), makeRawImage(path.join(scratch, 'b.raw'), 32 * MiB, 4)]
    files.qcow2 = buildInput('qcow2', scratch, 'q', [raws[0]!]).path
    files.ova = buildInput('ova_archive', scratch, 'o', raws).path
    await put('q.qcow2', readFileSync(files.qcow2))
    await put('exports/o.ova', readFileSync(files.ova))
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir, { MIGRATOR_DOMAIN_TYPE: 'qemu' })
  }, 120_000)

  afterAll(() => tearDownJobs(PREFIX, t, srv, s3))

  test('signed ranged reads give the exact bytes; a missing key is E_MIG_NOT_FOUND naming it', async () => {
    const data = randomBytes(6 * MiB + 5)
    await put('blob.bin', data)
    const o = await openS3Object('s3://disks/blob.bin', { endpoint, access: ACCESS, http: { pieceBytes: MiB } })
    expect([o.name, o.size]).toEqual(['s3://disks/blob.bin', data.length])
    const out = Buffer.alloc(data.length)
    await Promise.all([o.read(out.subarray(0, 4 * MiB), 0), o.read(out.subarray(4 * MiB), 4 * MiB)])
    expect(out.equals(data)).toBe(true)
    o.close()
    const nf = await thrown(() => openS3Object('s3://disks/none.ova', { endpoint, access: ACCESS }))
    expect([nf.code, nf.message]).toEqual(['E_MIG_NOT_FOUND', 's3://disks/none.ova: HTTP 404: no such object on the server'])
    const nb = await thrown(() => openS3Object('s3://nobucket/x.ova', { endpoint, access: ACCESS }))
    expect(nb.code).toBe('E_MIG_NOT_FOUND')
  })

  // s3rver answers a PUT before its new file is whole, so a read right after may see the new
  // version's ETag or a part of it whose size differs: either is the change, told apart by its reason.
  test('the object replaced between two reads: E_MIG_DISK_READ_FAILED (its ETag or size changed)', async () => {
    await put('swap.bin', randomBytes(3 * MiB))
    const o = await openS3Object('s3://disks/swap.bin', { endpoint, access: ACCESS })
    await o.read(Buffer.alloc(MiB), MiB)
    await put('swap.bin', randomBytes(3 * MiB))
    const e = await thrown(() => o.read(Buffer.alloc(MiB), 2 * MiB))
    o.close()
    expect(e.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(e.message).toMatch(/^s3:\/\/disks\/swap\.bin: the object changed on the server since the copy began \((ETag|Content-Range) /)
  })

  test('jobs import a qcow2 and a two-disk OVA from s3:// with a registered S3 credential, bit-exact', async () => {
    const cred = await call(srv.base, 'POST', '/remote-credentials', {
      name: 's3',
      kind: 's3',
      access_key_id: KEYS.accessKeyId,
      secret_access_key: KEYS.secretAccessKey,
    })
    expect(cred.status).toBe(201)
    expect(cred.body.username).toBe(KEYS.accessKeyId)
    expect(JSON.stringify((await call(srv.base, 'GET', '/remote-credentials')).body)).not.toContain('secret')
    const ref = (key: string) => ({ kind: 'offline_url', url: `s3://disks/${key}`, credential_id: cred.body.id, s3: { endpoint } })
    const q = await submit(srv.base, { source: { Offline: 'qcow2' }, source_ref: ref('q.qcow2'), mode: 'Cold', name: `${PREFIX}q`, start: false })
    const o = await submit(srv.base, { source: { Offline: 'ova_archive' }, source_ref: ref('exports/o.ova'), mode: 'Cold', name: `${PREFIX}o`, start: false })
    const [qd, od] = [await waitJob(srv.base, q.id), await waitJob(srv.base, o.id)]
    expect([qd.state, qd.last_error, od.state, od.last_error]).toEqual(['Completed', null, 'Completed', null])
    expect(fileSha256(volumePath(t.dir, q.id, qd.progress.disks[0].label))).toBe(rawSha256(files.qcow2!, 'qcow2', scratch))
    const x = path.join(scratch, 'ova-x')
    mkdirSync(x)
    execFileSync('tar', ['-xf', files.ova!, '-C', x])
    for (const [i, d] of od.progress.disks.entries())
      expect(fileSha256(volumePath(t.dir, o.id, d.label))).toBe(rawSha256(path.join(x, `o-disk${i + 1}.vmdk`), 'vmdk', scratch))
    // inspect without copying, and a credential of the wrong kind refused at submission
    const i = await call(srv.base, 'POST', '/remote-files/inspect', { url: 's3://disks/exports/o.ova', credential_id: cred.body.id, s3: { endpoint } })
    expect([i.status, i.body.detected_kind, i.body.manifest?.disks.length]).toEqual([200, 'ova_archive', 2])
    const basic = await call(srv.base, 'POST', '/remote-credentials', { name: 'basic', kind: 'http_basic', username: 'u', password: 'p' })
    const wrong = await call(srv.base, 'POST', '/migrations', {
      plan: { source: { Offline: 'qcow2' }, source_ref: { ...ref('q.qcow2'), credential_id: basic.body.id }, mode: 'Cold' },
    })
    expect([wrong.status, wrong.body.error.code, wrong.body.error.details.issues[0].path]).toEqual([400, 'E_MIG_INVALID_PLAN', 'plan.source_ref.credential_id'])
  }, 120_000)
})
