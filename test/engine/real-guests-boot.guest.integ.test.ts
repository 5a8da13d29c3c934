/**
 * The boot check without a serial console, and UEFI guests whose boot entry lived in VMware's NVRAM
 * (docs/boot-check.md). Real Debian 12 guests (fixtures/guest-image.ts, boot-check variants, each
 * with a unit that appends every boot to /var/lib/migrator-test/boots on its disk), exported as
 * VMware does (VMX folder: PVSCSI, vmxnet3, monolithicSparse VMDK; the UEFI guest also as an OVA),
 * imported through the HTTP API (file sink, libvirt + qemu under TCG, no serial pattern):
 * - `noconsole` (no console=ttyS0 anywhere: nothing on the serial port): `Completed`, the boot
 *   verified by the guest's screen (OCR of tty1, or of tty2's getty when tty1 went quiet without a
 *   prompt) before the timeout; never a verification from the serial port;
 * - `uefi-distro` (GRUB only at \EFI\debian\grubx64.efi, no removable path), VMX and OVA: the
 *   migrator copies the fallback loader onto the destination's ESP, the guest boots and the job
 *   records how;
 * - `uefi-noloader` (an empty ESP): `E_MIG_GUEST_BOOT_FAILED` from OVMF's own words (UEFI Shell,
 *   "BdsDxe: failed to load"), far before the boot timeout.
 * Each booted guest's own record (read from the destination volume with debugfs after the domain is
 * destroyed) proves the boot, not the job's claim. Jobs run two at a time.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, mkdirSync, readdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { GUEST_RECORD_FILE, GUEST_TEST_BOOT_TIMEOUT_S, GUEST_TEST_VCPUS, guestImages, type GuestImage, type GuestVariant } from '../../fixtures/guest-image.ts'
import { buildInput, type ExportHardware } from '../../fixtures/inputs.ts'
import { offlinePlan, openStream, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, virshText } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'i45b-'
/** The base image's root partition (p3) starts at sector 135168 (fixtures/guest-image.ts `buildBase`). */
const ROOT_OFFSET = 135168 * 512

interface Case {
  id: string
  variant: GuestVariant
  kind: string
  hw: ExportHardware
}

const CASES: Case[] = [
  { id: 'uefi-noloader', variant: 'uefi-noloader', kind: 'vmx_folder', hw: { controller: 'pvscsi', firmware: 'efi' } },
  { id: 'noconsole', variant: 'noconsole', kind: 'vmx_folder', hw: { controller: 'pvscsi', firmware: 'bios' } },
  { id: 'uefi-distro-vmx', variant: 'uefi-distro', kind: 'vmx_folder', hw: { controller: 'pvscsi', firmware: 'efi' } },
  { id: 'uefi-distro-ova', variant: 'uefi-distro', kind: 'ova_archive', hw: { firmware: 'efi' } },
]

interface Outcome {
  job: any
  serial: string
  /** Seconds from `Starting` (SSE) to the job's end. */
  startingToEnd: number
  /** The guest's boot record read from the destination volume after the domain was destroyed ('' when absent). */
  record: string
  /** `mdir` of the destination ESP's \EFI\BOOT ('' when absent). */
  espBoot: string
}

describe('boot evidence without a serial console; UEFI guests without the removable-path loader (TCG)', () => {
  const t = tempDir('mig-i45b-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let images: Record<GuestVariant, GuestImage>
  let stream: ReturnType<typeof openStream>
  const outcomes = new Map<string, Promise<Outcome>>()

  async function outcomeOf(job: { id: string }, name: string): Promise<Outcome> {
    const done = await waitJob(srv.base, job.id, undefined, 40 * 60_000)
    for (let i = 0; i < 100 && !stream.events.some((e) => e.event === 'migration' && e.data.id === job.id && e.data.state === done.state); i++)
      await Bun.sleep(50)
    const startingAt = stream.events.find((e) => e.event === 'migration' && e.data.id === job.id && e.data.state === 'Starting')?.data.updated_at
    let serial = ''
    try {
      serial = readFileSync(path.join(t.dir, 'logs', `${job.id}.serial.log`), 'latin1')
    } catch {
      serial = ''
    }
    const dir = path.join(t.dir, 'volumes', 'migrations', job.id)
    const vol = path.join(dir, readdirSync(dir).find((f) => f.endsWith('.img'))!)
    const readRecord = () => {
      try {
        return execFileSync('debugfs', ['-R', `cat ${GUEST_RECORD_FILE}`, `${vol}?offset=${ROOT_OFFSET}`], {
          encoding: 'utf8',
          stdio: ['ignore', 'pipe', 'ignore'],
        })
      } catch {
        return ''
      }
    }
    // The record unit runs after multi-user.target, which can be the boot check's own evidence:
    // give a booted guest time to write and sync it before the power is cut.
    if (done.state === 'Completed') {
      for (let i = 0; i < 120 && !/multi-user\.target=/.test(readRecord()); i++) await Bun.sleep(1000)
    }
    virshText('destroy', name)
    const record = readRecord()
    let espBoot = ''
    try {
      espBoot = execFileSync('mdir', ['-i', `${vol}@@${4096 * 512}`, '-b', '::/EFI/BOOT'], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'ignore'],
        env: { ...process.env, MTOOLS_SKIP_CHECK: '1' },
      })
    } catch {
      espBoot = ''
    }
    return {
      job: done,
      serial,
      startingToEnd: startingAt ? (Date.parse(done.finished_at) - Date.parse(startingAt)) / 1000 : Number.NaN,
      record,
      espBoot,
    }
  }

  beforeAll(async () => {
    images = guestImages()
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir, {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: String(GUEST_TEST_BOOT_TIMEOUT_S),
      MIGRATOR_MAX_JOBS: '2',
    })
    stream = openStream(srv.base)
    await stream.ready
    for (const c of CASES) {
      const input = buildInput(c.kind, importRoot, `in-${c.id}`, [images[c.variant].path], {}, { ...c.hw, vcpus: GUEST_TEST_VCPUS })
      const name = `${PREFIX}${c.id}`
      const job = await submit(srv.base, offlinePlan(c.kind, path.relative(importRoot, input.path), { name }))
      outcomes.set(c.id, outcomeOf(job, name))
    }
  }, 45 * 60_000)

  afterAll(async () => {
    stream?.close()
    await srv?.stop()
    await cleanupDomains(PREFIX)
    t.cleanup()
  })

  const report = (id: string, o: Outcome) =>
    console.log(
      `${id}: ${o.job.state}, Starting -> end ${o.startingToEnd.toFixed(1)} s, boot ${JSON.stringify(o.job.hardware?.boot)}, uefi_boot ${JSON.stringify(o.job.hardware?.uefi_boot)}` +
        (o.job.last_error ? `, error ${o.job.last_error.code}: ${String(o.job.last_error.message).slice(0, 1200)}` : '') +
        `, guest record ${JSON.stringify(o.record.trim())}` +
        (o.job.hardware?.boot?.verified ? '' : `\nserial tail:\n${o.serial.split(/\r?\n/).slice(-25).join('\n')}`),
    )

  test(
    'noconsole guest (VMX, PVSCSI): Completed, verified by its screen; the guest recorded its boot',
    async () => {
      const o = await outcomes.get('noconsole')!
      report('noconsole', o)
      expect(o.job.state).toBe('Completed')
      // Nothing on the serial port could have decided it.
      expect(/login:/.test(o.serial)).toBe(false)
      // A login prompt or systemd's multi-user line on tty1, or getty's prompt on tty2 when later
      // kernel messages scrolled tty1's away, whichever the OCR read first; before the timeout.
      expect([o.job.last_error, o.job.hardware.boot.verified, o.job.hardware.boot.source]).toEqual([null, true, 'screen'])
      expect(o.job.hardware.boot.evidence).toMatch(/(login prompt|multi-user target) on the guest's (screen|second virtual console)/)
      expect(o.startingToEnd).toBeLessThan(GUEST_TEST_BOOT_TIMEOUT_S)
      expect(o.record).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ multi-user\.target=active$/m)
    },
    45 * 60_000,
  )

  for (const id of ['uefi-distro-vmx', 'uefi-distro-ova']) {
    test(
      `${id}: the fallback loader is installed on the destination ESP, the guest boots (its own record), the job says how`,
      async () => {
        const o = await outcomes.get(id)!
        report(id, o)
        expect([o.job.state, o.job.last_error]).toEqual(['Completed', null])
        expect(o.job.hardware.firmware).toBe('efi')
        expect(o.job.hardware.uefi_boot).toEqual({
          method: 'fallback-installed',
          loader: '\\EFI\\debian\\grubx64.efi',
          detail: expect.stringContaining('copied to \\EFI\\BOOT\\'),
        })
        expect(o.job.hardware.boot.verified).toBe(true)
        expect(o.espBoot.toUpperCase()).toContain('BOOTX64.EFI')
        expect(o.record).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ multi-user\.target=active$/m)
      },
      45 * 60_000,
    )
  }

  test(
    'uefi-noloader (empty ESP): E_MIG_GUEST_BOOT_FAILED from OVMF words, far before the timeout, never Completed',
    async () => {
      const o = await outcomes.get('uefi-noloader')!
      report('uefi-noloader', o)
      expect(o.job.state).toBe('Failed')
      expect(o.job.last_error.code).toBe('E_MIG_GUEST_BOOT_FAILED')
      expect(o.job.last_error.message).toContain('dropped to its UEFI Shell')
      expect(o.job.last_error.message).toContain('BdsDxe: failed to load Boot0001')
      expect(o.job.last_error.message).toContain('grub-install --removable')
      expect(o.job.hardware.uefi_boot.method).toBe('none')
      expect(o.job.hardware.boot).toMatchObject({ verified: false, source: 'serial' })
      // Decided on evidence far before the boot timeout: the boot check's own wait (from the
      // domain's start), not Starting -> end, which also holds the inspection of a loaded host.
      const waited = Number(/; state [^;]* after (\d+(?:\.\d+)?) s;/.exec(o.job.last_error.message)?.[1])
      expect(waited).toBeLessThan(GUEST_TEST_BOOT_TIMEOUT_S / 3)
      expect(o.record).toBe('')
    },
    45 * 60_000,
  )
})
