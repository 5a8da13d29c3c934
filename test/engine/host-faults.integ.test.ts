/**
 * Faults a real host throws at a long migration (docs/reliability.md), each on real file
 * systems: small ext4 file systems on loop devices holding the whole data directory (store,
 * volumes, logs), filled by another process while a job copies; two jobs started together that
 * fit only one at a time. Plans use `start: false` (the domain is defined, not booted).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { Database } from 'bun:sqlite'
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { chmodSync, closeSync, copyFileSync, existsSync, mkdirSync, openSync, renameSync, rmSync, statfsSync, writeFileSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput, fileSha256 } from '../helpers/inputs.ts'
import { call, offlinePlan, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'
import { randomImage } from '../helpers/random-image.ts'

const PREFIX = 'mighf-'
const MiB = 1024 * 1024

/** `PRAGMA integrity_check` of the store of `dataDir` (read-only). */
function integrity(dataDir: string): string {
  const db = new Database(path.join(dataDir, 'migrator.db', 'migrator.sqlite'), { readonly: true })
  try {
    return String((db.query('PRAGMA integrity_check').get() as Record<string, unknown>).integrity_check)
  } finally {
    db.close()
  }
}

/** Takes every free block of the file system of `dir` with one file (`<dir>/filler`); returns its path. */
function fill(dir: string): string {
  const filler = path.join(dir, 'filler')
  const st = statfsSync(dir)
  try {
    execFileSync('fallocate', ['-l', String(Number(st.bavail) * Number(st.bsize)), filler], { stdio: 'ignore' })
  } catch {
    // ext4 keeps what fallocate got when it hits ENOSPC
  }
  return filler
}

describe('host faults (real server, worker processes, loop-device file systems)', () => {
  const t = tempDir('mig-hostflt-')
  const importRoot = path.join(t.dir, 'imports')
  const mounts: Array<{ dir: string; image: string }> = []
  const fuseMounts: string[] = []
  let raw = ''

  /** A data dir `<t.dir>/<name>` that is a fresh ext4 of `size` bytes on a loop device (unmounted in afterAll). */
  /**
   * Submits an offline job of `rel` (under the import root) named `<PREFIX><name>`, not started
   * after the copy, to `srv`; waits (60 s at most) until it has copied more than `bytes` or ended.
   */
  async function copying(srv: RunningServer, rel: string, name: string, bytes: number): Promise<any> {
    const job = await submit(srv.base, offlinePlan('qcow2', rel, { name: `${PREFIX}${name}`, start: false }))
    await waitJob(srv.base, job.id, (j) => (j.state === 'CopyingFull' && j.progress.bytes_done > bytes) || !['queued', 'running'].includes(j.status), 60_000)
    return job
  }

  function dataDirOnExt4(name: string, size: number): string {
    const d = path.join(t.dir, name)
    mkdirSync(d, { recursive: true })
    const image = path.join(t.dir, `${name}-ext4.img`)
    execFileSync('truncate', ['-s', String(size), image])
    execFileSync('mkfs.ext4', ['-q', '-m', '0', image])
    execFileSync('mount', ['-o', 'loop', image, d])
    mounts.push({ dir: d, image })
    chmodSync(d, 0o755)
    return d
  }

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    raw = randomImage(path.join(t.dir, 'disk.raw'), 128 * MiB, 96 * MiB)
    buildInput('qcow2', importRoot, 'disk', [raw])
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
  }, 120_000)

  afterAll(async () => {
    await cleanupDomains(PREFIX)
    for (const m of fuseMounts) spawnSync('fusermount3', ['-u', m])
    for (const m of mounts) {
      try {
        execFileSync('umount', [m.dir])
      } catch {
        execFileSync('umount', ['-l', m.dir])
      }
    }
    t.cleanup()
  })

  test('the data dir fills up mid-copy: the job says "waiting for space" within seconds, the server answers, and the copy resumes bit-exact once space returns', async () => {
    const d = dataDirOnExt4('full', 192 * MiB)
    const srv = await startServer('bun', d, {
      MIGRATOR_IMPORT_ROOT: importRoot,
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(16 * MiB),
      MIGRATOR_FLUSH_EVERY_BYTES: String(8 * MiB),
      MIGRATOR_DOMAIN_TYPE: 'qemu',
    })
    try {
      const job = await copying(srv, 'disk/disk.qcow2', 'full', 24 * MiB)
      const filler = fill(d)
      const filledAt = Date.now()
      const waiting = await waitJob(srv.base, job.id, (j) => j.last_error !== null || j.status !== 'running', 30_000)
      expect(Date.now() - filledAt).toBeLessThan(10_000)
      expect(waiting.status).toBe('running')
      expect(['E_MIG_DISK_WRITE_FAILED', 'E_MIG_PERSIST_FAILED']).toContain(waiting.last_error.code)
      expect(waiting.last_error.fatal).toBe(false)
      // The mount point (the data dir, shown as such), both figures, the fix, the cause.
      expect(waiting.last_error.message).toMatch(/^waiting for space on <data dir> \(the file system of /)
      expect(waiting.last_error.message).toMatch(/\d+\.\d MiB free, \d+\.\d MiB needed/)
      expect(waiting.last_error.message).toContain('free space on <data dir>')
      expect(waiting.last_error.message).toMatch(/no space left on device|database or disk is full/i)
      // The server keeps answering while the file system is full.
      expect((await call(srv.base, 'GET', '/migrations')).status).toBe(200)
      // No silent stall: the notice stays while the space is missing, the job does not end.
      await new Promise((r) => setTimeout(r, 2000))
      const still = (await call(srv.base, 'GET', `/migrations/${job.id}`)).body
      expect([still.status, still.last_error?.code]).toEqual(['running', waiting.last_error.code])
      rmSync(filler)
      const done = await waitJob(srv.base, job.id, undefined, 90_000)
      expect([done.state, done.last_error]).toEqual(['Completed', null])
      expect(fileSha256(volumePath(d, job.id, done.progress.disks[0].label))).toBe(fileSha256(raw))
      // The supervisor names the store's own reason, never a masking ROLLBACK error.
      expect(srv.stdout() + srv.stderr()).not.toContain('cannot rollback')
    } finally {
      await srv.stop()
      console.log(
        srv
          .stdout()
          .split('\n')
          .filter((l) => !l.includes('"request"'))
          .join('\n')
          .slice(-5000),
        srv.stderr().slice(-3000),
      )
    }
    expect(integrity(d)).toBe('ok')
  }, 180_000)

  test('a file system that stays full: after MIGRATOR_SPACE_WAIT_SECONDS the job fails E_MIG_DISK_WRITE_FAILED naming the mount point, both figures and the fix', async () => {
    const d = dataDirOnExt4('stays', 192 * MiB)
    const srv = await startServer('bun', d, {
      MIGRATOR_IMPORT_ROOT: importRoot,
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(16 * MiB),
      MIGRATOR_FLUSH_EVERY_BYTES: String(8 * MiB),
      MIGRATOR_SPACE_WAIT_SECONDS: '3',
      MIGRATOR_DOMAIN_TYPE: 'qemu',
    })
    try {
      const job = await copying(srv, 'disk/disk.qcow2', 'stays', 24 * MiB)
      fill(d)
      const done = await waitJob(srv.base, job.id, undefined, 60_000)
      expect(done.state).toBe('Failed')
      expect(['E_MIG_DISK_WRITE_FAILED', 'E_MIG_PERSIST_FAILED']).toContain(done.last_error.code)
      expect(done.last_error.fatal).toBe(true)
      expect(done.last_error.message).toMatch(
        /^no space left on <data dir> \(the file system of .*\): \d+\.\d MiB free, \d+\.\d MiB needed after waiting 3 s; free space on <data dir>/,
      )
      expect((await call(srv.base, 'GET', '/migrations')).status).toBe(200)
    } finally {
      await srv.stop()
    }
    expect(integrity(d)).toBe('ok')
  }, 180_000)

  test('two jobs started together that fit only one at a time: the second is refused before its copy, naming both figures; the first completes bit-exact', async () => {
    // 128 MiB disks on a ~170 MiB file system: one fits, two do not.
    const d = dataDirOnExt4('two', 192 * MiB)
    const srv = await startServer('bun', d, {
      MIGRATOR_IMPORT_ROOT: importRoot,
      MIGRATOR_MAX_JOBS: '2',
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(16 * MiB),
      MIGRATOR_DOMAIN_TYPE: 'qemu',
    })
    try {
      const jobs = await Promise.all([1, 2].map((i) => submit(srv.base, offlinePlan('qcow2', 'disk/disk.qcow2', { name: `${PREFIX}two-${i}`, start: false }))))
      const done = await Promise.all(jobs.map((j) => waitJob(srv.base, j.id, undefined, 90_000)))
      const refused = done.filter((j) => j.state === 'Failed')
      const completed = done.filter((j) => j.state === 'Completed')
      expect([refused.length, completed.length]).toEqual([1, 1])
      const r = refused[0]
      expect(r.last_error.code).toBe('E_MIG_DISK_WRITE_FAILED')
      // Refused by the pre-copy check: nothing of it was copied, its volumes never made.
      expect(r.progress.bytes_done).toBe(0)
      expect(existsSync(path.join(d, 'volumes', 'migrations', r.id))).toBe(false)
      expect(r.last_error.message).toMatch(
        /^not enough space for the disks under <data dir>\/volumes: [\d.]+ GiB free on <data dir>, 0\.13 GiB needed by this job .* and [\d.]+ GiB still to be written by 1 other job\(s\) on it \(/,
      )
      expect(r.last_error.message).toContain(completed[0].id)
      expect(fileSha256(volumePath(d, completed[0].id, completed[0].progress.disks[0].label))).toBe(fileSha256(raw))
    } finally {
      await srv.stop()
    }
    expect(integrity(d)).toBe('ok')
  }, 180_000)

  /** A server on a plain data dir `<t.dir>/<name>`, copies capped at 16 MiB/s. */
  async function slowServer(name: string, env: Record<string, string> = {}) {
    const d = path.join(t.dir, name)
    mkdirSync(d, { recursive: true })
    chmodSync(d, 0o755)
    const srv = await startServer('bun', d, {
      MIGRATOR_IMPORT_ROOT: importRoot,
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(16 * MiB),
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      ...env,
    })
    return { d, srv }
  }

  test('a source written in place during the copy fails the job E_MIG_DISK_READ_FAILED ("the source changed while it was read", naming the file)', async () => {
    mkdirSync(path.join(importRoot, 'mod'))
    copyFileSync(path.join(importRoot, 'disk', 'disk.qcow2'), path.join(importRoot, 'mod', 'mod.qcow2'))
    const { d, srv } = await slowServer('inplace')
    try {
      const job = await copying(srv, 'mod/mod.qcow2', 'inplace', 16 * MiB)
      // Another process rewrites 1 MiB of the image's data area in place (same size, new bytes).
      const fd = openSync(path.join(importRoot, 'mod', 'mod.qcow2'), 'r+')
      writeSync(fd, randomBytes(MiB), 0, MiB, 80 * MiB)
      closeSync(fd)
      const done = await waitJob(srv.base, job.id, undefined, 60_000)
      expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_DISK_READ_FAILED'])
      expect(done.last_error.message).toMatch(/^mod\/mod\.qcow2: the source changed while it was read \(size \d+ -> \d+, modified /)
      expect((await call(srv.base, 'GET', '/migrations')).status).toBe(200)
    } finally {
      await srv.stop()
    }
    expect(integrity(d)).toBe('ok')
  }, 120_000)

  test('a source renamed over during the copy: the file opened once is read to its end, the job completes bit-exact with the old version', async () => {
    mkdirSync(path.join(importRoot, 'ren'))
    copyFileSync(path.join(importRoot, 'disk', 'disk.qcow2'), path.join(importRoot, 'ren', 'ren.qcow2'))
    const other = randomImage(path.join(t.dir, 'other.raw'), 128 * MiB, 8 * MiB)
    const { d, srv } = await slowServer('renamed')
    try {
      const job = await copying(srv, 'ren/ren.qcow2', 'renamed', 16 * MiB)
      execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', other, path.join(importRoot, 'ren', 'new.qcow2')])
      renameSync(path.join(importRoot, 'ren', 'new.qcow2'), path.join(importRoot, 'ren', 'ren.qcow2'))
      const done = await waitJob(srv.base, job.id, undefined, 60_000)
      expect([done.state, done.last_error]).toEqual(['Completed', null])
      expect(fileSha256(volumePath(d, job.id, done.progress.disks[0].label))).toBe(fileSha256(raw))
    } finally {
      await srv.stop()
    }
    expect(integrity(d)).toBe('ok')
  }, 120_000)

  /** An export file `<importRoot>/<name>/<name>.qcow2` served through FUSE (nbdfuse) by nbdkit from the test's qcow2, every read failing with EIO while `trigger` exists (nbdkit's error filter). */
  async function eioExport(name: string, trigger: string): Promise<string> {
    const dir = path.join(importRoot, name)
    mkdirSync(dir)
    const file = path.join(dir, `${name}.qcow2`)
    const args = ['--filter=error', 'file', path.join(importRoot, 'disk', 'disk.qcow2'), 'error-pread=EIO', 'error-pread-rate=1', `error-file=${trigger}`]
    spawn('nbdfuse', [file, '[', 'nbdkit', ...args, ']'], { stdio: 'ignore' }).unref()
    fuseMounts.push(dir)
    for (let i = 0; i < 100 && !existsSync(file); i++) await Bun.sleep(100)
    expect(existsSync(file)).toBe(true)
    return `${name}/${name}.qcow2`
  }

  test('a source that returns EIO mid-copy, then reads again: a notice naming the offset, the copy resumes from its durable watermark by itself, bit-exact', async () => {
    const trigger = path.join(t.dir, 'eio-on')
    const rel = await eioExport('eio', trigger)
    const { d, srv } = await slowServer('eio', { MIGRATOR_FLUSH_EVERY_BYTES: String(8 * MiB) })
    try {
      const job = await submit(srv.base, offlinePlan('qcow2', rel, { name: `${PREFIX}eio`, start: false }))
      const before = await waitJob(
        srv.base,
        job.id,
        (j) => (j.state === 'CopyingFull' && j.progress.disks[0]?.watermark >= 24 * MiB) || !['queued', 'running'].includes(j.status),
        60_000,
      )
      expect(before.state).toBe('CopyingFull')
      writeFileSync(trigger, '')
      const failing = await waitJob(srv.base, job.id, (j) => j.last_error !== null || j.status !== 'running', 30_000)
      expect([failing.status, failing.last_error.code, failing.last_error.fatal]).toEqual(['running', 'E_MIG_DISK_READ_FAILED', false])
      expect(failing.last_error.message).toMatch(/^the source returns I\/O errors \(eio \(eio\/eio\.qcow2\): read of \d+ bytes at offset \d+ failed: EIO/)
      expect(failing.last_error.message).toContain('MIGRATOR_READ_RETRY_SECONDS=300')
      // Still trying, not failed, while the source fails.
      await Bun.sleep(6000)
      const still = (await call(srv.base, 'GET', `/migrations/${job.id}`)).body
      expect([still.status, still.last_error?.code]).toEqual(['running', 'E_MIG_DISK_READ_FAILED'])
      const durable = still.progress.disks[0].watermark
      expect(durable).toBeGreaterThanOrEqual(24 * MiB)
      rmSync(trigger)
      const done = await waitJob(srv.base, job.id, undefined, 90_000)
      expect([done.state, done.last_error]).toEqual(['Completed', null])
      expect(fileSha256(volumePath(d, job.id, done.progress.disks[0].label))).toBe(fileSha256(raw))
      // Not read twice: the bytes read by the last try (per attempt) are at most the data above
      // the durable watermark plus one flush interval (96 MiB of data in all).
      expect(done.progress.disks[0].bytes_read).toBeLessThanOrEqual(96 * MiB - durable + 8 * MiB)
    } finally {
      await srv.stop()
    }
    expect(integrity(d)).toBe('ok')
  }, 180_000)

  test('a source that keeps returning EIO past MIGRATOR_READ_RETRY_SECONDS: the job fails E_MIG_DISK_READ_FAILED saying how long, the server answers', async () => {
    const trigger = path.join(t.dir, 'eio2-on')
    const rel = await eioExport('eio2', trigger)
    const { d, srv } = await slowServer('eio2', { MIGRATOR_READ_RETRY_SECONDS: '8' })
    try {
      const job = await submit(srv.base, offlinePlan('qcow2', rel, { name: `${PREFIX}eio2`, start: false }))
      await waitJob(
        srv.base,
        job.id,
        (j) => (j.state === 'CopyingFull' && j.progress.bytes_done > 16 * MiB) || !['queued', 'running'].includes(j.status),
        60_000,
      )
      writeFileSync(trigger, '')
      const done = await waitJob(srv.base, job.id, undefined, 60_000)
      expect([done.state, done.last_error.code, done.last_error.fatal]).toEqual(['Failed', 'E_MIG_DISK_READ_FAILED', true])
      expect(done.last_error.message).toMatch(
        /at offset \d+ failed: EIO.*; the source still returned I\/O errors after 8 s of tries; mend its storage and submit the migration again$/,
      )
      expect((await call(srv.base, 'GET', '/migrations')).status).toBe(200)
    } finally {
      rmSync(trigger, { force: true })
      await srv.stop()
    }
    expect(integrity(d)).toBe('ok')
  }, 120_000)
})
