/**
 * Plan `restore_point` end to end through the HTTP API (spec 4 "Backup endpoints used by
 * operators", 5.2): the real server and worker, real libvirt + qemu (TCG), and the host backup API
 * played by HostBackupApiTestDouble (test/helpers/backup-double.ts: HTTPS with a self-signed
 * certificate generated for the test; the real host daemon cannot run here).
 *
 * - a plan with `restore_point` runs the backup job before the job writes anything: the double
 *   saw the run (and listed its restore point) before the job's `started_at` (set when it enters
 *   CopyingFull), the SSE stream shows the job carrying its `restore_point` while still Queued,
 *   and the job records `{backup_job_id, run_id, restore_point_id, quiesced, created_at}`;
 * - a backup that fails (500), a run that never registers its restore point within
 *   `MIGRATOR_BACKUP_TIMEOUT_SECONDS`, a restore point that is not quiesced when the plan requires
 *   it, and rejected backup credentials end the job Failed before CopyingFull with the exact code,
 *   no `restore_point`, no domain and no destination directory.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, existsSync, mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { HostBackupApiTestDouble } from '../helpers/backup-double.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { buildInput } from '../helpers/inputs.ts'
import { offlinePlan, openStream, streamSaw, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, tearDownJobs } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'migrp-'
const MARKER = 'MIGRATOR-RESTORE-POINT-4410'
const MiB = 1024 * 1024
const OK_JOB = '6a1d0c8e-1b2c-4d3e-8f40-0000000000a1'
const FAIL_JOB = '6a1d0c8e-1b2c-4d3e-8f40-0000000000b2'
const SILENT_JOB = '6a1d0c8e-1b2c-4d3e-8f40-0000000000c3'
const UNQUIESCED_JOB = '6a1d0c8e-1b2c-4d3e-8f40-0000000000d4'

describe('plan restore_point: the host backup runs before any destination write', () => {
  const t = tempDir('mig-rp-')
  const importRoot = path.join(t.dir, 'imports')
  let double: HostBackupApiTestDouble
  let srv: RunningServer
  let badCreds: RunningServer | null = null
  let rel = ''

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    mkdirSync(path.join(t.dir, 'tls'))
    double = await HostBackupApiTestDouble.start({ dir: path.join(t.dir, 'tls'), user: 'hostadmin', password: 'B4ckup!pw', delayMs: 300 })
    double.setJob(OK_JOB, 'ok')
    double.setJob(FAIL_JOB, 'fail')
    double.setJob(SILENT_JOB, 'silent')
    double.setJob(UNQUIESCED_JOB, 'unquiesced')
    const boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 16 * MiB).path
    rel = path.relative(importRoot, buildInput('qcow2', importRoot, 'rp-in', [boot]).path)
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    const common = {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: '30',
      MIGRATOR_BOOT_SERIAL_PATTERN: MARKER,
      MIGRATOR_BACKUP_URL: double.url,
    }
    srv = await startServer('bun', t.dir, {
      ...common,
      MIGRATOR_BACKUP_USER: 'hostadmin',
      MIGRATOR_BACKUP_PASSWORD: 'B4ckup!pw',
      MIGRATOR_BACKUP_CA_FILE: double.certFile,
      MIGRATOR_BACKUP_TIMEOUT_SECONDS: '2',
    })
  }, 60_000)

  afterAll(() => tearDownJobs(PREFIX, t, srv, badCreds, double))

  const volumesOf = (dataDir: string, jobId: string) => path.join(dataDir, 'volumes', 'migrations', jobId)

  test('the backup runs first, its restore point is recorded on the job, then the job completes', async () => {
    const stream = openStream(srv.base)
    await stream.ready
    const runsBefore = double.runs.length
    const job = await submit(srv.base, offlinePlan('qcow2', rel, { name: `${PREFIX}ok`, restore_point: { backup_job_id: OK_JOB, require_quiesced: true } }))
    const done = await waitJob(srv.base, job.id, undefined, 90_000)
    await streamSaw(stream, job.id, 'Completed')
    stream.close()
    expect(done.state).toBe('Completed')
    expect(done.last_error).toBeNull()

    const runs = double.runs.slice(runsBefore)
    expect(runs).toHaveLength(1)
    expect(runs[0]!.job_id).toBe(OK_JOB)
    const point = double.points.find((p) => p.run_id === runs[0]!.run_id)!
    expect(point).toBeDefined()
    expect(done.restore_point).toEqual({
      backup_job_id: OK_JOB,
      run_id: runs[0]!.run_id,
      restore_point_id: point.id,
      quiesced: true,
      created_at: point.created_at,
    })
    // The run, and the registration of its restore point, happened before the job entered CopyingFull.
    expect(runs[0]!.at).toBeLessThan(Date.parse(done.started_at))
    expect(Date.parse(point.created_at)).toBeLessThanOrEqual(Date.parse(done.started_at))

    // On the stream: the job carried its restore point while still Queued, before CopyingFull.
    const mine = stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id)
    const recorded = mine.findIndex((e) => e.data.restore_point !== null)
    const copying = mine.findIndex((e) => e.data.state === 'CopyingFull')
    expect(recorded).toBeGreaterThanOrEqual(0)
    expect(mine[recorded]!.data.state).toBe('Queued')
    expect(copying).toBeGreaterThan(recorded)
    expect(mine.at(-1)!.data.state).toBe('Completed')
    expect(done.progress.bytes_done).toBe(16 * MiB)
    expect(existsSync(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(true)
  }, 100_000)

  async function expectStoppedBeforeWrites(dataDir: string, base: string, plan: Record<string, unknown>): Promise<any> {
    const stream = openStream(base)
    await stream.ready
    const job = await submit(base, plan)
    const done = await waitJob(base, job.id, undefined, 30_000)
    await streamSaw(stream, job.id, 'Failed') // the event may arrive just after the GET saw the state
    stream.close()
    expect(done.state).toBe('Failed')
    expect(done.restore_point).toBeNull()
    expect(done.started_at).toBeNull()
    expect(done.domain).toBeNull()
    expect(done.progress.bytes_done).toBe(0)
    expect(existsSync(volumesOf(dataDir, job.id))).toBe(false)
    const states = stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id).map((e) => e.data.state)
    expect(states).not.toContain('CopyingFull')
    expect(states.at(-1)).toBe('Failed')
    return done
  }

  test('a backup run that fails (HTTP 500): Failed E_MIG_SNAPSHOT_FAILED before any write', async () => {
    const runsBefore = double.runs.length
    const done = await expectStoppedBeforeWrites(
      t.dir,
      srv.base,
      offlinePlan('qcow2', rel, { name: `${PREFIX}fail`, restore_point: { backup_job_id: FAIL_JOB } }),
    )
    expect(done.last_error.code).toBe('E_MIG_SNAPSHOT_FAILED')
    expect(done.last_error.fatal).toBe(true)
    expect(done.last_error.message).toContain(`run backup job ${FAIL_JOB}`)
    expect(done.last_error.message).toContain('HTTP 500')
    expect(done.last_error.message).toContain('storage offline')
    expect(double.runs.slice(runsBefore).map((r) => r.job_id)).toEqual([FAIL_JOB])
  }, 40_000)

  test('a run that never registers its restore point within MIGRATOR_BACKUP_TIMEOUT_SECONDS: Failed E_MIG_SNAPSHOT_FAILED', async () => {
    const started = Date.now()
    const done = await expectStoppedBeforeWrites(
      t.dir,
      srv.base,
      offlinePlan('qcow2', rel, { name: `${PREFIX}silent`, restore_point: { backup_job_id: SILENT_JOB } }),
    )
    expect(done.last_error.code).toBe('E_MIG_SNAPSHOT_FAILED')
    expect(done.last_error.message).toMatch(/backup run run-\d+ registered no restore point within 2 s/)
    expect(Date.now() - started).toBeGreaterThanOrEqual(2000)
  }, 40_000)

  test('require_quiesced with a restore point that is not quiesced: Failed E_MIG_SNAPSHOT_FAILED', async () => {
    const done = await expectStoppedBeforeWrites(
      t.dir,
      srv.base,
      offlinePlan('qcow2', rel, { name: `${PREFIX}unq`, restore_point: { backup_job_id: UNQUIESCED_JOB, require_quiesced: true } }),
    )
    expect(done.last_error.code).toBe('E_MIG_SNAPSHOT_FAILED')
    expect(done.last_error.message).toMatch(/restore point rp-\d+ of run run-\d+ is not quiesced/)
  }, 40_000)

  test('backup credentials rejected (server trusting the self-signed endpoint with MIGRATOR_BACKUP_INSECURE=1): Failed E_MIG_AUTH_FAILED', async () => {
    const dir2 = path.join(t.dir, 'second')
    mkdirSync(dir2)
    badCreds = await startServer('bun', dir2, {
      MIGRATOR_BACKUP_URL: double.url,
      MIGRATOR_BACKUP_USER: 'hostadmin',
      MIGRATOR_BACKUP_PASSWORD: 'wrong',
      MIGRATOR_BACKUP_INSECURE: '1',
      MIGRATOR_IMPORT_ROOT: importRoot,
    })
    const unauthorizedBefore = double.unauthorized
    const done = await expectStoppedBeforeWrites(
      dir2,
      badCreds.base,
      offlinePlan('qcow2', rel, { name: `${PREFIX}creds`, restore_point: { backup_job_id: OK_JOB } }),
    )
    expect(done.last_error.code).toBe('E_MIG_AUTH_FAILED')
    expect(done.last_error.message).toContain('credentials of hostadmin rejected (401)')
    expect(double.unauthorized).toBe(unauthorizedBefore + 1)
  }, 40_000)
})
