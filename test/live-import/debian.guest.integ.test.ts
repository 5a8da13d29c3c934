/**
 * Live import of a real Debian guest of the test matrix (fixtures/guest-image.ts, variant
 * `noconsole`: BIOS, no serial console, so the boot check reads the guest's screen; the boot
 * record unit appends a line to GUEST_RECORD_FILE at every boot) through the HTTP API, real
 * libvirt + qemu (TCG), file sink, from three inputs at once: a VMX folder (monolithic sparse
 * VMDK), an OVA (stream-optimized VMDK: compressed grains) and a qcow2 image, the copy of each
 * capped with MIGRATOR_COPY_MAX_BYTES_PER_SECOND so that it takes minutes. For each:
 * - the boot is verified (the guest's own evidence) while the job still copies;
 * - at Completed the domain runs on the plain raw volume (no backing file, no backing store in its
 *   definition), in the same qemu process, the live directory gone;
 * - then shut down cleanly (the guest ignores ACPI under TCG: Ctrl+Alt+Del with the reboot action
 *   `destroy`, see cleanShutdown): its root file system on the volume is clean (no
 *   `needs_recovery`, `e2fsck -f -n` finds nothing) and holds the record the guest wrote at this
 *   boot, during the copy.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { GUEST_RECORD_FILE, guestImages } from '../../fixtures/guest-image.ts'
import { buildInput } from '../../fixtures/inputs.ts'
import { checkExt4 } from '../helpers/guest-fs.ts'
import { offlinePlan, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanShutdown, cleanupDomains, ensureLibvirt, virshText, qemuPid } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'lig-'
const MiB = 1024 * 1024
/**
 * The copy cap of each job: the guest's data (about 1 GiB allocated) takes minutes, longer than
 * three TCG boots at once.
 */
const CAP = 6 * MiB
const KINDS = [
  ['vmx_folder', 'lig-vmx'],
  ['ova_archive', 'lig-ova'],
  ['qcow2', 'lig-qcow2'],
] as const

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
      MIGRATOR_MAX_JOBS: String(KINDS.length),
    })
  }, 60 * 60_000)

  afterAll(async () => {
    await srv?.stop()
    await cleanupDomains(PREFIX)
    t.cleanup()
  }, 120_000)

  test(
    "VMX folder, OVA and qcow2 at once: boot verified while copying; Completed on the plain volume; clean after a clean shutdown, the guest's record of this boot on it",
    async () => {
      const image = guestImages().noconsole
      // the source holds no record: any on a volume was written by the imported guest
      expect(checkExt4(image.path, 'root', [GUEST_RECORD_FILE]).files[GUEST_RECORD_FILE]).toBe('')
      const t0 = Date.now()
      const jobs = []
      for (const [kind, name] of KINDS) {
        const input = buildInput(kind, importRoot, name, [image.path])
        jobs.push({ kind, name, job: await submit(srv.base, offlinePlan(kind, path.relative(importRoot, input.path), { name, live_import: true })) })
      }
      console.log(`inputs built and submitted in ${((Date.now() - t0) / 1000).toFixed(1)} s`)
      await Promise.all(
        jobs.map(async ({ kind, name, job }) => {
          const live = await waitJob(srv.base, job.id, (j) => !!j.hardware?.boot || ['completed', 'failed', 'cancelled'].includes(j.status), 30 * 60_000)
          const bootSeconds = (Date.now() - t0) / 1000
          console.log(
            `${kind}: boot verdict after ${bootSeconds.toFixed(1)} s: ${JSON.stringify(live.hardware?.boot)?.slice(0, 300)} progress ${live.progress.bytes_done}/${live.progress.bytes_total} last_error ${JSON.stringify(live.last_error)}`,
          )
          expect([kind, live.state, live.status, live.domain]).toEqual([kind, 'CopyingFull', 'running', name])
          expect([kind, live.hardware.boot.verified]).toEqual([kind, true])
          expect(live.progress.bytes_done).toBeLessThan(live.progress.bytes_total)
          expect(virshText('dumpxml', name)).toContain("protocol='nbd'")
          const pid = qemuPid(name)
          const done = await waitJob(srv.base, job.id, undefined, 60 * 60_000)
          console.log(
            `${kind}: live import of ${image.variant}: verified boot ${bootSeconds.toFixed(1)} s, Completed ${((Date.now() - t0) / 1000).toFixed(1)} s (cap ${CAP} B/s)`,
          )
          expect([kind, done.state, done.last_error]).toEqual([kind, 'Completed', null])
          const vol = volumePath(t.dir, job.id, done.progress.disks[0].label)
          expect(qemuPid(name)).toBe(pid)
          expect(virshText('domblklist', name)).toContain(vol)
          expect(virshText('dumpxml', name)).not.toMatch(/<backingStore type=|nbd/)
          expect(virshText('dumpxml', '--inactive', name)).toContain(vol)
          expect(JSON.parse(execFileSync('qemu-img', ['info', '-U', '--output=json', vol], { encoding: 'utf8' }))['backing-filename']).toBeUndefined()
          expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
          // a clean shutdown, then the root file system as the guest left it on the volume: clean,
          // with the record its unit wrote at this boot while the disks were still copying
          expect(await cleanShutdown(name)).toBe('shutdown')
          const fs = checkExt4(vol, 'root', [GUEST_RECORD_FILE])
          console.log(`${kind}: root file system ${fs.state}, e2fsck -f -n ${fs.fsckCode}; ${GUEST_RECORD_FILE}: ${fs.files[GUEST_RECORD_FILE]!.trim()}`)
          expect([kind, fs.state, fs.features.includes('needs_recovery'), fs.fsckCode]).toEqual([kind, 'clean', false, 0])
          expect(fs.files[GUEST_RECORD_FILE]).toContain('multi-user.target=')
        }),
      )
    },
    60 * 60_000,
  )
})
