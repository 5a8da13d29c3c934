/**
 * The backup API client against HostBackupApiTestDouble (test/helpers/backup-double.ts): a local
 * HTTPS server (self-signed certificate generated for the test with openssl) implementing the two
 * host endpoints of spec 4. The real host daemon cannot run on this machine, hence the double.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { BackupClient } from '../../lib/backup/client.ts'
import { HostBackupApiTestDouble } from '../helpers/backup-double.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const t = tempDir('mig-backup-')
const JOB = '3f2b1c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d'
const FAILING_JOB = '3f2b1c4d-5e6f-4a7b-8c9d-000000000bad'
const SILENT_JOB = '3f2b1c4d-5e6f-4a7b-8c9d-000000000000'

let api: HostBackupApiTestDouble
let certPem = ''
let fingerprint = ''
beforeAll(async () => {
  api = await HostBackupApiTestDouble.start({ dir: t.dir })
  api.setJob(JOB, 'ok')
  api.setJob(FAILING_JOB, 'fail')
  api.setJob(SILENT_JOB, 'silent')
  certPem = api.certPem
  fingerprint = api.fingerprint256
})
afterAll(async () => {
  await api.stop()
  t.cleanup()
})

const client = (over: Partial<ConstructorParameters<typeof BackupClient>[0]> = {}) =>
  new BackupClient({ baseUrl: api.url, username: 'backup', password: 's3cret', tls: { ca_pem: certPem }, timeoutMs: 5000, ...over })

describe('backup API client (spec 4, 5.2)', () => {
  test('run a job, wait for its restore point (trusted by CA)', async () => {
    const c = client()
    const runId = await c.runJob(JOB)
    expect(runId).toMatch(/^run-\d+$/)
    const point = await c.waitForRestorePoint(runId, { pollMs: 50, timeoutMs: 5000, requireQuiesced: true })
    expect(point).toMatchObject({ run_id: runId, job_id: JOB, quiesced: true })
    expect((await c.listRestorePoints()).map((p) => p.id)).toContain(point.id)
    await c.close()
  })

  test('pinned SHA-256 fingerprint of a self-signed certificate, and the insecure flag', async () => {
    const pinned = client({ tls: { fingerprint256: fingerprint } })
    expect(Array.isArray(await pinned.listRestorePoints())).toBe(true)
    await pinned.close()
    const wrongPin = client({ tls: { fingerprint256: 'AA:'.repeat(31) + 'AA' } })
    const e = await thrown(() => wrongPin.listRestorePoints())
    expect(e.code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(e.message).toContain('does not match the pinned')
    await wrongPin.close()
    const insecure = client({ tls: { insecure: true } })
    expect(Array.isArray(await insecure.listRestorePoints())).toBe(true)
    await insecure.close()
  })

  test('untrusted certificate without the insecure flag: E_MIG_SOURCE_UNREACHABLE', async () => {
    const c = client({ tls: {} })
    const e = await thrown(() => c.runJob(JOB))
    expect(e.code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(e.message).toMatch(/self[- ]signed|certificate/i)
    await c.close()
  })

  test('wrong credentials: E_MIG_AUTH_FAILED; unknown job: E_MIG_NOT_FOUND; bad id: E_MIG_BAD_REQUEST', async () => {
    const bad = client({ password: 'nope' })
    expect((await thrown(() => bad.runJob(JOB))).code).toBe('E_MIG_AUTH_FAILED')
    await bad.close()
    const c = client()
    expect((await thrown(() => c.runJob('ffffffff-ffff-4fff-8fff-ffffffffffff'))).code).toBe('E_MIG_NOT_FOUND')
    expect((await thrown(() => c.runJob('../../etc'))).code).toBe('E_MIG_BAD_REQUEST')
    await c.close()
  })

  test('a run that fails, and a restore point that never appears: E_MIG_SNAPSHOT_FAILED', async () => {
    const c = client()
    const failed = await thrown(() => c.runJob(FAILING_JOB))
    expect(failed.code).toBe('E_MIG_SNAPSHOT_FAILED')
    expect(failed.message).toContain('storage offline')
    const runId = await c.runJob(SILENT_JOB)
    const never = await thrown(() => c.waitForRestorePoint(runId, { pollMs: 50, timeoutMs: 400 }))
    expect(never.code).toBe('E_MIG_SNAPSHOT_FAILED')
    expect(never.message).toContain(`run ${runId} registered no restore point`)
    await c.close()
  })

  test('nothing listening: E_MIG_SOURCE_UNREACHABLE', async () => {
    const c = new BackupClient({ baseUrl: 'https://127.0.0.1:1', username: 'u', password: 'p', timeoutMs: 2000 })
    expect((await thrown(() => c.listRestorePoints())).code).toBe('E_MIG_SOURCE_UNREACHABLE')
    await c.close()
  })
})
