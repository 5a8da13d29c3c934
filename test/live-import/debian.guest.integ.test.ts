/**
 * Live import of a real Debian guest of the test matrix (fixtures/guest-image.ts, variant
 * `noconsole`: BIOS, no serial console, so the boot check reads the guest's screen; the boot
 * record unit appends a line to GUEST_RECORD_FILE at every boot) through the HTTP API, real libvirt + qemu (TCG), file sink, the
 * copy capped with MIGRATOR_COPY_MAX_BYTES_PER_SECOND so that it takes minutes:
 * - the boot is verified (the guest's own evidence) while the job still copies;
 * - at Completed the domain runs on the plain raw volume (no backing file, no backing store in its
 *   definition), in the same qemu process;
 * - the volume holds the record the guest wrote at this boot, during the copy.
 * Input: a VMX folder (flat VMDK). This guest does not act on an ACPI power button under TCG, so
 * no clean shutdown and `fsck -n` after it are asserted here (docs/live-import.md says so).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { GUEST_RECORD_FILE, guestImages, readGuestRecord } from '../../fixtures/guest-image.ts'
import { buildInput } from '../../fixtures/inputs.ts'
import { offlinePlan, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, virshText, qemuPid } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'lig-'
const MiB = 1024 * 1024
/** The copy cap: the guest's data (about 1 GiB allocated) takes minutes, longer than its TCG boot. */
const CAP = 8 * MiB

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

  for (const kind of ['vmx_folder'] as const) {
    const name = `lig-${kind === 'vmx_folder' ? 'vmx' : 'ova'}`
    test(
      `${kind}: boot verified while copying; Completed on the plain volume; the guest's record of this boot on it`,
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
        // the guest's record, written by its record unit at this boot while the disks were still
        // copying, is on the plain volume (read from a snapshot overlay while the guest runs)
        const record = readGuestRecord([vol])
        console.log(`${kind}: ${GUEST_RECORD_FILE}: ${record.trim()}`)
        expect(record).toContain('multi-user.target=')
        await cleanupDomains(name)
      },
      60 * 60_000,
    )
  }
})
