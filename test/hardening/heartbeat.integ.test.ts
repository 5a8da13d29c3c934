/**
 * Worker heartbeats: a worker that stops heart-beating (SIGSTOP: alive but silent) is killed after
 * `MIGRATOR_HEARTBEAT_TIMEOUT_SECONDS` and its job retried by a new worker, which completes it.
 */
import { beforeAll, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { offlinePlan, submit, waitJob, workerPid } from '../helpers/jobs.ts'
import { serverSuite } from '../helpers/server-suite.ts'

// 4 MiB/s: the 24 MiB copy lasts about 6 s, long enough to stop the worker in the middle.
const { t, srv: server } = serverSuite({
  prefix: 'i12-hb',
  tmpPrefix: 'mig-i12-hb-',
  env: { MIGRATOR_HEARTBEAT_TIMEOUT_SECONDS: '3', MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(4 << 20), MIGRATOR_FLUSH_EVERY_BYTES: String(4 << 20) },
})

beforeAll(() => {
  mkdirSync(path.join(t.dir, 'imports'), { recursive: true })
  const raw = path.join(t.dir, 'd.raw')
  writeFileSync(raw, Buffer.alloc(24 << 20, 0x5a))
  execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'qcow2', raw, path.join(t.dir, 'imports', 'hb.qcow2')])
}, 60_000)

test('a silent (SIGSTOPped) worker is killed after the heartbeat timeout and the job completes on a retry', async () => {
  const job = await submit(server.base, offlinePlan('qcow2', 'hb.qcow2', { name: 'i12-hb', start: false }))
  await waitJob(server.base, job.id, (j) => j.state === 'CopyingFull' && j.progress.bytes_done > 0, 60_000)
  const pid = workerPid(t.dir, job.id)
  expect(pid).not.toBeNull()
  process.kill(pid!, 'SIGSTOP')
  const t0 = Date.now()
  // The stopped worker disappears (SIGKILL) within the timeout plus the supervisor's check interval.
  while (existsSync(`/proc/${pid}`) && Date.now() - t0 < 20_000) await new Promise((r) => setTimeout(r, 100))
  expect(existsSync(`/proc/${pid}`)).toBe(false)
  expect(Date.now() - t0).toBeGreaterThanOrEqual(2_500)
  const done = await waitJob(server.base, job.id, undefined, 120_000)
  expect([done.state, done.last_error]).toEqual(['Completed', null])
  expect(server.stdout() + server.stderr()).toContain('stopped heart-beating')
}, 200_000)
