/**
 * The warm spare worker (runtime/supervisor.ts). A server forks one job worker ahead of
 * any job; the next job runs in that process (its pid is the spare's), a new spare is forked when
 * the job's worker ends, and no spare outlives its server (SIGTERM or SIGKILL).
 * `MIGRATOR_WARM_WORKER=0` forks each worker when its job starts and keeps no spare.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { offlinePlan, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const t = tempDir('mig-i15-warm-')
const importRoot = path.join(t.dir, 'imports')
const PREFIX = 'i15-warm-'
const servers: RunningServer[] = []

/** Pids of the spare workers (`--spare` on their command line) that server `pid` forked. */
function sparesOf(pid: number): number[] {
  const out = execFileSync('sh', ['-c', `pgrep -P ${pid} -f 'worker.* --spare' || true`], { encoding: 'utf8' }).trim()
  return out ? out.split('\n').map(Number) : []
}

/** Waits up to 15 s until `f()` is true. */
async function until(f: () => boolean): Promise<void> {
  for (const end = Date.now() + 15_000; !f() && Date.now() < end; ) await new Promise((r) => setTimeout(r, 50))
}

/** The supervisor's `worker started` log line of `jobId` (info level). */
function workerStarted(srv: RunningServer, jobId: string): { pid: number; spare: boolean } {
  for (const line of srv.stdout().split('\n')) {
    if (!line.includes(jobId) || !line.includes('worker started')) continue
    const o = JSON.parse(line)
    if (o.job === jobId) return { pid: o.pid, spare: o.spare }
  }
  throw new Error(`no 'worker started' line for ${jobId}`)
}

const alive = (pid: number) => existsSync(`/proc/${pid}`)

beforeAll(async () => {
  await ensureLibvirt()
  mkdirSync(importRoot, { recursive: true })
  chmodSync(t.dir, 0o755)
  const raw = path.join(t.dir, 'd.raw')
  writeFileSync(raw, Buffer.alloc(4 << 20, 0x3c))
  execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'qcow2', raw, path.join(importRoot, 'w.qcow2')])
}, 60_000)

afterAll(async () => {
  for (const s of servers) await s.stop()
  await cleanupDomains(PREFIX)
  t.cleanup()
}, 60_000)

test('the job runs in the spare forked at server start; a new spare follows; none outlives a SIGTERMed server', async () => {
  const srv = await startServer('bun', path.join(t.dir, 'on'), { MIGRATOR_IMPORT_ROOT: importRoot, MIGRATOR_LOG_LEVEL: 'info' })
  servers.push(srv)
  const server = srv.child.pid!
  await until(() => sparesOf(server).length === 1)
  const [spare] = sparesOf(server)
  expect(spare).toBeGreaterThan(0)
  const job = await submit(srv.base, offlinePlan('qcow2', 'w.qcow2', { name: `${PREFIX}1`, start: false }))
  const done = await waitJob(srv.base, job.id)
  expect([done.state, done.last_error]).toEqual(['Completed', null])
  expect(workerStarted(srv, job.id)).toEqual({ pid: spare!, spare: true })
  // The job's worker (the former spare) ends; a new spare takes its place.
  await until(() => !alive(spare!) && sparesOf(server).length === 1)
  expect(alive(spare!)).toBe(false)
  const next = sparesOf(server)
  expect(next.length).toBe(1)
  expect(next[0]).not.toBe(spare)
  await srv.stop()
  await until(() => !alive(next[0]!))
  expect(alive(next[0]!)).toBe(false)
}, 120_000)

test('a SIGKILLed server: its spare ends on its own (the IPC channel is gone)', async () => {
  const srv = await startServer('bun', path.join(t.dir, 'kill'), { MIGRATOR_IMPORT_ROOT: importRoot })
  servers.push(srv)
  await until(() => sparesOf(srv.child.pid!).length === 1)
  const [spare] = sparesOf(srv.child.pid!)
  expect(spare).toBeGreaterThan(0)
  srv.child.kill('SIGKILL')
  await until(() => !alive(spare!))
  expect(alive(spare!)).toBe(false)
}, 60_000)

test('MIGRATOR_WARM_WORKER=0: no spare; the job forks its own worker', async () => {
  const srv = await startServer('bun', path.join(t.dir, 'off'), { MIGRATOR_IMPORT_ROOT: importRoot, MIGRATOR_LOG_LEVEL: 'info', MIGRATOR_WARM_WORKER: '0' })
  servers.push(srv)
  await new Promise((r) => setTimeout(r, 1000))
  expect(sparesOf(srv.child.pid!)).toEqual([])
  const job = await submit(srv.base, offlinePlan('qcow2', 'w.qcow2', { name: `${PREFIX}2`, start: false }))
  const done = await waitJob(srv.base, job.id)
  expect([done.state, done.last_error]).toEqual(['Completed', null])
  expect(workerStarted(srv, job.id).spare).toBe(false)
  await new Promise((r) => setTimeout(r, 500))
  expect(sparesOf(srv.child.pid!)).toEqual([])
}, 60_000)
