/**
 * Reading a libvirt domain description (`virsh dumpxml`, libvirt "Domain XML format",
 * https://libvirt.org/formatdomain.html) into what the migrator lists and inspects: identity,
 * vCPUs, memory, firmware (`<os firmware='efi'>` or a pflash `<loader>`, the `<nvram>` file, secure
 * boot), disks (target, bus, format, source file or block device) and NICs (MAC, model,
 * network/bridge).
 */
import { MigError } from '../../errors.ts'
import { parseXmlDocument, xmlChild, xmlChildren, type XmlNode } from '../../formats/xml.ts'
import type { ControllerBus, DiskFormat } from '../../manifest.ts'

/** One disk of a domain (`<disk device='disk'>`). */
export interface DomainDisk {
  /** `<target dev>`: `vda`, `sda`, ... (the NBD export name of a backup). */
  target: string
  bus: ControllerBus
  /** The libvirt target bus as written (`virtio`, `scsi`, `sata`, `ide`, `usb`, ...). */
  rawBus: string
  /** `<driver type>`; null when libvirt probes it. */
  format: string | null
  /** `file` or `block`; other types (network, volume) are not copied. */
  type: string
  /** The source file or device path on the host; null for network disks. */
  source: string | null
  /** Whether the disk has a `<backingStore>` with a source (a chain). */
  hasBacking: boolean
  readonly: boolean
}

/** One NIC of a domain (`<interface>`). */
export interface DomainNic {
  mac: string | null
  model: string
  /** `network`, `bridge`, `direct`, `user`, ... */
  type: string
  /** The network name or bridge/device the NIC joins. */
  network: string | null
}

/** What a domain XML says. Memory in bytes. */
export interface DomainInfo {
  name: string
  uuid: string
  vcpus: number
  memoryBytes: number
  firmware: 'bios' | 'efi'
  secureBoot: boolean
  /** The UEFI variable store file on the host (`<nvram>`), null when none is named. */
  nvram: string | null
  /** `<os><type arch>`. */
  arch: string | null
  machine: string | null
  disks: DomainDisk[]
  /** Disks not copied (CD-ROMs, floppies, network disks, LUNs): what and why, for warnings. */
  skipped: string[]
  /** The target of every `<disk device='disk'>`, copied or not (a backup or checkpoint names each). */
  xmlDiskTargets: string[]
  nics: DomainNic[]
  /** Libvirt's `<description>` (free text), for the guest family guess. */
  description: string
}

const UNITS: Record<string, number> = {
  b: 1,
  bytes: 1,
  k: 1024,
  kib: 1024,
  kb: 1000,
  m: 1 << 20,
  mib: 1 << 20,
  mb: 1e6,
  g: 1 << 30,
  gib: 1 << 30,
  gb: 1e9,
  t: 2 ** 40,
  tib: 2 ** 40,
  tb: 1e12,
}

function bytesOf(n: XmlNode | null): number {
  if (!n) return 0
  const v = Number(n.text.trim())
  const unit = (n.attrs.get('unit') ?? 'KiB').toLowerCase()
  const f = UNITS[unit]
  if (!Number.isFinite(v) || v < 0 || f === undefined) return 0
  return Math.round(v * f)
}

function busOf(bus: string): ControllerBus {
  switch (bus) {
    case 'virtio':
      return 'virtio'
    case 'scsi':
      return 'scsi'
    case 'sata':
      return 'sata'
    case 'ide':
      return 'ide'
    case 'nvme':
      return 'nvme'
    case 'xen':
      return 'xen'
    default:
      return 'unknown'
  }
}

/** The manifest's disk format of a libvirt `<driver type>`: the formats qemu and the manifest share, else null. */
export function diskFormatOf(t: string | null): DiskFormat | null {
  return t === 'raw' || t === 'qcow2' || t === 'vmdk' || t === 'vhdx' || t === 'vpc' || t === 'vdi' ? t : null
}

/**
 * Parses `virsh dumpxml` output. Throws `E_MIG_SOURCE_UNREACHABLE` when it is not a domain
 * description (a libvirt that answers something else cannot be migrated from).
 */
export function parseDomainXml(xml: string, label: string): DomainInfo {
  let root: XmlNode
  try {
    root = parseXmlDocument(xml, label)
  } catch (e) {
    throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${label}: libvirt answered a domain description that is not XML: ${(e as Error).message}`)
  }
  if (root.name !== 'domain') throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${label}: libvirt answered <${root.name}>, not a <domain>`)
  const text = (n: XmlNode | null) => (n ? n.text.trim() : '')
  const os = xmlChild(root, 'os')
  const loader = xmlChild(os, 'loader')
  const nvramNode = xmlChild(os, 'nvram')
  const fwFeatures = xmlChild(os, 'firmware')
  const efi = os?.attrs.get('firmware') === 'efi' || loader?.attrs.get('type') === 'pflash' || /OVMF|edk2|AAVMF/i.test(text(loader))
  const secureBoot =
    loader?.attrs.get('secure') === 'yes' ||
    (fwFeatures ? xmlChildren(fwFeatures, 'feature').some((f) => f.attrs.get('name') === 'secure-boot' && f.attrs.get('enabled') === 'yes') : false)
  const devices = xmlChild(root, 'devices')
  const disks: DomainDisk[] = []
  const skipped: string[] = []
  const xmlDiskTargets: string[] = []
  for (const d of devices ? xmlChildren(devices, 'disk') : []) {
    const target = xmlChild(d, 'target')
    const dev = target?.attrs.get('dev') ?? ''
    const device = d.attrs.get('device') ?? 'disk'
    const type = d.attrs.get('type') ?? 'file'
    const src = xmlChild(d, 'source')
    const source = src?.attrs.get('file') ?? src?.attrs.get('dev') ?? null
    if (device === 'disk' && /^[a-z]{1,3}[a-z0-9]{1,8}$/.test(dev)) xmlDiskTargets.push(dev)
    if (device !== 'disk') {
      skipped.push(`${dev || '?'} (${device}${source ? ` ${source}` : ''}): not a disk, not copied`)
      continue
    }
    if ((type !== 'file' && type !== 'block') || !source || !/^[a-z]{1,3}[a-z0-9]{1,8}$/.test(dev)) {
      skipped.push(`${dev || '?'} (type ${type}): only file and block disks with a target are copied`)
      continue
    }
    const backing = xmlChild(d, 'backingStore')
    const rawBus = target?.attrs.get('bus') ?? ''
    disks.push({
      target: dev,
      bus: busOf(rawBus),
      rawBus,
      format: xmlChild(d, 'driver')?.attrs.get('type') ?? null,
      type,
      source,
      hasBacking: backing !== null && xmlChild(backing, 'source') !== null,
      readonly: xmlChild(d, 'readonly') !== null,
    })
  }
  const nics: DomainNic[] = []
  for (const n of devices ? xmlChildren(devices, 'interface') : []) {
    const type = n.attrs.get('type') ?? 'unknown'
    const src = xmlChild(n, 'source')
    const mac = xmlChild(n, 'mac')?.attrs.get('address')?.toLowerCase() ?? null
    nics.push({
      mac: mac && /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/.test(mac) ? mac : null,
      model: xmlChild(n, 'model')?.attrs.get('type') ?? (type === 'hostdev' ? 'hostdev' : 'rtl8139'),
      type,
      network: src?.attrs.get('network') ?? src?.attrs.get('bridge') ?? src?.attrs.get('dev') ?? null,
    })
  }
  const vcpus = Math.trunc(Number(text(xmlChild(root, 'vcpu')))) || 1
  const typeNode = xmlChild(os, 'type')
  return {
    name: text(xmlChild(root, 'name')),
    uuid: text(xmlChild(root, 'uuid')).toLowerCase(),
    vcpus,
    memoryBytes: bytesOf(xmlChild(root, 'currentMemory') ?? xmlChild(root, 'memory')),
    firmware: efi ? 'efi' : 'bios',
    secureBoot,
    nvram: text(nvramNode) || null,
    arch: typeNode?.attrs.get('arch') ?? null,
    machine: typeNode?.attrs.get('machine') ?? null,
    disks,
    skipped,
    xmlDiskTargets,
    nics,
    description: text(xmlChild(root, 'description')),
  }
}

/** `virsh domblkinfo --all` rows: target -> capacity and allocation (bytes); `-` columns are absent. */
export function parseDomblkinfoAll(out: string): Map<string, { capacity: number | null; allocation: number | null }> {
  const m = new Map<string, { capacity: number | null; allocation: number | null }>()
  for (const line of out.split('\n')) {
    const f = line.trim().split(/\s+/)
    if (f.length < 3 || f[0] === 'Target' || /^-+$/.test(f[0])) continue
    const num = (s: string | undefined) => (s && /^\d+$/.test(s) ? Number(s) : null)
    m.set(f[0], { capacity: num(f[1]), allocation: num(f[2]) })
  }
  return m
}

/** `virsh domstate` text as the listing's power state. */
export function powerStateOf(state: string): 'on' | 'off' | 'suspended' | 'unknown' {
  const s = state.trim().toLowerCase()
  if (s === 'running' || s === 'idle' || s === 'in shutdown' || s === 'blocked') return 'on'
  if (s === 'shut off' || s === 'crashed') return 'off'
  if (s === 'paused' || s === 'pmsuspended') return 'suspended'
  return 'unknown'
}
