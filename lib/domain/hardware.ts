/**
 * The destination's disk bus, NIC model and firmware, chosen from the static inspection of the
 * copied guest (lib/domain/inspect.ts) so that the guest boots without being modified
 * (docs/architecture.md "Bootable hardware and the boot check"):
 *
 * - Disk bus: the first controller, in this order, whose driver the guest's boot path has (its
 *   initramfs or the kernel's built-ins) and whose device names match what the guest's kernel line
 *   and fstab use (`/dev/vdX` needs virtio-blk, `/dev/sdX` a SCSI/SATA bus, `UUID=`/`LABEL=` any):
 *   virtio-blk (`virtio_blk` + `virtio_pci`), virtio-scsi (`virtio_scsi` + `sd_mod`), VMware PVSCSI
 *   (`vmw_pvscsi`), LSI Logic SAS 1068 (`mptsas`), LSI 53C895A (`sym53c8xx`), SATA/AHCI (`ahci`),
 *   IDE (`ata_piix`). qemu 7.2 emulates each. A host-only initramfs built on VMware hardware thus
 *   boots on the controller it was built for instead of failing on virtio.
 * - NIC: `virtio` when the guest has `virtio_net` installed, else `vmxnet3`, `e1000e`, `e1000`,
 *   `rtl8139` (8139cp/8139too), in that order (NIC drivers load from the root file system).
 * - Firmware: `plan.firmware`, else the manifest's; a disk with no BIOS boot code in its MBR but a
 *   FAT (EFI system) partition is started with UEFI even when the descriptor says nothing.
 * - Fatal findings (the guest cannot boot on any hardware here; `E_MIG_GUEST_BOOT_FAILED` before the
 *   start): the kernel's `root=` (or fstab's `/`) names a `UUID=`/`LABEL=` no file system of the
 *   guest has; the initramfs has no driver for any controller above.
 * - Not inspected (bare boot sectors, Windows, a failed inspection): the guest family's defaults
 *   (`defaultDiskBus`, `defaultNicModel` of lib/domain/xml.ts); when the disk has partitions or a
 *   file system (the inspection failed) the boot check still waits for serial evidence.
 */
import type { HardwareRecord } from '../job.ts'
import type { GuestFamily } from '../manifest.ts'
import type { GuestInspection } from './inspect.ts'
import { defaultDiskBus, defaultNicModel, type DiskBus, type NicModel, type ScsiModel } from './xml.ts'

/** The choice: the job's record fields, how the domain XML spells it, and a fatal finding if any. */
export interface HardwareChoice {
  disk_bus: HardwareRecord['disk_bus']
  nic_model: HardwareRecord['nic_model']
  firmware: 'bios' | 'efi'
  reason: string
  /** libvirt `<target bus>` of every disk and the SCSI controller model when the bus is `scsi`. */
  bus: DiskBus
  scsiModel: ScsiModel | null
  nicModel: NicModel
  /** Why the guest cannot boot here (static evidence), or null. */
  fatal: string | null
  /**
   * The only fatal finding is a missing controller driver in a Linux guest libguestfs inspected:
   * converting it (virt-v2v-in-place: initramfs with virtio) makes it bootable.
   */
  convertible: boolean
  /** The guest writes its boot to the serial console (`console=ttyS…` on its kernel line). */
  serialConsole: boolean
}

interface Candidate {
  disk_bus: HardwareRecord['disk_bus']
  bus: DiskBus
  scsiModel: ScsiModel | null
  needs: string[]
  names: 'vd' | 'sd'
}

/**
 * Why LSI Logic SAS is no candidate: qemu 7.2's `mptsas1068` device is found by Linux 6.1's
 * mptsas driver (`LSISAS1068 A0` host) but presents no disk to it, so a guest whose initramfs has
 * only mptsas never finds its root (measured with a Debian 12 guest, generic and host-only
 * initramfs alike). Such a guest is refused before its start with this fix.
 */
const UNUSABLE_LSISAS =
  "qemu's LSI SAS 1068 emulation presents no disk to that driver: add virtio_blk (or ahci) to the guest's initramfs on the source (initramfs-tools MODULES=most, dracut --add-drivers) and export it again"

const CANDIDATES: Candidate[] = [
  { disk_bus: 'virtio-blk', bus: 'virtio', scsiModel: null, needs: ['virtio_blk', 'virtio_pci'], names: 'vd' },
  { disk_bus: 'virtio-scsi', bus: 'scsi', scsiModel: 'virtio-scsi', needs: ['virtio_scsi', 'virtio_pci', 'sd_mod'], names: 'sd' },
  { disk_bus: 'pvscsi', bus: 'scsi', scsiModel: 'vmpvscsi', needs: ['vmw_pvscsi', 'sd_mod'], names: 'sd' },
  { disk_bus: 'lsilogic', bus: 'scsi', scsiModel: 'lsilogic', needs: ['sym53c8xx', 'sd_mod'], names: 'sd' },
  { disk_bus: 'sata', bus: 'sata', scsiModel: null, needs: ['ahci', 'sd_mod'], names: 'sd' },
  { disk_bus: 'ide', bus: 'ide', scsiModel: null, needs: ['ata_piix', 'sd_mod'], names: 'sd' },
]

const NICS: Array<[HardwareRecord['nic_model'], string[]]> = [
  ['virtio', ['virtio_net']],
  ['vmxnet3', ['vmxnet3']],
  ['e1000e', ['e1000e']],
  ['e1000', ['e1000']],
  ['rtl8139', ['8139cp', '8139too']],
]

/** The job record's name of a libvirt bus (and SCSI controller model). */
export function recordOfBus(bus: DiskBus, scsiModel: ScsiModel | null): HardwareRecord['disk_bus'] {
  if (bus === 'virtio') return 'virtio-blk'
  if (bus === 'scsi')
    return scsiModel === 'vmpvscsi' ? 'pvscsi' : scsiModel === 'lsisas1068' ? 'lsisas1068' : scsiModel === 'lsilogic' ? 'lsilogic' : 'virtio-scsi'
  return bus
}

/** The device name family a root/fstab spec needs: `vd`, `sd`, `hd`, or null (UUID=, LABEL=, ...). */
export function nameFamily(spec: string | null | undefined): 'vd' | 'sd' | 'hd' | null {
  const m = spec ? /^\/dev\/(vd|sd|hd|xvd)[a-z]/.exec(spec) : null
  if (!m) return null
  return m[1] === 'xvd' ? null : (m[1] as 'vd' | 'sd' | 'hd')
}

/**
 * Chooses the destination hardware (see the module comment).
 * - `inspection`: null or `inspected: false` for the family defaults.
 * - `family`: the effective guest family (plan override or detection).
 * - `firmware`: `plan.firmware` (wins) and the manifest's.
 */
export function chooseHardware(
  inspection: GuestInspection | null,
  family: GuestFamily,
  firmware: { plan?: 'bios' | 'efi'; manifest: 'bios' | 'efi' },
): HardwareChoice {
  let fw: 'bios' | 'efi' = firmware.plan ?? firmware.manifest
  const fwNotes: string[] = []
  const layout = inspection?.layout
  if (!firmware.plan && fw === 'bios' && layout && layout.partitioned && !layout.biosBootCode && inspection?.esp) {
    fw = 'efi'
    fwNotes.push('the disk has no BIOS boot code but an EFI system partition: UEFI')
  }
  const defaults = (why: string): HardwareChoice => {
    const bus = defaultDiskBus(family)
    const nic = defaultNicModel(family)
    return {
      disk_bus: recordOfBus(bus, bus === 'scsi' ? 'virtio-scsi' : null),
      nic_model: nic as HardwareRecord['nic_model'],
      firmware: fw,
      reason: [why, ...fwNotes].join('; '),
      bus,
      scsiModel: null,
      nicModel: nic,
      fatal: null,
      convertible: false,
      serialConsole: false,
    }
  }
  if (family === 'windows') return defaults('Windows guest: AHCI and e1000 (drivers in every Windows since Vista); virtio only after V2V')
  if (!inspection || !inspection.inspected) {
    const d = defaults(`not inspected (${inspection?.skipped ?? 'no inspection'}): defaults of guest family ${family}`)
    // A disk with partitions or a file system most likely holds an OS: watch its serial console
    // for evidence up to the timeout rather than the grace period only.
    const layout = inspection?.layout
    return { ...d, serialConsole: !!layout && (layout.partitioned || layout.filesystem) }
  }
  if (!inspection.os) return defaults(`libguestfs found no operating system: defaults of guest family ${family}`)
  if (inspection.os.type !== 'linux')
    return defaults(`${inspection.os.type} guest (${inspection.os.product || inspection.os.distro}): defaults of guest family ${family}`)

  const serialConsole = /(?:^|\s)console=ttyS\d/.test(inspection.kernelCmdline ?? '')
  const what = inspection.initramfs ? `initramfs ${inspection.initramfs}` : `kernel ${inspection.kernelVersion ?? '(unknown)'} (no initramfs)`
  // Static evidence that no hardware helps: the root file system named by the kernel does not exist.
  const fatal = missingRoot(inspection)
  const boot = new Set([...inspection.initramfsModules, ...inspection.builtinModules])
  const installed = new Set([...inspection.installedModules, ...inspection.builtinModules])
  const rootFstab = inspection.fstab.find((f) => f.mountpoint === '/')?.spec ?? null
  const names = nameFamily(inspection.rootSpec) ?? nameFamily(rootFstab)
  const ok = CANDIDATES.filter((c) => c.needs.every((m) => boot.has(m)) && (names === null || names === c.names))
  const nic = NICS.find(([, mods]) => inspection.installedModules.length === 0 || mods.some((m) => installed.has(m)))?.[0] ?? 'virtio'
  const nicWhy =
    inspection.installedModules.length === 0
      ? 'NIC virtio (module list unknown)'
      : `NIC ${nic} (guest has ${NICS.find(([n]) => n === nic)![1].find((m) => installed.has(m))})`
  const chosen = ok[0]
  if (!chosen) {
    const wanted = CANDIDATES.filter((c) => names === null || names === c.names)
    const sas = boot.has('mptsas') ? `; it has mptsas (LSI Logic SAS) only, and ${UNUSABLE_LSISAS}` : ''
    const missing = `${what} has no driver for ${wanted.map((c) => `${c.disk_bus} (${c.needs[0]})`).join(', ')}${sas}`
    return {
      disk_bus: names === 'vd' ? 'virtio-blk' : 'sata',
      nic_model: nic,
      firmware: fw,
      reason: [missing, nicWhy, ...fwNotes].join('; '),
      bus: names === 'vd' ? 'virtio' : 'sata',
      scsiModel: null,
      nicModel: nic,
      fatal: fatal ?? `${missing}${names ? ` whose disks are named /dev/${names}X as the guest expects` : ''}`,
      convertible: fatal === null,
      serialConsole,
    }
  }
  const skipped = CANDIDATES.slice(0, CANDIDATES.indexOf(chosen)).filter((c) => names === null || names === c.names)
  const why =
    chosen.disk_bus === 'virtio-blk'
      ? `${what} has ${chosen.needs.join(', ')}`
      : `${what} has ${chosen.needs[0]}${skipped.length ? ` but no ${skipped.map((c) => c.needs[0]).join('/')}` : ''}` +
        (names ? `; the guest names its root disk /dev/${names}X (${inspection.rootSpec ?? rootFstab})` : '') +
        ': attached on the controller the guest has drivers for, the guest is not modified'
  return {
    disk_bus: chosen.disk_bus,
    nic_model: nic,
    firmware: fw,
    reason: [`disk bus ${chosen.disk_bus}: ${why}`, nicWhy, ...fwNotes].join('; '),
    bus: chosen.bus,
    scsiModel: chosen.scsiModel,
    nicModel: nic,
    fatal,
    convertible: false,
    serialConsole,
  }
}

/** "kernel could not find root device UUID=…" when the root spec names a UUID/LABEL no guest file system has. */
function missingRoot(ins: GuestInspection): string | null {
  const specs = [ins.rootSpec, ins.fstab.find((f) => f.mountpoint === '/')?.spec].filter((s): s is string => !!s)
  for (const spec of specs) {
    const m = /^(UUID|LABEL)=(.+)$/.exec(spec)
    if (!m) continue
    const value = m[2]!.replace(/^"|"$/g, '')
    const found = ins.filesystems.some((f) => (m[1] === 'UUID' ? f.uuid.toLowerCase() === value.toLowerCase() : f.label === value))
    if (!found) {
      return `the kernel would not find its root device ${m[1]}=${value}: no file system of the guest has that ${m[1]!.toLowerCase()} (guest file systems: ${ins.filesystems.map((f) => `${f.device} ${f.type} ${f.uuid || '-'}`).join(', ') || 'none'})`
    }
  }
  return null
}
