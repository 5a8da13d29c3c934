/**
 * vSphere `VirtualMachine` properties -> {@link VmManifest} (spec 2.5; vSphere API reference:
 * `VirtualMachineConfigInfo`, `VirtualHardware`, `VirtualDisk`, `VirtualEthernetCard`,
 * `VirtualController`).
 */
import { guestFamilyOf, sanitizeLabel, type ControllerBus, type ManifestDisk, type ManifestNic, type VmManifest } from '../../manifest.ts'
import { normalizeMac } from '../../mac.ts'
import { arr, bool, int, txt, xsiType, type XNode } from './soap.ts'

/** The VM properties {@link manifestOf} reads, in one `RetrievePropertiesEx`. */
export const VM_PATHS = [
  'name',
  'config.guestId',
  'config.firmware',
  'config.bootOptions',
  'config.hardware.numCPU',
  'config.hardware.numCoresPerSocket',
  'config.hardware.memoryMB',
  'config.hardware.device',
  'config.changeTrackingEnabled',
  'runtime.powerState',
] as const

/** A virtual disk as vSphere reports it. `capacityBytes` in bytes. */
export interface VimDisk {
  key: number
  fileName: string
  capacityBytes: number
  controllerKey: number | null
  unitNumber: number | null
  backingType: string
  changeId: string | null
  /** The backing chain below `fileName` (`backing.parent.fileName`, parent first): a snapshot's delta disks down to the base disk. */
  parents: string[]
}

const CONTROLLERS: Record<string, ControllerBus> = {
  VirtualLsiLogicController: 'scsi',
  VirtualLsiLogicSASController: 'scsi',
  ParaVirtualSCSIController: 'scsi',
  VirtualBusLogicController: 'scsi',
  VirtualIDEController: 'ide',
  VirtualAHCIController: 'sata',
  VirtualSATAController: 'sata',
  VirtualNVMEController: 'nvme',
}

const NIC_MODELS: Record<string, string> = {
  VirtualE1000: 'e1000',
  VirtualE1000e: 'e1000e',
  VirtualVmxnet: 'vmxnet',
  VirtualVmxnet2: 'vmxnet2',
  VirtualVmxnet3: 'vmxnet3',
  VirtualVmxnet3Vrdma: 'vmxnet3',
  VirtualPCNet32: 'pcnet32',
  VirtualSriovEthernetCard: 'sriov',
}

/** The devices of a `config.hardware.device` value (an `ArrayOfVirtualDevice`). */
export function devicesOf(v: XNode): XNode[] {
  return arr(v?.VirtualDevice)
}

/** The virtual disks among `devices`, in device-key order ("Hard disk 1" first). */
export function disksOf(devices: XNode[]): VimDisk[] {
  const out: VimDisk[] = []
  for (const d of devices) {
    if (xsiType(d) !== 'VirtualDisk') continue
    const key = int(d.key)
    const fileName = txt(d.backing?.fileName)
    if (key === null || !fileName) continue
    const bytes = int(d.capacityInBytes) ?? (int(d.capacityInKB) ?? 0) * 1024
    const parents: string[] = []
    for (let b = d.backing?.parent; b && parents.length < 64; b = b.parent) {
      const name = txt(b.fileName)
      if (!name) break
      parents.push(name)
    }
    out.push({
      key,
      fileName,
      capacityBytes: bytes,
      controllerKey: int(d.controllerKey),
      unitNumber: int(d.unitNumber),
      backingType: xsiType(d.backing) ?? 'unknown',
      changeId: txt(d.backing?.changeId) || null,
      parents,
    })
  }
  return out.sort((a, b) => a.key - b.key)
}

/** Stable labels per disk key: the disk file's base name, made unique. */
export function diskLabels(disks: VimDisk[]): Map<number, string> {
  const labels = new Map<number, string>()
  const used = new Set<string>()
  for (const d of disks) {
    const base = sanitizeLabel((d.fileName.split('/').pop() ?? d.fileName).replace(/^\[[^\]]*\]\s*/, '').replace(/\.vmdk$/i, ''))
    let label = base
    for (let i = 2; used.has(label); i++) label = `${base}_${i}`
    used.add(label)
    labels.set(d.key, label)
  }
  return labels
}

/**
 * The manifest of a VM from its {@link VM_PATHS} properties. Disks keep their datastore path in
 * `source.path` and their device key in `source.device_key`; `cbt_available` is
 * `config.changeTrackingEnabled`. RDM and non-flat backings are listed with a warning.
 */
export function manifestOf(props: Record<string, XNode>): VmManifest {
  const warnings: string[] = []
  const devices = devicesOf(props['config.hardware.device'])
  const controllers = new Map<number, { bus: ControllerBus; busNumber: number }>()
  for (const d of devices) {
    const t = xsiType(d)
    const key = int(d.key)
    if (t && key !== null && CONTROLLERS[t]) controllers.set(key, { bus: CONTROLLERS[t], busNumber: int(d.busNumber) ?? 0 })
  }
  const vdisks = disksOf(devices)
  const labels = diskLabels(vdisks)
  const disks: ManifestDisk[] = vdisks.map((d) => {
    const c = d.controllerKey !== null ? controllers.get(d.controllerKey) : undefined
    if (d.backingType.startsWith('VirtualDiskRawDiskMapping')) warnings.push(`${d.fileName}: a raw device mapping; physical-mode RDMs cannot be snapshotted`)
    else if (
      d.backingType !== 'VirtualDiskFlatVer2BackingInfo' &&
      d.backingType !== 'VirtualDiskSparseVer2BackingInfo' &&
      d.backingType !== 'VirtualDiskSeSparseBackingInfo'
    )
      warnings.push(`${d.fileName}: disk backing ${d.backingType}`)
    return {
      label: labels.get(d.key)!,
      capacity_bytes: d.capacityBytes,
      disk_format: 'vmdk',
      source: { path: d.fileName, device_key: d.key },
      controller: c?.bus ?? 'unknown',
      address: c ? `${c.bus}${c.busNumber}:${d.unitNumber ?? 0}` : `key${d.key}`,
    }
  })
  const nics: ManifestNic[] = []
  for (const d of devices) {
    const t = xsiType(d)
    if (!t || !NIC_MODELS[t]) continue
    const network = txt(d.backing?.deviceName) ?? txt(d.backing?.port?.portgroupKey) ?? null
    nics.push({ label: txt(d.deviceInfo?.label) ?? `nic${nics.length}`, mac: normalizeMac(txt(d.macAddress)), model: NIC_MODELS[t], network })
  }
  const guestId = txt(props['config.guestId']) || null
  const cpus = Math.max(1, int(props['config.hardware.numCPU']) ?? 1)
  const cps = Math.max(1, int(props['config.hardware.numCoresPerSocket']) ?? 1)
  return {
    name: txt(props.name) ?? 'vm',
    source_format: 'vim_api',
    guest_os: { family: guestFamilyOf(guestId), id: guestId },
    firmware: txt(props['config.firmware']) === 'efi' ? 'efi' : 'bios',
    secure_boot: bool(props['config.bootOptions']?.efiSecureBootEnabled) === true,
    cpu: { count: cpus, cores_per_socket: cpus % cps === 0 ? cps : 1 },
    memory_bytes: Math.max(0, int(props['config.hardware.memoryMB']) ?? 0) * 1024 * 1024,
    disks,
    nics,
    cbt_available: bool(props['config.changeTrackingEnabled']) === true,
    warnings,
  }
}
