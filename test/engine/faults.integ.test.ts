/**
 * Fault tests of the job engine through the HTTP API: the worker killed with SIGKILL
 * half-way, the server killed with SIGKILL, cancellation mid-copy, a full destination file
 * system, and 20 jobs submitted at once under the concurrency limit of 2.
 *
 * Copies are slowed with the bandwidth cap `MIGRATOR_COPY_MAX_BYTES_PER_SECOND` and checkpointed
 * every 16 MiB (`MIGRATOR_FLUSH_EVERY_BYTES`) so "half-way" is a moment a test can hit. Plans use
 * `start: false` (define the domain, do not boot it): booting is covered in import-kinds.test.ts.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, copyFileSync, existsSync, mkdirSync, readdirSync, readlinkSync, statfsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { buildInput, fileSha256 } from '../helpers/inputs.ts'
import { call, offlinePlan, openStream, submit, volumePath, waitJob, workerPid } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, tearDownJobs } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { dataDirOnExt4 } from '../helpers/small-fs.ts'
import { tempDir } from '../helpers/tmp.ts'
import { randomImage } from '../helpers/random-image.ts'

const PREFIX = 'migflt-'
const MiB = 1024 * 1024
const SLOW = { MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(48 * MiB), MIGRATOR_FLUSH_EVERY_BYTES: String(16 * MiB), MIGRATOR_DOMAIN_TYPE: 'qemu' }

/** Pids of qemu-nbd (or, with `tool`, another qemu program such as qemu-img) processes holding an image under `dir` open. */
function qemuNbdServing(dir: string, tool = 'qemu-nbd'): number[] {
  // qemu reads its input through a descriptor (/dev/fd/3, /proc/<pid>/fd/N): match by open files.
  let pids: number[]
  try {
    pids = execFileSync('pgrep', ['-x', tool.split(' ')[0]!], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .filter(Boolean)
      .map(Number)
  } catch {
    return []
  }
  return pids.filter((pid) => {
    try {
      return readdirSync(`/proc/${pid}/fd`).some((fd) => {
        try {
          return readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith(dir)
        } catch {
          return false
        }
      })
    } catch {
      return false
    }
  })
}

/** Socket directories of qemu-nbd servers started by process `pid` (lib/pipeline/qemu-nbd.ts). */
function nbdSocketDirsOf(pid: number): string[] {
  return readdirSync(tmpdir()).filter((n) => n.startsWith(`mig-nbd-${pid}-`))
}

/** Bytes of data in big.raw (its first bytes; the rest is a hole). */
const BIG_DATA = 192 * MiB
/** The flush interval of {@link SLOW}. */
const FLUSH = 16 * MiB

describe('engine faults (real server, worker processes, file sink)', () => {
  const t = tempDir('mig-faults-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let raw = ''

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    raw = randomImage(path.join(t.dir, 'big.raw'), 320 * MiB, BIG_DATA)
    buildInput('qcow2', importRoot, 'big', [raw])
    mkdirSync(path.join(importRoot, 'bigc'))
    execFileSync('qemu-img', ['convert', '-c', '-f', 'raw', '-O', 'qcow2', raw, path.join(importRoot, 'bigc', 'bigc.qcow2')])
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', path.join(t.dir), SLOW)
  }, 120_000)

  afterAll(() => tearDownJobs(PREFIX, t, srv))

  // qcow2: read by its clusters, copied by the node engine (no child process serves it);
  // compressed qcow2: served by qemu-nbd, copied by the qemu-img engine.
  for (const [name, input, served] of [
    ['qcow2', 'big/big.qcow2', false],
    ['compressed qcow2', 'bigc/bigc.qcow2', true],
  ] as const)
    test(`kill -9 of the worker half-way (${name}): the job is retried, resumes from its watermark and completes bit-exact`, async () => {
      const stream = openStream(srv.base)
      await stream.ready
      const job = await submit(srv.base, offlinePlan('qcow2', input, { name: `${PREFIX}wkill-${served ? 'nbd' : 'clusters'}`, start: false }))
      const half = await waitJob(srv.base, job.id, (j) => j.progress.bytes_done >= j.progress.bytes_total / 2 && j.progress.bytes_total > 0, 60_000)
      const durable = half.progress.disks[0].watermark
      expect(durable).toBeGreaterThan(0)
      const pid = workerPid(t.dir, job.id)
      expect(pid).not.toBeNull()
      const dir = path.join(importRoot, path.dirname(input))
      expect(qemuNbdServing(dir).length > 0).toBe(served)
      expect(nbdSocketDirsOf(pid!).length > 0).toBe(served)
      const killedAt = stream.events.length
      process.kill(pid!, 'SIGKILL')
      const done = await waitJob(srv.base, job.id)
      stream.close()
      expect(done.state).toBe('Completed')
      expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(fileSha256(raw))
      // Nothing below the durable watermark was read again: the restarted worker's bytes read from
      // the source (progress.disks[].bytes_read, counted per attempt) are at most the data above the
      // watermark plus one flush interval. A copy restarting from zero would read all 192 MiB.
      const after = stream.events.slice(killedAt).filter((e) => e.data.id === job.id && e.event === 'progress')
      expect(after.length).toBeGreaterThan(0)
      const readAfter = done.progress.disks[0].bytes_read
      expect(readAfter).toBeGreaterThan(0)
      expect(readAfter).toBeLessThanOrEqual(BIG_DATA - durable + FLUSH)
      expect(BIG_DATA - durable + FLUSH).toBeLessThan(BIG_DATA)
      // The killed worker's qemu-nbd and qemu-img went with it (the supervisor ends the dead worker's process group).
      expect(qemuNbdServing(dir)).toEqual([])
      // ... and its socket directory too.
      expect(nbdSocketDirsOf(pid!)).toEqual([])
      expect(qemuNbdServing(dir, 'qemu-img convert')).toEqual([])
    }, 120_000)

  test('cancel mid-copy: 202, the job ends Cancelled with E_MIG_CANCELLED and its destination files are gone', async () => {
    const job = await submit(srv.base, offlinePlan('qcow2', 'big/big.qcow2', { name: `${PREFIX}cancel`, start: false }))
    await waitJob(srv.base, job.id, (j) => j.progress.bytes_done > 32 * MiB, 60_000)
    expect(existsSync(path.join(t.dir, 'volumes', 'migrations', job.id))).toBe(true)
    const c = await call(srv.base, 'POST', `/migrations/${job.id}/cancel`)
    expect(c.status).toBe(202)
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error.code]).toEqual(['Cancelled', 'E_MIG_CANCELLED'])
    expect(existsSync(path.join(t.dir, 'volumes', 'migrations', job.id))).toBe(false)
    // The worker exits right after reporting the terminal state (give it a moment on a loaded machine).
    for (let i = 0; i < 50 && workerPid(t.dir, job.id) !== null; i++) await new Promise((r) => setTimeout(r, 100))
    expect(workerPid(t.dir, job.id)).toBeNull()
    expect(qemuNbdServing(path.join(importRoot, 'big'), 'qemu-img convert')).toEqual([])
  }, 120_000)

  test('20 jobs submitted at once with the limit of 2 all complete, never more than 2 running', async () => {
    // 24 MiB of data at the 48 MiB/s cap: each copy takes about half a second, longer than a
    // worker's start, so two jobs overlap whichever of them gets the warm spare.
    const small = randomImage(path.join(t.dir, 'small.raw'), 32 * MiB, 24 * MiB)
    const first = buildInput('qcow2', importRoot, 'many', [small])
    for (let i = 1; i < 20; i++) copyFileSync(first.path, path.join(importRoot, 'many', `many-${i}.qcow2`))
    const stream = openStream(srv.base)
    await stream.ready
    const jobs = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        submit(srv.base, offlinePlan('qcow2', i ? `many/many-${i}.qcow2` : 'many/many.qcow2', { name: `${PREFIX}many-${i}`, start: false })),
      ),
    )
    const done = await Promise.all(jobs.map((j) => waitJob(srv.base, j.id, undefined, 110_000)))
    stream.close()
    expect(done.map((j) => j.state)).toEqual(Array(20).fill('Completed'))
    for (const j of done) expect(fileSha256(volumePath(t.dir, j.id, j.progress.disks[0].label))).toBe(fileSha256(small))
    const ids = new Set(jobs.map((j) => j.id))
    const running = new Set<string>()
    let peak = 0
    for (const e of stream.events) {
      if (e.event !== 'migration' || !ids.has(e.data.id)) continue
      if (e.data.status === 'running') running.add(e.data.id)
      else running.delete(e.data.id)
      peak = Math.max(peak, running.size)
    }
    expect(peak).toBe(2)
  }, 120_000)

  test('a destination too small for the disks (8 MiB ext4 on a loop device) refuses the job before the copy, E_MIG_DISK_WRITE_FAILED', async () => {
    const { dir: d, unmount } = dataDirOnExt4(t.dir, 'small', 8 * MiB)
    const s2 = await startServer('bun', d, { ...SLOW, MIGRATOR_IMPORT_ROOT: importRoot })
    try {
      const job = await submit(s2.base, offlinePlan('qcow2', 'big/big.qcow2', { name: `${PREFIX}small`, start: false }))
      const done = await waitJob(s2.base, job.id)
      expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_DISK_WRITE_FAILED'])
      // Paths in messages are relative to the data dir (no absolute server paths).
      expect(done.last_error.message).toContain('not enough space for the disks under <data dir>/volumes')
      expect(existsSync(path.join(d, 'volumes', 'migrations', job.id))).toBe(false)
    } finally {
      await s2.stop()
      unmount()
    }
  }, 120_000)

  test('a destination that fills up during the copy (ext4 on a loop device, filled by another writer) fails the job with E_MIG_DISK_WRITE_FAILED naming the volume and offset', async () => {
    // Room for the 320 MiB disk when the job starts (no blocks reserved for root: the worker is root).
    const { dir: d, unmount } = dataDirOnExt4(t.dir, 'full', 400 * MiB, ['-m', '0'])
    // The copy waits for space (lib/pipeline/space-wait.ts) 2 s here before it fails.
    const s2 = await startServer('bun', d, { ...SLOW, MIGRATOR_IMPORT_ROOT: importRoot, MIGRATOR_SPACE_WAIT_SECONDS: '2' })
    try {
      const job = await submit(s2.base, offlinePlan('qcow2', 'big/big.qcow2', { name: `${PREFIX}full`, start: false }))
      await waitJob(s2.base, job.id, (j) => j.state === 'CopyingFull' || (j.status !== 'running' && j.status !== 'queued'), 60_000)
      // Another writer takes every free block while the copy runs (SLOW caps it at 48 MiB/s, and
      // 192 MiB of data are to be written); ext4 keeps what fallocate got when it hits ENOSPC.
      const volumes = path.join(d, 'volumes')
      const st = statfsSync(volumes)
      try {
        execFileSync('fallocate', ['-l', String(Number(st.bfree) * Number(st.bsize)), path.join(volumes, 'filler')], { stdio: 'ignore' })
      } catch {}
      const after = statfsSync(volumes)
      expect(Number(after.bfree) * Number(after.bsize)).toBeLessThan(8 * MiB)
      const done = await waitJob(s2.base, job.id)
      expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_DISK_WRITE_FAILED'])
      expect(done.last_error.message).toMatch(/volumes\/migrations\/[0-9a-f-]{36}\/\S+\.img/)
      expect(done.last_error.message).toMatch(/offset \d+/)
      expect(done.last_error.message).toMatch(/ENOSPC|no space/i)
    } finally {
      await s2.stop()
      unmount()
    }
  }, 120_000)

  test('a truncated source (a qcow2 cut short, which qemu would read as zeros) fails the job with E_MIG_DISK_READ_FAILED naming the disk', async () => {
    const cut = path.join(importRoot, 'cut', 'cut.qcow2')
    mkdirSync(path.dirname(cut), { recursive: true })
    copyFileSync(path.join(importRoot, 'big', 'big.qcow2'), cut)
    execFileSync('truncate', ['-s', String(64 * MiB), cut])
    const job = await submit(srv.base, offlinePlan('qcow2', 'cut/cut.qcow2', { name: `${PREFIX}cut`, start: false }))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_DISK_READ_FAILED'])
    expect(done.last_error.message).toContain('cut.qcow2')
    // The cluster reader's check at open (qemu-img check's refusal for images left to qemu-nbd).
    expect(done.last_error.message).toMatch(/cluster \d+ at file offset \d+ .*beyond the end of the file .*truncated/)
    expect(done.progress.bytes_done).toBe(0)
  }, 120_000)

  test('kill -9 of the server: a new server resumes the job once its lease expired, from its watermark, bit-exact', async () => {
    const d = path.join(t.dir, 'srvkill')
    mkdirSync(d, { recursive: true })
    chmodSync(d, 0o755)
    const env = { ...SLOW, MIGRATOR_IMPORT_ROOT: importRoot, MIGRATOR_LEASE_SECONDS: '2' }
    // The first server copies at 12 MiB/s: the second half of the data takes 8 s, far longer than
    // a loaded host may take between the half-way poll and the kill (at SLOW's 48 MiB/s, 2 s were
    // not enough: the copy ended before the kill and the second server had nothing to read).
    const s1 = await startServer('bun', d, { ...env, MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(12 * MiB) })
    const job = await submit(s1.base, offlinePlan('qcow2', 'big/big.qcow2', { name: `${PREFIX}skill`, start: false }))
    const half = await waitJob(s1.base, job.id, (j) => j.progress.bytes_done >= j.progress.bytes_total / 2 && j.progress.bytes_total > 0, 60_000)
    const durable = half.progress.disks[0].watermark
    expect(durable).toBeGreaterThan(0)
    s1.child.kill('SIGKILL')
    await new Promise((r) => s1.child.once('exit', r))
    // The worker notices its supervisor is gone (IPC disconnect) and ends with its process group.
    for (let i = 0; i < 50 && workerPid(d, job.id) !== null; i++) await new Promise((r) => setTimeout(r, 100))
    expect(workerPid(d, job.id)).toBeNull()
    // The second server copies slower, so the rest of the copy outlasts its start and the
    // opening of the event stream on a loaded host (else the job may end before either).
    const s2 = await startServer('bun', d, { ...env, MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(8 * MiB) })
    try {
      const stream = openStream(s2.base)
      await stream.ready
      const done = await waitJob(s2.base, job.id)
      stream.close()
      expect(done.state).toBe('Completed')
      expect(fileSha256(volumePath(d, job.id, done.progress.disks[0].label))).toBe(fileSha256(raw))
      const progress = stream.events.filter((e) => e.data.id === job.id && e.event === 'progress')
      expect(progress.length).toBeGreaterThan(0)
      expect(Math.min(...progress.map((e) => e.data.progress.bytes_done))).toBeGreaterThanOrEqual(durable)
      // The new server's worker read at most the data above the watermark plus one flush interval.
      expect(done.progress.disks[0].bytes_read).toBeGreaterThan(0)
      expect(done.progress.disks[0].bytes_read).toBeLessThanOrEqual(BIG_DATA - durable + FLUSH)
      expect(readdirSync(path.join(d, 'volumes', 'migrations', job.id))).toEqual([`${path.basename(volumePath(d, job.id, done.progress.disks[0].label))}`])
    } finally {
      await s2.stop()
    }
  }, 120_000)
})
