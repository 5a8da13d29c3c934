/**
 * VMX reader: VMware's virtual machine configuration file (a "dictionary" file of
 * `key = "value"` lines) and its translation into a {@link VmManifest}.
 *
 * Sources: VMware's dictionary syntax as written by Workstation/ESXi (quoted values, `#`
 * comments, `|XX` hex escapes for `"`, `|`, `#` and control characters, `.encoding`), the VMX keys
 * documented in VMware KBs and used by libvirt's `esx_vmx.c` and virt-v2v's VMX input
 * (`displayName`, `memSize`, `numvcpus`, `cpuid.coresPerSocket`, `firmware`,
 * `uefi.secureBoot.enabled`, `guestOS`, `<bus>N[:M].*`, `ethernetN.*`, `encryption.*`).
 */
import { MigError } from '../errors.ts'
import { normalizeMac } from '../mac.ts'
import { checkDestinationLimits } from '../limits.ts'
import { malformed } from './io.ts'
import { guestFamilyOf, type ControllerBus, type ManifestDisk, type ManifestNic, type VmManifest } from '../manifest.ts'
import { decodeText } from './vmdk/descriptor.ts'

/** Largest VMX accepted: 4 MiB. */
export const MAX_VMX_BYTES = 4 * 1024 * 1024
const MiB = 1024 * 1024
/** Most memory accepted (MiB): 24 TiB, the vSphere 8 maximum. */
const MAX_MEMSIZE_MIB = 24 * 1024 * 1024
/** Most vCPUs accepted (vSphere 8 maximum). */
const MAX_VCPUS = 768

/**
 * A parsed VMX.
 * - `label`: the file name, for messages.
 * - `encoding`: the `.encoding` value (e.g. `UTF-8`, `windows-1252`) or null.
 * - `values`: VMX keys lower-cased -> unescaped values; duplicate keys: the last wins. A `Map`, so
 *   keys such as `__proto__` are plain data.
 */
export interface VmxFile {
  label: string
  encoding: string | null
  values: Map<string, string>
}

/** Decodes VMware's `|XX` escapes (a byte in hex) in a value; a `|` not followed by two hex digits stays. */
function unescapeVmx(v: string): string {
  if (!v.includes('|')) return v
  const out: number[] = []
  const enc = new TextEncoder()
  for (let i = 0; i < v.length; ) {
    if (v[i] === '|' && /^[0-9A-Fa-f]{2}$/.test(v.slice(i + 1, i + 3))) {
      out.push(parseInt(v.slice(i + 1, i + 3), 16))
      i += 3
    } else {
      const cp = v.codePointAt(i) as number
      const ch = String.fromCodePoint(cp)
      for (const b of enc.encode(ch)) out.push(b)
      i += ch.length
    }
  }
  return new TextDecoder('utf-8').decode(Uint8Array.from(out))
}

/**
 * Parses VMX text (or bytes, decoded per their `.encoding` line).
 * Grammar per line: blank; `# comment`; `key = "value"` (optionally followed by spaces and a
 * `#` comment); or `key = value` unquoted (up to a `#`). Keys are matched case-insensitively
 * (stored lower-cased); values have `|XX` escapes decoded.
 *
 * Throws `E_MIG_MALFORMED_ARCHIVE` when the input exceeds 4 MiB, holds NUL bytes, or a line
 * is not `key = value` (unterminated quote, missing `=`, empty key), naming the line.
 */
export function parseVmx(input: string | Uint8Array, label: string): VmxFile {
  const size = typeof input === 'string' ? input.length : input.byteLength
  if (size > MAX_VMX_BYTES) throw malformed(label, `VMX larger than 4 MiB (${size} bytes)`)
  const text = typeof input === 'string' ? input : decodeText(input, '.encoding')
  if (text.includes('\0')) throw malformed(label, 'VMX contains NUL bytes')
  const values = new Map<string, string>()
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].replace(/\r$/, '').trim()
    if (line === '' || line.startsWith('#')) continue
    const eq = line.indexOf('=')
    if (eq <= 0) throw malformed(label, `line ${i + 1}: expected key = "value"`)
    const key = line.slice(0, eq).trim()
    if (!/^[^\s"#=]+$/.test(key)) throw malformed(label, `line ${i + 1}: bad key ${JSON.stringify(key.slice(0, 64))}`)
    let rest = line.slice(eq + 1).trim()
    let value: string
    if (rest.startsWith('"')) {
      const end = rest.indexOf('"', 1)
      if (end < 0) throw malformed(label, `line ${i + 1}: unterminated quoted value`)
      value = rest.slice(1, end)
      rest = rest.slice(end + 1).trim()
      if (rest !== '' && !rest.startsWith('#')) throw malformed(label, `line ${i + 1}: text after the closing quote`)
    } else {
      const hash = rest.indexOf('#')
      value = (hash >= 0 ? rest.slice(0, hash) : rest).trim()
    }
    values.set(key.toLowerCase(), unescapeVmx(value))
  }
  return { label, encoding: values.get('.encoding') ?? null, values }
}

/** The value of VMX key `key` (any case), or undefined. */
export function vmxGet(vmx: VmxFile, key: string): string | undefined {
  return vmx.values.get(key.toLowerCase())
}

/** VMX boolean: `TRUE`/`true`/`yes`/`1`/`on` are true, `FALSE`/`no`/`0`/`off` false, else `dflt`. */
export function vmxBool(v: string | undefined, dflt = false): boolean {
  if (v === undefined) return dflt
  const s = v.trim().toLowerCase()
  if (['true', 'yes', '1', 'on'].includes(s)) return true
  if (['false', 'no', '0', 'off'].includes(s)) return false
  return dflt
}

/** True when the VMX is encrypted (`encryption.keySafe` or `encryption.data` present). */
export function isEncryptedVmx(vmx: VmxFile): boolean {
  return vmx.values.has('encryption.keysafe') || vmx.values.has('encryption.data')
}

/** Disk buses of VMX device keys, in the order disks are listed in the manifest. */
export const VMX_DISK_BUSES = ['scsi', 'sata', 'nvme', 'ide'] as const
export type VmxDiskBus = (typeof VMX_DISK_BUSES)[number]

/**
 * A storage controller (`<bus>N`): `model` is `scsiN.virtualDev` (lsilogic, lsisas1068, pvscsi,
 * buslogic) for SCSI, `ahci` for SATA, `nvme` for NVMe, `piix` for IDE; null when unset.
 * `present` is false only when `<bus>N.present = "FALSE"`.
 */
export interface VmxController {
  bus: VmxDiskBus
  index: number
  model: string | null
  present: boolean
}

/**
 * A disk slot `<bus>N:M` with `.present = TRUE`, a hard-disk `.deviceType` and a `.fileName`.
 * `key` is the VMX key of the file name (`scsi0:0.fileName`), `address` is `<bus>N:M`.
 */
export interface VmxDiskRef {
  bus: VmxDiskBus
  controller: number
  unit: number
  address: string
  key: string
  fileName: string
  deviceType: string | null
}

/** Hard-disk device types kept (absent means a hard disk). */
const DISK_TYPES = new Set(['scsi-harddisk', 'disk', 'ata-harddisk', 'nvme-harddisk', 'sata-harddisk'])
/** CD-ROM device types skipped. */
const CDROM_TYPES = new Set(['cdrom-image', 'atapi-cdrom', 'cdrom-raw'])

/**
 * The controllers, disks and NICs a VMX declares, plus warnings.
 * Disks: `<bus>N:M.present` true, not a CD-ROM (`cdrom-image`, `atapi-cdrom`, `cdrom-raw`, or
 * an `.iso` file), on a controller not marked `present = "FALSE"`; ordered scsi, sata, nvme, ide,
 * then N, then M. NICs: `ethernetN.present` true, ordered by N; model `.virtualDev` (default
 * e1000); MAC from `.generatedAddress` (addressType generated/vpx) or `.address` (static),
 * lower-case, null when absent or not a MAC; network `.networkName` or null; `pci_slot` from
 * `.pciSlotNumber` when it is a slot number (absent for `-1` or anything else).
 *
 * Throws `E_MIG_UNSUPPORTED_FORMAT` for a `rawDisk` (physical disk) device.
 */
export function vmxHardware(vmx: VmxFile): { controllers: VmxController[]; disks: VmxDiskRef[]; nics: ManifestNic[]; warnings: string[] } {
  const warnings: string[] = []
  const controllers = new Map<string, VmxController>()
  const slots = new Map<string, { bus: VmxDiskBus; n: number; m: number }>()
  const nicIdx = new Set<number>()
  for (const key of vmx.values.keys()) {
    let m = /^(scsi|sata|nvme|ide)(\d{1,2})\.(present|virtualdev)$/.exec(key)
    if (m) {
      const bus = m[1] as VmxDiskBus
      const n = Number(m[2])
      const id = `${bus}${n}`
      if (!controllers.has(id)) controllers.set(id, controllerOf(vmx, bus, n))
      continue
    }
    m = /^(scsi|sata|nvme|ide)(\d{1,2}):(\d{1,3})\.(present|filename|devicetype)$/.exec(key)
    if (m) {
      const bus = m[1] as VmxDiskBus
      const n = Number(m[2])
      const u = Number(m[3])
      slots.set(`${bus}${n}:${u}`, { bus, n, m: u })
      if (!controllers.has(`${bus}${n}`)) controllers.set(`${bus}${n}`, controllerOf(vmx, bus, n))
      continue
    }
    m = /^ethernet(\d{1,2})\.present$/.exec(key)
    if (m) nicIdx.add(Number(m[1]))
  }
  const disks: VmxDiskRef[] = []
  for (const [address, s] of slots) {
    const get = (f: string) => vmxGet(vmx, `${address}.${f}`)
    if (!vmxBool(get('present'))) continue
    const ctl = controllers.get(`${s.bus}${s.n}`) as VmxController
    const fileName = get('fileName') ?? ''
    const deviceType = get('deviceType') ?? null
    const dt = deviceType?.toLowerCase() ?? null
    if (dt !== null && CDROM_TYPES.has(dt)) continue
    if (!ctl.present) {
      warnings.push(`${address}: controller ${s.bus}${s.n} is not present; its disk ${JSON.stringify(fileName)} is ignored`)
      continue
    }
    if (dt === 'rawdisk') throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${vmx.label}: ${address} is a physical (rawDisk) disk, which cannot be imported`)
    if (dt !== null && !DISK_TYPES.has(dt)) {
      warnings.push(`${address}: device type ${JSON.stringify(deviceType)} is not a hard disk; ignored`)
      continue
    }
    if (dt === null && /\.iso$/i.test(fileName)) continue
    if (fileName === '') {
      warnings.push(`${address}: present but has no fileName; ignored`)
      continue
    }
    disks.push({ bus: s.bus, controller: s.n, unit: s.m, address, key: `${address}.fileName`, fileName, deviceType })
  }
  disks.sort((a, b) => VMX_DISK_BUSES.indexOf(a.bus) - VMX_DISK_BUSES.indexOf(b.bus) || a.controller - b.controller || a.unit - b.unit)
  const nics: ManifestNic[] = []
  for (const n of [...nicIdx].sort((a, b) => a - b)) {
    const get = (f: string) => vmxGet(vmx, `ethernet${n}.${f}`)
    if (!vmxBool(get('present'))) continue
    const model = (get('virtualDev') ?? 'e1000').trim().toLowerCase() || 'e1000'
    const addressType = (get('addressType') ?? 'generated').trim().toLowerCase()
    const rawMac = addressType === 'static' ? get('address') : get('generatedAddress')
    let mac: string | null = null
    if (rawMac !== undefined && rawMac !== '') {
      mac = normalizeMac(rawMac)
      if (mac === null) warnings.push(`ethernet${n}: MAC address ${JSON.stringify(rawMac)} is not valid; a new one will be generated`)
    }
    const network = get('networkName')
    const nic: ManifestNic = { label: `ethernet${n}`, mac, model, network: network && network !== '' ? network : null }
    // VMware writes -1 for a slot not yet assigned; a real slot is below 2^16.
    const slot = get('pciSlotNumber')?.trim()
    if (slot && /^\d{1,5}$/.test(slot) && Number(slot) < 65536) nic.pci_slot = Number(slot)
    nics.push(nic)
  }
  const ctlList = [...controllers.values()].sort((a, b) => VMX_DISK_BUSES.indexOf(a.bus) - VMX_DISK_BUSES.indexOf(b.bus) || a.index - b.index)
  return { controllers: ctlList, disks, nics, warnings }
}

function controllerOf(vmx: VmxFile, bus: VmxDiskBus, n: number): VmxController {
  const present = vmxBool(vmxGet(vmx, `${bus}${n}.present`), true)
  const dev = vmxGet(vmx, `${bus}${n}.virtualDev`)?.trim().toLowerCase()
  const model = bus === 'scsi' ? dev || null : bus === 'sata' ? 'ahci' : bus === 'nvme' ? 'nvme' : 'piix'
  return { bus, index: n, model, present }
}

function intOf(vmx: VmxFile, key: string, min: number, max: number): number | null {
  const v = vmxGet(vmx, key)
  if (v === undefined || v.trim() === '') return null
  const s = v.trim()
  if (!/^\d{1,12}$/.test(s)) throw malformed(vmx.label, `${key} = ${JSON.stringify(v.slice(0, 64))} is not a number`)
  const n = Number(s)
  if (n < min || n > max) throw malformed(vmx.label, `${key} = ${n} out of ${min}..${max}`)
  return n
}

/** What {@link vmxToManifest} needs from its caller. */
export interface VmxManifestOptions {
  /**
   * Resolves the disk file `fileName` (as written in VMX key `key`, on `bus` at `address`
   * `<bus>N:M`) to its manifest disk, plus warnings. Throws what the disk inspection throws.
   */
  resolveDisk: (fileName: string, bus: ControllerBus, address: string, key: string) => Promise<{ disk: ManifestDisk; warnings?: string[] }>
  /** Name used when `displayName` is absent or empty (e.g. the .vmx file name). */
  fallbackName: string
}

/**
 * Builds the manifest of a VMX (`source_format: 'vmx_folder'`): `displayName` -> name,
 * `memSize` (MiB) -> `memory_bytes` (2 GiB with a warning when absent), `numvcpus` (default 1)
 * and `cpuid.coresPerSocket` (default 1; reset to 1 with a warning when it does not divide the
 * vCPU count), `firmware = "efi"` -> efi else bios, `uefi.secureBoot.enabled` (efi only),
 * `guestOS` -> `guest_os` (family by {@link guestFamilyOf}), disks and NICs per
 * {@link vmxHardware}, SCSI controller models as warnings, `cbt_available: false`.
 *
 * Throws `E_MIG_UNSUPPORTED_FORMAT` for an encrypted VM ("encrypted VM: decrypt it in VMware
 * first") or a physical disk, `E_MIG_MALFORMED_ARCHIVE` for non-numeric or out-of-range
 * `memSize`/`numvcpus`/`cpuid.coresPerSocket`, and whatever `resolveDisk` throws.
 */
export async function vmxToManifest(vmx: VmxFile, opts: VmxManifestOptions): Promise<VmManifest> {
  if (isEncryptedVmx(vmx)) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${vmx.label}: encrypted VM: decrypt it in VMware first`)
  const warnings: string[] = []
  const name = vmxGet(vmx, 'displayName')?.trim() || opts.fallbackName
  let memMiB = intOf(vmx, 'memSize', 1, MAX_MEMSIZE_MIB)
  if (memMiB === null) {
    memMiB = 2048
    warnings.push('memSize absent from the VMX: memory defaults to 2048 MiB')
  }
  const vcpus = intOf(vmx, 'numvcpus', 1, MAX_VCPUS) ?? 1
  let cps = intOf(vmx, 'cpuid.coresPerSocket', 1, MAX_VCPUS) ?? 1
  if (vcpus % cps !== 0) {
    warnings.push(`cpuid.coresPerSocket = ${cps} does not divide numvcpus = ${vcpus}: using 1 core per socket`)
    cps = 1
  }
  const fw = vmxGet(vmx, 'firmware')?.trim().toLowerCase()
  if (fw !== undefined && fw !== '' && fw !== 'efi' && fw !== 'bios') warnings.push(`firmware = ${JSON.stringify(fw)} is unknown: using bios`)
  const firmware = fw === 'efi' ? 'efi' : 'bios'
  const secureBoot = firmware === 'efi' && vmxBool(vmxGet(vmx, 'uefi.secureBoot.enabled'))
  const guestId = vmxGet(vmx, 'guestOS')?.trim() || null
  const hw = vmxHardware(vmx)
  warnings.push(...hw.warnings)
  for (const c of hw.controllers) {
    if (c.bus === 'scsi' && c.present && c.model && hw.disks.some((d) => d.bus === 'scsi' && d.controller === c.index)) {
      warnings.push(`scsi${c.index}: VMware controller model ${c.model}; its disks are attached to a KVM controller on the destination`)
    }
  }
  checkDestinationLimits(vmx.label, { disks: hw.disks.length })
  const disks: ManifestDisk[] = []
  const labels = new Set<string>()
  for (const d of hw.disks) {
    const r = await opts.resolveDisk(d.fileName, d.bus, d.address, d.key)
    let label = r.disk.label
    for (let k = 2; labels.has(label); k++) label = `${r.disk.label}_${k}`
    labels.add(label)
    disks.push({ ...r.disk, label })
    if (r.warnings) warnings.push(...r.warnings)
  }
  if (disks.length === 0) warnings.push('the VMX declares no hard disk')
  return {
    name,
    source_format: 'vmx_folder',
    guest_os: { family: guestFamilyOf(guestId), id: guestId },
    firmware,
    secure_boot: secureBoot,
    cpu: { count: vcpus, cores_per_socket: cps },
    memory_bytes: memMiB * MiB,
    disks,
    nics: hw.nics,
    cbt_available: false,
    warnings,
  }
}
