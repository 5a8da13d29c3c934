/**
 * Hyper-V virtual machine model of a `.vmcx` configuration: the VM facts the migrator needs
 * (name, generation and firmware, secure boot, processors, memory, hard disks, network adapters)
 * read from the key tree that `vmcx-container.ts` parses. Never throws: what is absent is null
 * with a warning.
 *
 * Source: Microsoft does not document the keys; the layout followed (`configuration/properties`,
 * `configuration/settings`, the device manifest `configuration/manifest/vdevNNN` and each
 * device's settings node `configuration/_<instance>_`) is the one observed in real `.vmcx` files.
 */
import { normalizeMac } from '../mac.ts'
import { isVmcxNode, vmcxGet, type VmcxConfig, type VmcxNode, type VmcxValue } from './vmcx-container.ts'

function str(v: VmcxValue | undefined): string | null {
  return typeof v === 'string' ? v : null
}
function int(v: VmcxValue | undefined): number | null {
  return typeof v === 'number' && Number.isSafeInteger(v) ? v : null
}
function bool(v: VmcxValue | undefined): boolean | null {
  return typeof v === 'boolean' ? v : null
}

/**
 * A disk attached in the configuration. `bus`: `ide` (Emulated IDE Controller, Gen 1) or `scsi`
 * (Synthetic SCSI Controller). `controller`: IDE channel (the `controllerN` key) or the ordinal
 * of the SCSI controller among the VM's SCSI controllers; `slot`: IDE master 0 / slave 1 or SCSI
 * LUN (the `driveN` key). `address`: `<controller>:<slot>`. `pathname`: the Windows path as
 * recorded (`C:\...\disk.vhdx`); `type`: the drive type (`VHD` for a VHD/VHDX hard disk).
 * `instance`: the controller's device instance GUID.
 */
export interface VmcxDisk {
  bus: 'ide' | 'scsi'
  controller: number
  slot: number
  address: string
  pathname: string
  type: string
  instance: string
}

/**
 * A network adapter: `name` (FriendlyName), `mac` lower-case colon form or null when the MAC is
 * dynamic and not yet assigned (`00-00-00-00-00-00`), `staticMac`, `switchName` (virtual switch,
 * null when not connected), `legacy` (Emulated "Legacy Network Adapter" rather than synthetic),
 * `instance` GUID.
 */
export interface VmcxNic {
  name: string | null
  mac: string | null
  staticMac: boolean
  switchName: string | null
  legacy: boolean
  instance: string
}

/**
 * What the migrator needs from a VM configuration.
 * - `name`: `properties/name`. `configVersion`: `properties/version` (e.g. 2304 = 9.0).
 * - `generation`: 1 or 2 from `properties/subtype` (0 = Gen 1, 1 = Gen 2) cross-checked with the
 *   firmware device of the device manifest (`Microsoft Virtual BIOS` vs a UEFI device); null if
 *   neither says. `firmware`: `bios` (Gen 1) or `efi` (Gen 2). `secureBoot`: the firmware
 *   device's `secure_boot_enabled` (Gen 2 only).
 * - `cpuCount`: `settings/processors/count`. `memoryMiB`: `settings/memory/bank/size` (MB, the
 *   startup memory); `dynamicMemory`: `bank/dynamic_memory_enabled`.
 * - `disks`: hard disks of the IDE then SCSI controllers, in controller and slot order (ISO,
 *   floppy and empty drives are skipped). `nics`: adapters in device-manifest order.
 * - `guestOs`: always null for now: Hyper-V learns the guest OS at run time through the KVP
 *   exchange integration component and keeps it in the runtime state (`.vmrs`), and no key of the
 *   `.vmcx` files studied records it; the field is here so a future key can fill it.
 */
export interface VmcxVmInfo {
  name: string | null
  configVersion: number | null
  generation: 1 | 2 | null
  firmware: 'bios' | 'efi'
  secureBoot: boolean
  cpuCount: number | null
  memoryMiB: number | null
  dynamicMemory: boolean
  disks: VmcxDisk[]
  nics: VmcxNic[]
  guestOs: string | null
  warnings: string[]
}

/** One device of `configuration/manifest/vdevNNN`: `device` class GUID, `instance` GUID, `name`. */
export interface VmcxDevice {
  key: string
  device: string | null
  instance: string
  name: string
}

/** The device manifest (`configuration/manifest/vdevNNN`), in key order. */
export function vmcxDevices(cfg: VmcxConfig): VmcxDevice[] {
  const m = vmcxGet(cfg.root, 'configuration/manifest')
  if (!isVmcxNode(m)) return []
  const out: VmcxDevice[] = []
  for (const [key, v] of [...m.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))) {
    if (!/^vdev[0-9]+$/.test(key) || !isVmcxNode(v)) continue
    const instance = str(v.get('instance'))?.toLowerCase()
    if (!instance) continue
    out.push({ key, device: str(v.get('device'))?.toLowerCase() ?? null, instance, name: str(v.get('name')) ?? '' })
  }
  return out
}

/** The settings node of a device instance (`configuration/_<instance>_`). */
export function vmcxDeviceNode(cfg: VmcxConfig, instance: string): VmcxNode | null {
  const c = vmcxGet(cfg.root, 'configuration')
  if (!isVmcxNode(c)) return null
  const want = `_${instance.toLowerCase()}_`
  for (const [k, v] of c) if (k.toLowerCase() === want && isVmcxNode(v)) return v
  return null
}

function numberedKeys(node: VmcxNode, prefix: string): Array<[number, VmcxNode]> {
  const out: Array<[number, VmcxNode]> = []
  const re = new RegExp(`^${prefix}([0-9]{1,4})$`)
  for (const [k, v] of node) {
    const m = re.exec(k)
    if (m && isVmcxNode(v)) out.push([Number(m[1]), v])
  }
  return out.sort((a, b) => a[0] - b[0])
}

/**
 * Extracts the VM facts of {@link VmcxVmInfo} from a parsed configuration. Never throws: what is
 * absent is null (with a warning) so the importer can decide.
 */
export function vmcxVmInfo(cfg: VmcxConfig): VmcxVmInfo {
  const warnings: string[] = []
  const r = cfg.root
  const devices = vmcxDevices(cfg)
  if (devices.length === 0) warnings.push('the configuration has no device manifest')
  // Generation / firmware.
  const subtype = int(vmcxGet(r, 'configuration/properties/subtype'))
  const fwDev = devices.find((d) => /\bUEFI\b|\bBIOS\b/i.test(d.name)) ?? null
  const fwKind: 'bios' | 'efi' | null = fwDev ? (/UEFI/i.test(fwDev.name) ? 'efi' : 'bios') : null
  let generation: 1 | 2 | null = subtype === 0 ? 1 : subtype === 1 ? 2 : null
  if (subtype !== null && generation === null) warnings.push(`properties/subtype = ${subtype} is not a known VM generation`)
  if (generation === null && fwKind !== null) generation = fwKind === 'efi' ? 2 : 1
  else if (generation !== null && fwKind !== null && (fwKind === 'efi') !== (generation === 2)) {
    warnings.push(`properties/subtype says generation ${generation} but the firmware device is ${JSON.stringify(fwDev!.name)}: the firmware device wins`)
    generation = fwKind === 'efi' ? 2 : 1
  }
  if (generation === null) warnings.push('the VM generation is not recorded: BIOS assumed')
  const firmware = generation === 2 ? 'efi' : 'bios'
  const fwNode = fwDev ? vmcxDeviceNode(cfg, fwDev.instance) : null
  const secureBoot = firmware === 'efi' && fwNode !== null && bool(fwNode.get('secure_boot_enabled')) === true

  // Disks: IDE controllers first (Gen 1 boots from IDE), then synthetic SCSI.
  const disks: VmcxDisk[] = []
  const skipped: string[] = []
  const ctrls: Array<{ d: VmcxDevice; bus: 'ide' | 'scsi' }> = [
    ...devices.filter((d) => /IDE Controller/i.test(d.name)).map((d) => ({ d, bus: 'ide' as const })),
    ...devices.filter((d) => /SCSI Controller/i.test(d.name)).map((d) => ({ d, bus: 'scsi' as const })),
  ]
  let scsiOrdinal = 0
  for (const { d, bus } of ctrls) {
    const node = vmcxDeviceNode(cfg, d.instance)
    const ordinal = bus === 'scsi' ? scsiOrdinal++ : 0
    if (!node) continue
    for (const [cn, ctrl] of numberedKeys(node, 'controller')) {
      for (const [dn, drive] of numberedKeys(ctrl, 'drive')) {
        const type = (str(drive.get('type')) ?? '').toUpperCase()
        const pathname = str(drive.get('pathname')) ?? ''
        const controller = bus === 'ide' ? cn : ordinal
        const slot = dn
        if (type === 'VHD' || type === 'VHDX') {
          if (pathname === '') {
            skipped.push(`${bus} ${controller}:${slot} (hard disk drive without a file)`)
            continue
          }
          disks.push({ bus, controller, slot, address: `${controller}:${slot}`, pathname, type, instance: d.instance })
        } else if (type !== '' && type !== 'NONE' && type !== 'ISO' && type !== 'VFD' && type !== 'DVD') {
          skipped.push(`${bus} ${controller}:${slot} (drive type ${type})`)
        }
      }
    }
  }
  if (skipped.length > 0) warnings.push(`drives not imported: ${skipped.join(', ')}`)

  // NICs: manifest devices whose settings carry a MacAddress.
  const nics: VmcxNic[] = []
  for (const d of devices) {
    const node = vmcxDeviceNode(cfg, d.instance)
    if (!node?.has('MacAddress')) continue
    const sw = str(node.get('SwitchName'))
    nics.push({
      name: str(node.get('FriendlyName')),
      mac: normalizeMac(str(node.get('MacAddress'))),
      staticMac: bool(node.get('MacAddressIsStatic')) === true,
      switchName: sw ? sw : null,
      legacy: /Emulated|Legacy/i.test(d.name),
      instance: d.instance,
    })
  }

  const cpuCount = int(vmcxGet(r, 'configuration/settings/processors/count'))
  const memoryMiB = int(vmcxGet(r, 'configuration/settings/memory/bank/size'))
  const dynamicMemory = bool(vmcxGet(r, 'configuration/settings/memory/bank/dynamic_memory_enabled')) === true
  if (cpuCount === null) warnings.push('settings/processors/count is not recorded')
  if (memoryMiB === null) warnings.push('settings/memory/bank/size is not recorded')
  return {
    name: str(vmcxGet(r, 'configuration/properties/name')),
    configVersion: int(vmcxGet(r, 'configuration/properties/version')),
    generation,
    firmware,
    secureBoot,
    cpuCount,
    memoryMiB,
    dynamicMemory,
    disks,
    nics,
    // No key of the configuration is known to record the guest OS (see VmcxVmInfo.guestOs).
    guestOs: null,
    warnings,
  }
}
