/**
 * libvirtd stopped and started again (as a package upgrade's restart does) while jobs need it,
 * through the real server on real libvirt + qemu (TCG). Runs alone (`*.serial.integ.test.ts`):
 * it stops the daemon every other test file uses.
 * - Down before the job asks for its domain name and defines it, back 4 s later: the job waits,
 *   then completes with its boot verified.
 * - Restarted during the boot check (a boot sector that prints its marker 20 s after it starts):
 *   the domain keeps running, the check goes on, the job completes verified, nothing is reported
 *   lost.
 * - Down longer than MIGRATOR_LIBVIRT_RECONNECT_SECONDS: the job fails with
 *   E_MIG_DOMAIN_DEFINE_FAILED saying how long libvirt was away, never Completed, no domain left.
 * - A live import (docs/live-import.md) whose guest runs and copies (cap 1 MiB/s), libvirtd down
 *   past the reconnect window: the job says it waits for libvirt (non-fatal), never fails; the
 *   guest and its block copy go on in qemu; libvirtd back, the job completes in the same qemu
 *   process on the plain volume, bit-exact.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeDataBootDisk, makeSlowBootDisk } from '../helpers/bootdisk.ts'
import { buildInput } from '../helpers/inputs.ts'
import { bootCheckEnv, offlinePlan, submit, volumePath, waitJob, waitNotice } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, startLibvirtd, stopLibvirtd, domstate, qemuPid, virshText } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'i47lv-'
const MARKER = 'MIGRATOR-LV-RESTART-5521'
const MiB = 1024 * 1024
const RECONNECT_S = 12

describe('libvirtd restarted while jobs need it (real libvirt, TCG)', () => {
  const t = tempDir('mig-i47lv-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let quick = ''
  let slow = ''
  let data = ''

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    quick = buildInput('qcow2', importRoot, 'quick', [makeSlowBootDisk(path.join(t.dir, 'quick.raw'), MARKER, 16 * MiB, 0).path]).path
    slow = buildInput('qcow2', importRoot, 'slow', [makeSlowBootDisk(path.join(t.dir, 'slow.raw'), MARKER, 16 * MiB, 20).path]).path
    data = makeDataBootDisk(path.join(t.dir, 'data.raw'), MARKER)
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir, {
      ...bootCheckEnv(MARKER),
      MIGRATOR_BOOT_TIMEOUT_SECONDS: '120',
      MIGRATOR_LIBVIRT_RECONNECT_SECONDS: String(RECONNECT_S),
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(MiB),
    })
  }, 60_000)

  afterAll(async () => {
    await startLibvirtd() // whatever a failed test left
    await srv?.stop()
    await cleanupDomains(PREFIX)
    t.cleanup()
  })

  const rel = (p: string) => path.relative(importRoot, p)

  test('down when the job needs its domain name and define, back 4 s later: the job waits and completes, boot verified', async () => {
    await stopLibvirtd()
    const t0 = Date.now()
    const job = await submit(srv.base, offlinePlan('qcow2', rel(quick), { name: `${PREFIX}down` }))
    await Bun.sleep(4000)
    await startLibvirtd()
    const done = await waitJob(srv.base, job.id, undefined, 120_000)
    console.log(`libvirtd down 4 s from submission: ${done.state} after ${((Date.now() - t0) / 1000).toFixed(1)} s`)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(done.hardware.boot.verified).toBe(true)
    expect(domstate(`${PREFIX}down`)).toBe('running')
  }, 180_000)

  test('restarted during the boot check: the domain keeps running, the check goes on, Completed and verified', async () => {
    const job = await submit(srv.base, offlinePlan('qcow2', rel(slow), { name: `${PREFIX}boot` }))
    // In Starting with the domain running: the marker is still ~20 s away.
    await waitJob(srv.base, job.id, (j) => j.state === 'Starting' && domstate(`${PREFIX}boot`) === 'running', 60_000)
    const serial = path.join(t.dir, 'logs', `${job.id}.serial.log`)
    expect(readFileSync(serial, 'latin1').includes(MARKER)).toBe(false)
    await stopLibvirtd()
    await Bun.sleep(3000)
    await startLibvirtd()
    const done = await waitJob(srv.base, job.id, undefined, 150_000)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(done.hardware.boot.verified).toBe(true)
    expect(readFileSync(serial, 'latin1').includes(MARKER)).toBe(true)
    expect(domstate(`${PREFIX}boot`)).toBe('running')
  }, 240_000)

  test(`down longer than MIGRATOR_LIBVIRT_RECONNECT_SECONDS (${RECONNECT_S} s): E_MIG_DOMAIN_DEFINE_FAILED saying so, no domain`, async () => {
    await stopLibvirtd()
    try {
      const job = await submit(srv.base, offlinePlan('qcow2', rel(quick), { name: `${PREFIX}gone` }))
      const done = await waitJob(srv.base, job.id, undefined, 120_000)
      expect(done.state).toBe('Failed')
      expect(done.last_error.code).toBe('E_MIG_DOMAIN_DEFINE_FAILED')
      expect(done.last_error.message).toMatch(
        /^virsh list failed: failed to connect to the hypervisor.*; libvirt at qemu:\/\/\/system did not answer for (1[2-9]|[2-9]\d) s; start libvirtd and retry the job$/,
      )
    } finally {
      await startLibvirtd()
    }
    expect(domstate(`${PREFIX}gone`)).toBe('absent')
  }, 180_000)

  test(`live import: libvirtd down past the reconnect window mid-copy: the job waits for it, then Completed in the same qemu process`, async () => {
    const name = `${PREFIX}live`
    const input = buildInput('qcow2', importRoot, 'live', [data]).path
    const job = await submit(srv.base, offlinePlan('qcow2', rel(input), { name, live_import: true }))
    const copying = await waitJob(
      srv.base,
      job.id,
      (j) => (j.hardware?.boot?.verified === true && j.progress.bytes_done > 2 * MiB) || ['completed', 'failed', 'cancelled'].includes(j.status),
      120_000,
    )
    expect([copying.state, copying.status]).toEqual(['CopyingFull', 'running'])
    const pid = qemuPid(name)
    await stopLibvirtd()
    try {
      // the poll's state read waits out the reconnect window, then the job says it waits
      await waitNotice(srv.base, job.id, /waiting for libvirt/, 'E_MIG_GUEST_BOOT_FAILED', 4 * RECONNECT_S * 1000)
    } finally {
      await startLibvirtd()
    }
    const done = await waitJob(srv.base, job.id, undefined, 180_000)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(domstate(name)).toBe('running')
    expect(qemuPid(name)).toBe(pid)
    const vol = volumePath(t.dir, job.id, done.progress.disks[0].label)
    expect(virshText('domblklist', name)).toContain(vol)
    expect(virshText('dumpxml', name)).not.toMatch(/<backingStore type=|nbd/)
    expect(readFileSync(vol).equals(readFileSync(data))).toBe(true)
  }, 300_000)
})
