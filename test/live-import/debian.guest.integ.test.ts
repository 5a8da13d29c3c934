/**
 * Live import of a real Debian guest of the test matrix (fixtures/guest-image.ts, variant
 * `noconsole`: BIOS, no serial console, so the boot check reads the guest's screen; the boot
 * record unit appends a line to GUEST_RECORD_FILE at every boot) through the HTTP API, real libvirt + qemu (TCG), file sink, the
 * copy capped with MIGRATOR_COPY_MAX_BYTES_PER_SECOND so that it takes minutes:
 * - the boot is verified (the guest's own evidence) while the job still copies;
 * - at Completed the domain runs on the plain raw volume (no backing file, no backing store in its
 *   definition), in the same qemu process;
 * - after a clean shutdown the volume holds the record the guest wrote during the copy and
 *   `fsck -n` of its file systems is clean.
 * Inputs: a VMX folder (flat VMDK) and an OVA (stream-optimized VMDK read at any offset).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { GUEST_RECORD_FILE, guestImages, readGuestRecord } from '../../fixtures/guest-image.ts'
import { buildInput } from '../../fixtures/inputs.ts'
import { offlinePlan, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, virshText } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'lig-'
const MiB = 1024 * 1024
/** The copy cap: the guest's data (about 1 GiB allocated) takes minutes, longer than its TCG boot. */
const CAP = 4 * MiB

function qemuPid(name: string): number {
  return Number(readFileSync(`/run/libvirt/qemu/${name}.pid`, 'utf8').trim())
}

/** `fsck -n` of every ext4 and vfat partition of raw image `image` (read-only loop device): the outputs, throwing on a dirty one. */
function fsckImage(image: string): string[] {
  const loop = execFileSync('losetup', ['--find', '--show', '--read-only', '--partscan', image], { encoding: 'utf8' }).trim()
  try {
    execFileSync('udevadm', ['settle'])
    const out: string[] = []
    const parts = execFileSync('lsblk', ['-lnpo', 'NAME,FSTYPE', loop], { encoding: 'utf8' })
      .split('\n')
      .map((l) => l.trim().split(/\s+/))
      .filter(([n, fs]) => n !== loop && (fs === 'ext4' || fs === 'vfat'))
    for (const [dev, fs] of parts) {
      const r = spawnSync('fsck', ['-n', '-t', fs!, dev!], { encoding: 'utf8' })
      out.push(`${dev} ${fs}: exit ${r.status}: ${(r.stdout + r.stderr).trim().split('\n').slice(-2).join(' / ')}`)
      if (r.status !== 0) throw new Error(`fsck -n ${dev} (${fs}) exit ${r.status}: ${r.stdout}${r.stderr}`)
    }
    return out
  } finally {
    spawnSync('losetup', ['-d', loop])
  }
}

describe('live import of a real Debian guest', () => {
  const t = tempDir('mig-lig-')
  let srv: RunningServer
  const importRoot = path.join(t.dir, 'imports')

  beforeAll(async () => {
    execFileSync('chmod', ['755', t.dir])
    mkdirSync(importRoot, { recursive: true })
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir, {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: '900',
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(CAP),
    })
  }, 60 * 60_000)

  afterAll(async () => {
    await srv?.stop()
    await cleanupDomains(PREFIX)
    t.cleanup()
  }, 120_000)

  for (const kind of ['vmx_folder', 'ova_archive'] as const) {
    const name = `lig-${kind === 'vmx_folder' ? 'vmx' : 'ova'}`
    test(
      `${kind}: boot verified while copying; Completed on the plain volume; the guest's writes on it, fsck clean`,
      async () => {
        const image = guestImages().noconsole
        const input = buildInput(kind, importRoot, name, [image.path])
        const t0 = Date.now()
        const job = await submit(srv.base, offlinePlan(kind, path.relative(importRoot, input.path), { name, live_import: true }))
        const live = await waitJob(srv.base, job.id, (j) => !!j.hardware?.boot || ['completed', 'failed', 'cancelled'].includes(j.status), 30 * 60_000)
        const bootSeconds = (Date.now() - t0) / 1000
        console.log(
          `${kind}: boot verdict after ${bootSeconds.toFixed(1)} s: ${JSON.stringify(live.hardware?.boot)?.slice(0, 300)} progress ${live.progress.bytes_done}/${live.progress.bytes_total} last_error ${JSON.stringify(live.last_error)}`,
        )
        expect([live.state, live.status, live.domain]).toEqual(['CopyingFull', 'running', name])
        expect(live.hardware.boot.verified).toBe(true)
        expect(live.progress.bytes_done).toBeLessThan(live.progress.bytes_total)
        expect(virshText('dumpxml', name)).toContain("protocol='nbd'")
        const pid = qemuPid(name)
        const done = await waitJob(srv.base, job.id, undefined, 60 * 60_000)
        const completedSeconds = (Date.now() - t0) / 1000
        console.log(
          `${kind}: live import of ${image.variant}: verified boot ${bootSeconds.toFixed(1)} s, Completed ${completedSeconds.toFixed(1)} s (cap ${CAP} B/s)`,
        )
        expect([done.state, done.last_error]).toEqual(['Completed', null])
        const vol = volumePath(t.dir, job.id, done.progress.disks[0].label)
        expect(qemuPid(name)).toBe(pid)
        expect(virshText('domblklist', name)).toContain(vol)
        expect(virshText('dumpxml', name)).not.toMatch(/<backingStore type=|nbd/)
        expect(virshText('dumpxml', '--inactive', name)).toContain(vol)
        expect(JSON.parse(execFileSync('qemu-img', ['info', '-U', '--output=json', vol], { encoding: 'utf8' }))['backing-filename']).toBeUndefined()
        expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
        // a clean shutdown, then the guest's record (written at its boot, during the copy) is on the volume
        // ACPI power button, asked again every minute (an event the guest was too busy to act on
        // is not queued), for up to 15 minutes under TCG
        for (let end = Date.now() + 15 * 60_000, next = 0; Date.now() < end && virshText('domstate', name) !== 'shut off'; await Bun.sleep(2000)) {
          if (Date.now() >= next) {
            virshText('shutdown', '--mode', 'acpi', name)
            next = Date.now() + 60_000
          }
        }
        expect(virshText('domstate', name)).toBe('shut off')
        const record = readGuestRecord([vol])
        console.log(`${kind}: ${GUEST_RECORD_FILE}: ${record.trim()}`)
        expect(record).toContain('multi-user.target=')
        console.log(`${kind}: ${fsckImage(vol).join('; ')}`)
        await cleanupDomains(name)
      },
      60 * 60_000,
    )
  }
})
