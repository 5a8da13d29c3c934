/**
 * Live import end to end through the HTTP API with a cheap guest: a 16 MiB boot sector disk that
 * prints a marker on the serial console (fixtures/bootdisk.ts; the server's
 * MIGRATOR_BOOT_SERIAL_PATTERN makes the marker the boot evidence), packed as a qcow2 input, real
 * libvirt + qemu (TCG), file sink, the copy capped (MIGRATOR_COPY_MAX_BYTES_PER_SECOND) so it
 * takes about 16 s:
 * - the boot is verified while the job still copies (state CopyingFull, bytes below the capacity,
 *   the domain and boot verdict on the job), the domain's disk then a qcow2 overlay over the NBD
 *   export;
 * - at Completed the domain runs on the plain volume (domblklist, no backing store), with the same
 *   qemu pid, persistent definition on the volume, the volume equal to the source, the live
 *   directory (sockets, overlay) gone;
 * - a cancel while the guest runs destroys it and removes what the job made;
 * - a SIGKILL of the worker mid-copy (48 MiB of random data behind the boot sector) leaves the
 *   guest running; the next worker serves the exports again on the same sockets, restarts the
 *   block job qemu dropped and completes in the same qemu process.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import * as path from 'node:path'
import { buildInput } from '../../fixtures/inputs.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { bootCheckEnv, call, offlinePlan, submit, volumePath, waitJob, workerPid } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, virshText, qemuPid } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'lib-'
const MARKER = 'MIGRATOR-LIVE-IMPORT-BOOT-7781'
const MiB = 1024 * 1024

describe('live import of a boot-sector guest', () => {
  const t = tempDir('mig-lib-')
  let srv: RunningServer
  const importRoot = path.join(t.dir, 'imports')

  beforeAll(async () => {
    execFileSync('chmod', ['755', t.dir])
    mkdirSync(importRoot, { recursive: true })
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir, { ...bootCheckEnv(MARKER), MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(MiB) })
  }, 120_000)

  afterAll(async () => {
    await srv?.stop()
    await cleanupDomains(PREFIX)
    t.cleanup()
  }, 60_000)

  /** A 64 MiB boot disk with 48 MiB of unique data behind the boot sector: about 48 s at the cap. */
  function dataBootDisk(file: string): string {
    const boot = makeBootDisk(file, MARKER, 64 * MiB).path
    const fd = openSync(boot, 'r+')
    for (let off = 8 * MiB; off < 56 * MiB; off += MiB) writeSync(fd, randomBytes(MiB), 0, MiB, off)
    closeSync(fd)
    return boot
  }

  test('boot verified while copying, then Completed on the plain volume in the same qemu process', async () => {
    const boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 16 * MiB).path
    const input = buildInput('qcow2', importRoot, 'lib-one', [boot])
    const t0 = Date.now()
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-one', live_import: true }))
    const live = await waitJob(srv.base, job.id, (j) => j.hardware?.boot?.verified === true || ['completed', 'failed', 'cancelled'].includes(j.status), 120_000)
    const bootSeconds = (Date.now() - t0) / 1000
    expect([live.state, live.status, live.domain]).toEqual(['CopyingFull', 'running', 'lib-one'])
    expect(live.hardware.boot.evidence).toContain(MARKER)
    const disk = live.progress.disks[0]
    expect(live.progress.bytes_done).toBeLessThan(live.progress.bytes_total)
    const xml = virshText('dumpxml', 'lib-one')
    expect(xml).toContain(`${path.join(t.dir, 'live', job.id)}/0.qcow2`)
    expect(xml).toContain("protocol='nbd'")
    expect(xml).toContain("error_policy='stop'")
    const pid = qemuPid('lib-one')
    const done = await waitJob(srv.base, job.id, undefined, 180_000)
    const completedSeconds = (Date.now() - t0) / 1000
    console.log(`boot-sector live import: verified boot ${bootSeconds.toFixed(1)} s, Completed ${completedSeconds.toFixed(1)} s`)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(done.hardware.boot.verified).toBe(true)
    const vol = volumePath(t.dir, job.id, disk.label)
    expect(virshText('domstate', 'lib-one')).toBe('running')
    expect(qemuPid('lib-one')).toBe(pid)
    expect(virshText('domblklist', 'lib-one')).toContain(vol)
    const after = virshText('dumpxml', 'lib-one')
    expect(after).not.toContain('nbd')
    expect(after).not.toMatch(/<backingStore type=/)
    expect(virshText('dumpxml', '--inactive', 'lib-one')).toContain(vol)
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    // the guest never writes its disk: the volume holds the source's bytes
    expect(
      readFileSync(vol)
        .subarray(0, 16 * MiB)
        .equals(readFileSync(boot)),
    ).toBe(true)
    expect(completedSeconds).toBeGreaterThan(bootSeconds)
    await cleanupDomains('lib-one')
  }, 300_000)

  test('cancel while the guest runs and copies: the guest is destroyed, the live directory and volumes removed', async () => {
    const boot = dataBootDisk(path.join(t.dir, 'boot2.raw'))
    const input = buildInput('qcow2', importRoot, 'lib-cancel', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-cancel', live_import: true }))
    const live = await waitJob(srv.base, job.id, (j) => j.hardware?.boot?.verified === true || ['completed', 'failed', 'cancelled'].includes(j.status), 120_000)
    expect(virshText('domstate', 'lib-cancel')).toBe('running')
    expect(live.progress.bytes_done).toBeLessThan(live.progress.bytes_total)
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
    const done = await waitJob(srv.base, job.id, undefined, 60_000)
    expect([done.state, done.last_error.code]).toEqual(['Cancelled', 'E_MIG_CANCELLED'])
    expect(virshText('domstate', 'lib-cancel')).toBe('absent')
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    expect(existsSync(path.dirname(volumePath(t.dir, job.id, 'x')))).toBe(false)
  }, 300_000)

  test('SIGKILL of the worker mid-copy: the guest keeps running, the job resumes following it and completes', async () => {
    const boot = dataBootDisk(path.join(t.dir, 'boot3.raw'))
    const input = buildInput('qcow2', importRoot, 'lib-kill', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-kill', live_import: true }))
    await waitJob(srv.base, job.id, (j) => j.hardware?.boot?.verified === true || ['completed', 'failed', 'cancelled'].includes(j.status), 120_000)
    await waitJob(srv.base, job.id, (j) => j.progress.bytes_done > 4 * MiB || j.status !== 'running', 60_000)
    const pid = qemuPid('lib-kill')
    const worker = workerPid(t.dir, job.id)
    expect(worker).toBeGreaterThan(0)
    process.kill(worker!, 'SIGKILL')
    await Bun.sleep(1000)
    expect(virshText('domstate', 'lib-kill')).toBe('running')
    const done = await waitJob(srv.base, job.id, undefined, 240_000)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(qemuPid('lib-kill')).toBe(pid)
    const vol = volumePath(t.dir, job.id, done.progress.disks[0].label)
    expect(virshText('domblklist', 'lib-kill')).toContain(vol)
    expect(virshText('dumpxml', 'lib-kill')).not.toMatch(/<backingStore type=|nbd/)
    expect(
      readFileSync(vol)
        .subarray(0, 64 * MiB)
        .equals(readFileSync(boot)),
    ).toBe(true)
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    await cleanupDomains('lib-kill')
  }, 300_000)
})
