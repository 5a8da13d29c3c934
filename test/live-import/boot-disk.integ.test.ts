/**
 * Live import end to end through the HTTP API with a cheap guest: a 16 MiB boot sector disk that
 * prints a marker on the serial console (fixtures/bootdisk.ts; the server's
 * MIGRATOR_BOOT_SERIAL_PATTERN makes the marker the boot evidence), packed as a qcow2 input, real
 * libvirt + qemu (TCG), file sink, the copy capped (MIGRATOR_COPY_MAX_BYTES_PER_SECOND) so it
 * takes about 16 s:
 * - submitted by `migrator import <path> --live-import`: the boot is verified while the job still
 *   copies (state CopyingFull, bytes below the capacity, the domain and boot verdict on the job),
 *   the domain's disk then a qcow2 overlay over the NBD export;
 * - at Completed the domain runs on the plain volume (domblklist, no backing store), with the same
 *   qemu pid, persistent definition on the volume, the volume equal to the source, the live
 *   directory (sockets, overlay) gone;
 * - a disk that does not boot: the job fails on the firmware's own message, before the boot
 *   pattern's timeout;
 * - a cancel with `{"live_guest": "destroy"}` (the CLI's `--live-guest destroy`) while the guest
 *   runs destroys it and removes what the job made;
 * - a cancel with no body (`finish`, the default) lets the copy finish: Completed with a non-fatal
 *   E_MIG_CANCELLED notice, the guest on its volume with what it wrote; a cancel body that is not
 *   `{"live_guest": "finish" | "destroy"}` is refused naming the field;
 * - a SIGKILL of the worker mid-copy (48 MiB of random data behind the boot sector) leaves the
 *   guest running; the next worker serves the exports again on the same sockets, restarts the
 *   block job qemu dropped and completes in the same qemu process;
 * - a SIGKILL of the server mid-copy (its workers end with it): the guest keeps running; a cancel
 *   with no body (finish) reaches the new server on the same data directory while no worker runs
 *   the job; once the lease expired the job resumes following the guest and finishes its copy
 *   (Completed with the cancel's notice), the guest's writes before, during and after the outage
 *   on the volume;
 * - the destination's file system filled up mid-copy (ext4 on a loop device, filled by another
 *   writer): the job says it waits for space (non-fatal), the guest runs on; space freed, the
 *   block copy starts again and completes, a guest write made meanwhile on the volume;
 * - qemu SIGKILLed mid-copy (libvirt: shut off, crashed): the guest is started again on its
 *   overlay, its flushed write kept; then destroyed by an operator: its copy is finished with it
 *   started paused, it is left shut off, its persistent definition on the volume, both writes on it;
 * - the HTTP source (a real nginx, `offline_url`) stopped mid-copy and started again on the same
 *   port: the job says "waiting for the source" (non-fatal), the guest is not stopped, the job
 *   does not fail, and once the source answers again it completes bit-exact.
 * The boot-sector guest writes nothing itself: its writes are made through qemu's block layer on
 * the guest's disk device (HMP `qemu-io -d <device>`, see {@link qemuIo}), the path a guest's
 * own writes take (the device's block backend, under the block copy's synchronous writes).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, statfsSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput } from '../../fixtures/inputs.ts'
import { runCli } from '../helpers/cli.ts'
import { makeBadBootDisk, makeBootDisk, makeDataBootDisk } from '../helpers/bootdisk.ts'
import { bootCheckEnv, call, offlinePlan, submit, volumePath, waitJob, waitNotice, workerPid } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, virshText, qemuPid } from '../helpers/libvirt.ts'
import { startNginx } from '../helpers/nginx.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { dataDirOnExt4 } from '../helpers/small-fs.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'lib-'
const MARKER = 'MIGRATOR-LIVE-IMPORT-BOOT-7781'
const MiB = 1024 * 1024
/** qcow2's default cluster: writes of whole clusters need no read of the backing export. */
const CLUSTER = 64 * 1024
/**
 * The server's job lease: a new server resumes a killed one's job after it (a worker's heartbeat
 * renews it every second), long enough for a cancel to reach the new server before.
 */
const LEASE_SECONDS = 10

/**
 * Runs qemu-io `command` on the first disk of the running `domain` through qemu's block layer
 * (HMP `qemu-io -d <qdev id>`): the path a guest's own I/O takes (the device's block backend).
 * Throws when the monitor reports an error (qemu-io prints its report on qemu's stdout, the
 * domain's log; the monitor answers only errors).
 */
function qemuIo(domain: string, command: string): void {
  const alias = /<disk type=[\s\S]*?<alias name='([^']+)'\/>/.exec(virshText('dumpxml', domain))?.[1]
  if (!alias) throw new Error(`domain ${domain}: no disk alias`)
  const out = virshText('qemu-monitor-command', '--hmp', domain, `qemu-io -d ${alias} "${command}"`)
  if (out.trim() !== '') throw new Error(`domain ${domain}: qemu-io ${command}: ${out}`)
}

/** The test double of a guest's write: `length` bytes of `byte` at `offset` of `domain`'s first disk (checked on the volume). */
function guestWrite(domain: string, offset: number, length: number, byte: number): void {
  qemuIo(domain, `write -P ${byte} ${offset} ${length}`)
}

/** The test double of a guest's fsync: a flush of `domain`'s first disk. */
function guestFlush(domain: string): void {
  qemuIo(domain, 'flush')
}

/** The bytes of `source` with each write `[offset, length, byte]` applied. */
function withWrites(source: Buffer, writes: Array<[number, number, number]>): Buffer {
  const out = Buffer.from(source)
  for (const [offset, length, byte] of writes) out.fill(byte, offset, offset + length)
  return out
}

describe('live import of a boot-sector guest', () => {
  const t = tempDir('mig-lib-')
  let srv: RunningServer
  const importRoot = path.join(t.dir, 'imports')
  const serverEnv = { ...bootCheckEnv(MARKER), MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(MiB), MIGRATOR_LEASE_SECONDS: String(LEASE_SECONDS) }

  beforeAll(async () => {
    execFileSync('chmod', ['755', t.dir])
    mkdirSync(importRoot, { recursive: true })
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir, serverEnv)
  }, 120_000)

  afterAll(async () => {
    await srv?.stop()
    await cleanupDomains(PREFIX)
    t.cleanup()
  }, 60_000)

  /** Waits until the live guest's boot is verified and more than 4 MiB are copied (or the job ended); the job then. */
  async function bootedAndCopying(id: string, base = srv.base): Promise<any> {
    await waitJob(base, id, (j) => j.hardware?.boot?.verified === true || ['completed', 'failed', 'cancelled'].includes(j.status), 120_000)
    return waitJob(base, id, (j) => j.progress.bytes_done > 4 * MiB || j.status !== 'running', 60_000)
  }

  /**
   * Domain `name` runs on the plain volume of job `done` (no backing store, no NBD), whose first
   * 64 MiB are `expected`; `dataDir`: the data directory of the server that ran it.
   */
  function expectOnPlainVolume(name: string, done: any, expected: Buffer, dataDir = t.dir): void {
    const vol = volumePath(dataDir, done.id, done.progress.disks[0].label)
    expect(virshText('domblklist', name)).toContain(vol)
    expect(virshText('dumpxml', name)).not.toMatch(/<backingStore type=|nbd/)
    expect(
      readFileSync(vol)
        .subarray(0, 64 * MiB)
        .equals(expected),
    ).toBe(true)
  }

  test('boot verified while copying, then Completed on the plain volume in the same qemu process', async () => {
    const boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 16 * MiB).path
    const input = buildInput('qcow2', importRoot, 'lib-one', [boot])
    const t0 = Date.now()
    // submitted by the CLI's import of a path inside the import root (used in place)
    const cli = await runCli(['import', input.path, '--name', 'lib-one', '--live-import', '--no-watch', '--json'], { env: { MIGRATOR_URL: srv.base } })
    expect([cli.code, cli.stderr]).toEqual([0, ''])
    const job = JSON.parse(cli.stdout.split('\n').find((l) => l.includes('"submitted"'))!) as { id: string }
    expect((await call(srv.base, 'GET', `/migrations/${job.id}`)).body.plan.live_import).toBe(true)
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

  test('a disk that does not boot: Failed with E_MIG_GUEST_BOOT_FAILED from the firmware, not from the boot pattern running out', async () => {
    const bad = makeBadBootDisk(path.join(t.dir, 'bad.raw'), 8 * MiB).path
    const input = buildInput('qcow2', importRoot, 'lib-bad', [bad])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-bad', live_import: true }))
    const done = await waitJob(srv.base, job.id, undefined, 120_000)
    expect([done.state, done.last_error.code, done.last_error.fatal]).toEqual(['Failed', 'E_MIG_GUEST_BOOT_FAILED', true])
    // caught by evidence (SeaBIOS's own message), before the 20 s the pattern has (bootCheckEnv)
    expect(done.last_error.message).toContain('did not boot: the firmware found no bootable disk')
    expect(done.last_error.message).not.toContain('did not match')
    expect(Number(/after ([\d.]+) s/.exec(done.last_error.message)?.[1])).toBeLessThan(20)
    expect(virshText('domstate', 'lib-bad')).not.toBe('running')
    await cleanupDomains('lib-bad')
  }, 180_000)

  test('cancel --live-guest destroy while the guest runs and copies: the guest is destroyed, the live directory and volumes removed', async () => {
    const boot = makeDataBootDisk(path.join(t.dir, 'boot2.raw'), MARKER)
    const input = buildInput('qcow2', importRoot, 'lib-cancel', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-cancel', live_import: true }))
    const live = await waitJob(srv.base, job.id, (j) => j.hardware?.boot?.verified === true || ['completed', 'failed', 'cancelled'].includes(j.status), 120_000)
    expect(virshText('domstate', 'lib-cancel')).toBe('running')
    expect(live.progress.bytes_done).toBeLessThan(live.progress.bytes_total)
    const cli = await runCli(['cancel', job.id, '--live-guest', 'destroy', '--json'], { env: { MIGRATOR_URL: srv.base } })
    expect([cli.code, cli.stderr]).toEqual([0, ''])
    const done = await waitJob(srv.base, job.id, undefined, 60_000)
    expect([done.state, done.last_error.code]).toEqual(['Cancelled', 'E_MIG_CANCELLED'])
    expect(virshText('domstate', 'lib-cancel')).toBe('absent')
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    expect(existsSync(path.dirname(volumePath(t.dir, job.id, 'x')))).toBe(false)
  }, 300_000)

  test('SIGKILL of the worker mid-copy: the guest keeps running, the job resumes following it and completes', async () => {
    const boot = makeDataBootDisk(path.join(t.dir, 'boot3.raw'), MARKER)
    const input = buildInput('qcow2', importRoot, 'lib-kill', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-kill', live_import: true }))
    await bootedAndCopying(job.id)
    const pid = qemuPid('lib-kill')
    const worker = workerPid(t.dir, job.id)
    expect(worker).toBeGreaterThan(0)
    process.kill(worker!, 'SIGKILL')
    await Bun.sleep(1000)
    expect(virshText('domstate', 'lib-kill')).toBe('running')
    const done = await waitJob(srv.base, job.id, undefined, 240_000)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(qemuPid('lib-kill')).toBe(pid)
    expectOnPlainVolume('lib-kill', done, readFileSync(boot))
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    await cleanupDomains('lib-kill')
  }, 300_000)
  test('cancel with no body while the guest runs (live_guest finish): the copy finishes, Completed, the guest on its volume with its write', async () => {
    const boot = makeDataBootDisk(path.join(t.dir, 'boot4.raw'), MARKER)
    const input = buildInput('qcow2', importRoot, 'lib-finish', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-finish', live_import: true }))
    const live = await waitJob(srv.base, job.id, (j) => j.hardware?.boot?.verified === true || ['completed', 'failed', 'cancelled'].includes(j.status), 120_000)
    expect(live.progress.bytes_done).toBeLessThan(live.progress.bytes_total)
    const pid = qemuPid('lib-finish')
    const writes: Array<[number, number, number]> = [[40 * MiB, 4 * CLUSTER, 0xa5]]
    guestWrite('lib-finish', ...writes[0]!)
    // bodies that are not {"live_guest": "finish" | "destroy"}: refused naming the field, nothing flagged
    for (const body of [{ live_guest: 'keep' }, { live_guest: 1 }, { guest: 'finish' }]) {
      const r = await call(srv.base, 'POST', `/migrations/${job.id}/cancel`, body)
      expect([r.status, r.body.error.code]).toEqual([400, 'E_MIG_BAD_REQUEST'])
      expect(r.body.error.message).toContain(Object.keys(body)[0]!)
    }
    const bad = await fetch(`${srv.base}/migrations/${job.id}/cancel`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"live_guest":',
    })
    expect(bad.status).toBe(400)
    expect((await call(srv.base, 'GET', `/migrations/${job.id}`)).body.status).toBe('running')
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
    const finishing = await waitJob(srv.base, job.id, (j) => j.last_error?.code === 'E_MIG_CANCELLED' || j.status !== 'running', 30_000)
    expect([finishing.state, finishing.last_error.fatal]).toEqual(['CopyingFull', false])
    expect(finishing.last_error.message).toContain('finish')
    const done = await waitJob(srv.base, job.id, undefined, 240_000)
    expect([done.state, done.last_error.code, done.last_error.fatal]).toEqual(['Completed', 'E_MIG_CANCELLED', false])
    expect(done.last_error.message).toContain('its copy was finished')
    expect(virshText('domstate', 'lib-finish')).toBe('running')
    expect(qemuPid('lib-finish')).toBe(pid)
    expectOnPlainVolume('lib-finish', done, withWrites(readFileSync(boot), writes))
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    await cleanupDomains('lib-finish')
  }, 300_000)

  test('SIGKILL of the server mid-copy, a cancel (finish) while no worker runs: the guest keeps running, a new server resumes the job following it and finishes the copy, the guest writes on the volume', async () => {
    const boot = makeDataBootDisk(path.join(t.dir, 'boot5.raw'), MARKER)
    const input = buildInput('qcow2', importRoot, 'lib-skill', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-skill', live_import: true }))
    await bootedAndCopying(job.id)
    const pid = qemuPid('lib-skill')
    // one write before the kill, one while no server runs, one after the new server took over
    const writes: Array<[number, number, number]> = [
      [12 * MiB, 2 * CLUSTER, 0x11],
      [44 * MiB, 2 * CLUSTER, 0x22],
      [60 * MiB, 2 * CLUSTER, 0x33],
    ]
    guestWrite('lib-skill', ...writes[0]!)
    srv.child.kill('SIGKILL')
    await new Promise((r) => srv.child.once('exit', r))
    // the worker notices its supervisor is gone (IPC disconnect) and ends
    for (let i = 0; i < 100 && workerPid(t.dir, job.id) !== null; i++) await Bun.sleep(100)
    expect(workerPid(t.dir, job.id)).toBeNull()
    expect(virshText('domstate', 'lib-skill')).toBe('running')
    guestWrite('lib-skill', ...writes[1]!)
    srv = await startServer('bun', t.dir, serverEnv)
    // a cancel (no body: finish) reaches the new server before it resumes the job (the lease holds)
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
    expect(workerPid(t.dir, job.id)).toBeNull()
    const resumed = await waitJob(srv.base, job.id, (j) => workerPid(t.dir, j.id) !== null || j.status !== 'running', 60_000)
    expect(resumed.status).toBe('running')
    guestWrite('lib-skill', ...writes[2]!)
    const done = await waitJob(srv.base, job.id, undefined, 240_000)
    expect([done.state, done.last_error.code, done.last_error.fatal]).toEqual(['Completed', 'E_MIG_CANCELLED', false])
    expect(done.last_error.message).toContain('its copy was finished')
    expect(virshText('domstate', 'lib-skill')).toBe('running')
    expect(done.hardware.boot.verified).toBe(true)
    expect(qemuPid('lib-skill')).toBe(pid)
    expectOnPlainVolume('lib-skill', done, withWrites(readFileSync(boot), writes))
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    await cleanupDomains('lib-skill')
  }, 300_000)
  test('qemu killed mid-copy, then the guest destroyed: started again on its overlay, then finished paused and left shut off, its flushed writes on the volume', async () => {
    const boot = makeDataBootDisk(path.join(t.dir, 'boot7.raw'), MARKER, 24)
    const input = buildInput('qcow2', importRoot, 'lib-crash', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-crash', live_import: true }))
    await bootedAndCopying(job.id)
    const writes: Array<[number, number, number]> = [
      [20 * MiB, 2 * CLUSTER, 0x44],
      [36 * MiB, 2 * CLUSTER, 0x55],
    ]
    // the guest's write and its flush (as an fsync does), then its qemu killed
    guestWrite('lib-crash', ...writes[0]!)
    guestFlush('lib-crash')
    const pid = qemuPid('lib-crash')
    process.kill(pid!, 'SIGKILL')
    const restarted = await waitJob(srv.base, job.id, (j) => /crashed/.test(j.last_error?.message ?? '') || j.status !== 'running', 60_000)
    expect([restarted.status, restarted.last_error.code, restarted.last_error.fatal]).toEqual(['running', 'E_MIG_GUEST_BOOT_FAILED', false])
    expect(virshText('domstate', 'lib-crash')).toBe('running')
    expect(qemuPid('lib-crash')).not.toBe(pid)
    expect(virshText('dumpxml', 'lib-crash')).toContain("protocol='nbd'")
    guestWrite('lib-crash', ...writes[1]!)
    guestFlush('lib-crash')
    // an operator (or the guest's owner) powers it off while it still copies
    virshText('destroy', 'lib-crash')
    const paused = await waitJob(srv.base, job.id, (j) => /shut off \(destroyed\)/.test(j.last_error?.message ?? '') || j.status !== 'running', 60_000)
    expect([paused.status, paused.last_error?.message]).toEqual(['running', expect.stringContaining('left shut off')])
    const done = await waitJob(srv.base, job.id, undefined, 240_000)
    expect([done.state, done.last_error.code, done.last_error.fatal]).toEqual(['Completed', 'E_MIG_GUEST_BOOT_FAILED', false])
    expect(done.last_error.message).toContain('crashed')
    expect(done.last_error.message).toContain('left shut off')
    expect(virshText('domstate', 'lib-crash')).toBe('shut off')
    const vol = volumePath(t.dir, job.id, done.progress.disks[0].label)
    const config = virshText('dumpxml', '--inactive', 'lib-crash')
    expect(config).toContain(vol)
    expect(config).not.toMatch(/<backingStore type=|nbd/)
    expect(readFileSync(vol).equals(withWrites(readFileSync(boot), writes))).toBe(true)
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    await cleanupDomains('lib-crash')
  }, 420_000)

  test('the destination fills up mid-copy: waiting for space (non-fatal), the guest runs on; space freed, the copy starts again and completes with the guest write', async () => {
    // a server whose volumes are on a 256 MiB ext4 of their own (no blocks reserved for root)
    const small = dataDirOnExt4(t.dir, 'full', 256 * MiB, ['-m', '0'])
    chmodSync(small.dir, 0o755)
    const s2 = await startServer('bun', small.dir, { ...serverEnv, MIGRATOR_IMPORT_ROOT: importRoot, MIGRATOR_SPACE_WAIT_SECONDS: '300' })
    try {
      const boot = makeDataBootDisk(path.join(t.dir, 'boot8.raw'), MARKER)
      const input = buildInput('qcow2', importRoot, 'lib-full', [boot])
      const job = await submit(s2.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'lib-full', live_import: true }))
      await bootedAndCopying(job.id, s2.base)
      // another writer takes every free block while the block copy runs
      const volumes = path.join(small.dir, 'volumes')
      const filler = path.join(volumes, 'filler')
      const st = statfsSync(volumes)
      try {
        execFileSync('fallocate', ['-l', String(Number(st.bfree) * Number(st.bsize)), filler], { stdio: 'ignore' })
      } catch {}
      const waiting = await waitNotice(s2.base, job.id, /^waiting for space on /, 'E_MIG_DISK_WRITE_FAILED', 120_000)
      expect(waiting.last_error.message).toContain(`waiting for space on ${volumes} `)
      expect(virshText('domstate', 'lib-full')).toBe('running')
      // the block copy stopped: this write lands in the overlay, and on the volume with the copy
      const writes: Array<[number, number, number]> = [[30 * MiB, 2 * CLUSTER, 0x66]]
      guestWrite('lib-full', ...writes[0]!)
      const pid = qemuPid('lib-full')
      rmSync(filler)
      const done = await waitJob(s2.base, job.id, undefined, 240_000)
      expect([done.state, done.last_error]).toEqual(['Completed', null])
      expect(qemuPid('lib-full')).toBe(pid)
      expectOnPlainVolume('lib-full', done, withWrites(readFileSync(boot), writes), small.dir)
    } finally {
      await s2.stop()
      await cleanupDomains('lib-full')
      small.unmount()
    }
  }, 420_000)

  test('the HTTP source stopped mid-copy and started again: waiting for the source, then Completed bit-exact', async () => {
    const www = path.join(t.dir, 'www')
    mkdirSync(www, { recursive: true })
    const boot = makeDataBootDisk(path.join(t.dir, 'boot6.raw'), MARKER)
    const input = buildInput('qcow2', www, 'lib-http', [boot])
    const nginxDir = path.join(t.dir, 'nginx')
    let web = await startNginx(www, nginxDir)
    try {
      const url = `${web.base}/${path.relative(www, input.path)}`
      const job = await submit(srv.base, {
        source: { Offline: 'qcow2' },
        source_ref: { kind: 'offline_url', url },
        mode: 'Cold',
        name: 'lib-http',
        live_import: true,
      })
      const before = await bootedAndCopying(job.id)
      expect(before.progress.bytes_done).toBeLessThan(before.progress.bytes_total)
      await web.stop()
      await waitNotice(srv.base, job.id, /waiting for the source/, 'E_MIG_DISK_READ_FAILED', 60_000)
      // the guest is not stopped while its source is away (paused at worst, by a read of its own)
      await Bun.sleep(5000)
      expect(['running', 'paused']).toContain(virshText('domstate', 'lib-http'))
      const still = (await call(srv.base, 'GET', `/migrations/${job.id}`)).body
      expect([still.status, still.progress.bytes_done < still.progress.bytes_total]).toEqual(['running', true])
      web = await startNginx(www, nginxDir, { port: web.port })
      const done = await waitJob(srv.base, job.id, undefined, 240_000)
      expect([done.state, done.last_error]).toEqual(['Completed', null])
      expect(virshText('domstate', 'lib-http')).toBe('running')
      expectOnPlainVolume('lib-http', done, readFileSync(boot))
    } finally {
      await web.stop()
      await cleanupDomains('lib-http')
    }
  }, 420_000)
})
