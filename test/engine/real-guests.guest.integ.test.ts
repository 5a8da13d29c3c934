/**
 * Real Debian 12 guests (fixtures/guest-image.ts: debootstrap, linux-image-amd64, GRUB, a systemd
 * unit after local-fs.target printing a marker on ttyS0), exported as other hypervisors would and
 * imported through the HTTP API (file sink, libvirt + qemu under TCG, no
 * MIGRATOR_BOOT_SERIAL_PATTERN): each guest must reach its marker, the job must record the disk bus
 * and NIC model it chose and a verified boot; the guest whose root UUID does not exist must end
 * `E_MIG_GUEST_BOOT_FAILED` fast, never `Completed`.
 *
 * A representative matrix, not the cartesian product (docs/architecture.md "Bootable hardware and the boot check"):
 * - generic initramfs, OVA (streamOptimized VMDK)             -> virtio-blk
 * - host-only PVSCSI initramfs, VMX folder (PVSCSI, monolithicSparse, vmxnet3) -> pvscsi
 * - host-only SATA (AHCI) initramfs, VirtualBox folder (.vbox + VDI) -> sata
 * - host-only LSI Logic SAS initramfs, VHDX (no descriptor)   -> no controller qemu emulates can
 *   boot it as it is (qemu's mptsas1068 presents no disk to Linux's mptsas, measured): converted
 *   in place with virt-v2v-in-place (initramfs rebuilt with virtio), inspected again -> virtio-blk
 * - /dev/sda3 in fstab and on the kernel line, VMDK           -> virtio-scsi (sd names)
 * - root UUID that does not exist, OVA                        -> E_MIG_GUEST_BOOT_FAILED before start
 * UEFI guests boot in test/engine/real-guests-boot.guest.integ.test.ts (uefi-distro, VMX and OVA); the
 * choice of efi for a disk without BIOS boot code is in test/domain/hardware.test.ts.
 * The jobs run on one server two at a time; each domain is destroyed as soon as its job ends.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import {
  GUEST_MARKER,
  GUEST_TEST_BOOT_TIMEOUT_S,
  GUEST_TEST_VCPUS,
  guestBuildTimings,
  guestImages,
  type GuestImage,
  type GuestVariant,
} from '../../fixtures/guest-image.ts'
import { buildInput, type ExportHardware } from '../../fixtures/inputs.ts'
import { offlinePlan, openStream, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, virshText } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'i11-'

interface Case {
  variant: GuestVariant
  kind: string
  hw?: ExportHardware
  disk_bus: string
  firmware: 'bios' | 'efi'
}

const CASES: Case[] = [
  { variant: 'generic', kind: 'ova_archive', disk_bus: 'virtio-blk', firmware: 'bios' },
  { variant: 'pvscsi', kind: 'vmx_folder', hw: { controller: 'pvscsi' }, disk_bus: 'pvscsi', firmware: 'bios' },
  { variant: 'sata', kind: 'vbox_folder', disk_bus: 'sata', firmware: 'bios' },
  { variant: 'lsisas', kind: 'vhdx', disk_bus: 'virtio-blk', firmware: 'bios' },
  { variant: 'sdx', kind: 'vmdk', disk_bus: 'virtio-scsi', firmware: 'bios' },
]

/** What a finished job left: the job, its serial log, the domain state and XML at the end (then the domain is destroyed). */
interface Outcome {
  job: any
  serial: string
  domstate: string
  xml: string
  states: string[]
  /** `updated_at` of the job when it entered Starting (ISO), from the SSE stream. */
  startingAt: string | null
}

describe('real Debian guests boot after import (TCG), and Completed means booted', () => {
  const t = tempDir('mig-i11-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let images: Record<GuestVariant, GuestImage>
  const outcomes = new Map<string, Promise<Outcome>>()
  let stream: ReturnType<typeof openStream>

  /** Waits for the end of a submitted job; then reads its serial log, the domain's state and XML, and destroys the domain. */
  async function outcomeOf(job: { id: string }, name: string): Promise<Outcome> {
    // Measured from submission: a job may wait behind two slow TCG boots on a loaded host.
    const done = await waitJob(srv.base, job.id, undefined, 40 * 60_000)
    // The SSE event of the final state may arrive just after the job reads as ended.
    for (let i = 0; i < 100 && !stream.events.some((e) => e.event === 'migration' && e.data.id === job.id && e.data.state === done.state); i++)
      await Bun.sleep(50)
    let serial = ''
    try {
      serial = readFileSync(path.join(t.dir, 'logs', `${job.id}.serial.log`), 'latin1')
    } catch {
      serial = ''
    }
    const out: Outcome = {
      job: done,
      serial,
      domstate: virshText('domstate', name),
      xml: virshText('dumpxml', name),
      states: stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id).map((e) => e.data.state),
      startingAt: stream.events.find((e) => e.event === 'migration' && e.data.id === job.id && e.data.state === 'Starting')?.data.updated_at ?? null,
    }
    virshText('destroy', name) // free the CPU for the other boots
    return out
  }

  beforeAll(async () => {
    const t0 = Date.now()
    images = guestImages()
    const timings = guestBuildTimings()
    console.log(`guest images ready in ${((Date.now() - t0) / 1000).toFixed(1)} s (build timings: ${JSON.stringify(timings)})`)
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
    // The broken guest first: it never boots, so its job ends at once and does not wait behind boots.
    const all: Array<{ variant: GuestVariant; kind: string; hw?: ExportHardware }> = [{ variant: 'broken', kind: 'ova_archive' }, ...CASES]
    for (const c of all) {
      const input = buildInput(c.kind, importRoot, `in-${c.variant}`, [images[c.variant].path], {}, { ...c.hw, vcpus: GUEST_TEST_VCPUS })
      const plan = (name: string) => offlinePlan(c.kind, path.relative(importRoot, input.path), { name })
      const job = await submit(srv.base, plan(`${PREFIX}${c.variant}`))
      outcomes.set(
        c.variant,
        (async () => {
          const first = await outcomeOf(job, `${PREFIX}${c.variant}`)
          // A TCG guest starved on this 2-core host can hang with nothing on its console (seen once
          // in CI: the SATA guest printed nothing recognizable for 30 min; 14 boots under load here
          // took 56-95 s). Such an outcome (Completed, boot not verified: no evidence either way)
          // is reported and tried once more; a failure with evidence is never retried.
          if (c.variant === 'broken' || first.job.state !== 'Completed' || first.job.hardware?.boot?.verified !== false) return first
          console.log(
            `${c.variant}: boot not verified on the first try (${first.job.hardware.boot.evidence}); serial tail:\n` +
              `${first.serial
                .replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '')
                .split(/\r?\n/)
                .slice(-15)
                .join('\n')}\n-- trying once more`,
          )
          return outcomeOf(await submit(srv.base, plan(`${PREFIX}${c.variant}-2`)), `${PREFIX}${c.variant}-2`)
        })(),
      )
    }
  }, 45 * 60_000)

  afterAll(async () => {
    stream?.close()
    await srv?.stop()
    await cleanupDomains(PREFIX)
    t.cleanup()
  })

  for (const c of CASES) {
    test(
      `${c.variant} guest as ${c.kind}: Completed on ${c.disk_bus} (${c.firmware}), boot verified, marker after local-fs.target on the serial console`,
      async () => {
        const o = await outcomes.get(c.variant)!
        const boot = o.job.hardware?.boot
        console.log(
          `${c.variant}: ${o.job.state} in ${((Date.parse(o.job.finished_at) - Date.parse(o.job.created_at)) / 1000).toFixed(0)} s, ` +
            `bus ${o.job.hardware?.disk_bus}, boot ${boot ? `${boot.verified ? 'verified' : 'NOT verified'} (${boot.evidence})` : 'none'}` +
            (o.job.last_error ? `, error ${o.job.last_error.code}: ${String(o.job.last_error.message).slice(0, 1500)}` : ''),
        )
        expect([o.job.state, o.job.last_error]).toEqual(['Completed', null])
        expect(o.states.at(-1)).toBe('Completed')
        expect(o.serial.includes(GUEST_MARKER)).toBe(true) // (not toContain: it would print the whole log)
        expect(o.domstate).toBe('running')
        expect(o.job.hardware.disk_bus).toBe(c.disk_bus)
        expect(o.job.hardware.firmware).toBe(c.firmware)
        expect(o.job.hardware.inspected).toBe(true)
        expect(o.job.hardware.boot.verified).toBe(true)
        expect(o.job.hardware.reason).toContain(`disk bus ${c.disk_bus}`)
        // Only the guest no emulated controller can boot is converted, and the record says why.
        if (c.variant === 'lsisas') expect(o.job.hardware.reason).toContain('converted with virt-v2v-in-place because initramfs')
        else expect(o.job.hardware.reason).not.toContain('converted')
        // The guests have virtio_net installed: virtio NIC, whatever the source had.
        expect(o.job.hardware.nic_model).toBe('virtio')
        expect(o.xml).toContain("<panic model='isa'")
        if (c.firmware === 'efi') expect(o.xml).toContain('OVMF_CODE')
        if (c.disk_bus === 'pvscsi') expect(o.xml).toContain("model='vmpvscsi'")
        if (c.disk_bus === 'sata') expect(o.xml).toContain("bus='sata'")
      },
      45 * 60_000,
    )
  }

  test(
    'broken guest (root UUID that does not exist): E_MIG_GUEST_BOOT_FAILED naming the UUID, fast, never Completed, domain defined but not running',
    async () => {
      const o = await outcomes.get('broken')!
      expect(o.job.state).toBe('Failed')
      expect(o.job.last_error.code).toBe('E_MIG_GUEST_BOOT_FAILED')
      expect(o.job.last_error.fatal).toBe(true)
      expect(o.job.last_error.message).toContain('root device UUID=00000000-dead-beef-0000-000000000000')
      expect(o.states).not.toContain('Completed')
      expect(o.states).toContain('Starting')
      expect(o.job.hardware.boot).toBeNull()
      expect(o.job.domain).toBe(`${PREFIX}broken`)
      expect(o.domstate).toBe('shut off')
      // Decided from evidence, not after a blind timeout: far less than the boot timeout.
      expect(o.startingAt).not.toBeNull()
      const startingToEnd = (Date.parse(o.job.finished_at) - Date.parse(o.startingAt!)) / 1000
      console.log(`broken guest: Starting -> Failed in ${startingToEnd.toFixed(1)} s (boot timeout ${GUEST_TEST_BOOT_TIMEOUT_S} s)`)
      expect(startingToEnd).toBeLessThan(GUEST_TEST_BOOT_TIMEOUT_S / 2)
    },
    45 * 60_000,
  )
})
