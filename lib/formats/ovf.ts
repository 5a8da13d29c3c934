/**
 * OVF envelope reader (DMTF DSP0243 "Open Virtualization Format Specification", 1.x and 2.0
 * envelopes) for the `ova_archive` and `ovf_folder` importers: the envelope, hardware section
 * choice, href checks and each disk's qemu format. Beside it: `ovf-to-vm-manifest.ts` (the
 * VmManifest assembly), `ovf-manifest.ts` (the `.mf` digests), `cim-os.ts` (CIM OS types),
 * `gzip-head.ts` (head of a compressed disk), `sniff.ts` (magic bytes, and the virtual size a
 * disk header declares) and `xml.ts` (the namespace-aware tree).
 *
 * Elements and attributes are matched by namespace URI, never by prefix (XML Namespaces 1.0):
 * the OVF envelope namespaces (`…/ovf/envelope/1`, `…/ovf/envelope/2`), the CIM RASD / SASD /
 * EPASD / VSSD namespaces (DSP0243 8.3, 9.5), VMware's `http://www.vmware.com/schema/ovf` and
 * VirtualBox's `http://www.virtualbox.org/ovf/machine`.
 *
 * Hostile input: the descriptor is capped at 4 MiB before parsing, any DOCTYPE is refused (so no
 * entity can be declared, let alone expanded), entities other than XML's five predefined ones and
 * character references are refused, element/attribute names `__proto__`, `constructor`,
 * `prototype` are ignored, and every map is a `Map` or a null-prototype object.
 */
import * as posix from 'node:path/posix'
import { MigError } from '../errors.ts'
import { normalizeMac } from '../mac.ts'
import { malformed } from './io.ts'
import { sniffDiskFormat } from './sniff.ts'
import { attr, kid, kids, parseNamespacedXml, textOf, type XEl } from './xml.ts'
import type { DiskFormat } from '../manifest.ts'

/** Largest OVF descriptor accepted, bytes (4 MiB). */
export const MAX_DESCRIPTOR_BYTES = 4 * 1024 * 1024
/** Bounds on collection sizes in one descriptor. */
const MAX_FILES = 4096
const MAX_ITEMS = 16384

// ---------------------------------------------------------------------------------------------
// Namespaces (DSP0243 Annex/8.3; CIM schema 2.x)

export const NS = {
  ovf1: 'http://schemas.dmtf.org/ovf/envelope/1',
  ovf2: 'http://schemas.dmtf.org/ovf/envelope/2',
  ovf09: 'http://www.vmware.com/schema/ovf/1/envelope',
  rasd: 'http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData',
  sasd: 'http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_StorageAllocationSettingData',
  epasd: 'http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_EthernetPortAllocationSettingData',
  vssd: 'http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData',
  vmw: 'http://www.vmware.com/schema/ovf',
  vbox: 'http://www.virtualbox.org/ovf/machine',
  xml: 'http://www.w3.org/XML/1998/namespace',
} as const

/** The OVF envelope namespaces (1.x and 2.x). */
export const OVF_NS: readonly string[] = [NS.ovf1, NS.ovf2]
/** The CIM namespaces of VirtualHardwareSection items (RASD, SASD, EPASD). */
export const CIM_ITEM_NS: readonly string[] = [NS.rasd, NS.sasd, NS.epasd]

/** Parses a descriptor into the namespace-resolved tree (`xml.ts`), refusing one over {@link MAX_DESCRIPTOR_BYTES}. */
function parseXml(xml: string, label: string): XEl {
  if (xml.length > MAX_DESCRIPTOR_BYTES) throw malformed(label, `descriptor larger than ${MAX_DESCRIPTOR_BYTES} bytes`)
  return parseNamespacedXml(xml, label)
}

// ---------------------------------------------------------------------------------------------
// Public types

/** `References/File` (DSP0243 7.1). `size` bytes as stored (compressed size when gzip); `chunkSize` bytes per chunk. */
export interface OvfFile {
  id: string
  href: string
  size: number | null
  compression: 'gzip' | null
  chunkSize: number | null
}

/** `DiskSection/Disk` (DSP0243 9.1). `capacity`/`populatedSize` in bytes (units applied). */
export interface OvfDisk {
  diskId: string
  fileRef: string | null
  capacity: number
  populatedSize: number | null
  format: string | null
  parentRef: string | null
}

/** `NetworkSection/Network` (DSP0243 9.2). */
export interface OvfNetwork {
  name: string
  description: string | null
}

/**
 * One `Item` / `StorageItem` / `EthernetPortItem` of a VirtualHardwareSection (DSP0243 9.5,
 * CIM_ResourceAllocationSettingData). Values are the raw texts; `resourceType` is the CIM
 * ResourceType number (3 CPU, 4 memory, 5 IDE, 6 SCSI, 10 Ethernet, 14 floppy, 15/16 CD/DVD,
 * 17 disk, 20 other storage controller).
 */
export interface OvfItem {
  instanceId: string
  resourceType: number
  resourceSubType: string | null
  elementName: string | null
  address: string | null
  addressOnParent: string | null
  parent: string | null
  hostResource: string[]
  connection: string[]
  virtualQuantity: string | null
  allocationUnits: string | null
  /** `vmw:CoresPerSocket` of a CPU item. */
  coresPerSocket: number | null
  /** `ovf:configuration` list (DeploymentOptionSection ids) or null when the item always applies. */
  configuration: string[] | null
  /** `ovf:bound` (`min`, `max`, `normal`) or null. */
  bound: string | null
}

/** One VirtualHardwareSection (DSP0243 9.5). `config` holds `vmw:Config`/`vmw:ExtraConfig` key/values. */
export interface OvfHardwareSection {
  id: string | null
  /** `vssd:VirtualSystemType` entries, e.g. `vmx-08`, `virtualbox-2.2`. */
  systemTypes: string[]
  items: OvfItem[]
  config: Map<string, string>
}

/** OperatingSystemSection (DSP0243 9.7): CIM OsType number, `vmw:osType`, VirtualBox OSType, Description. */
export interface OvfOperatingSystem {
  cimId: number | null
  vmwOsType: string | null
  vboxOsType: string | null
  description: string | null
}

/** What a `vbox:Machine` element (VirtualBox settings format embedded in its OVF exports) adds. */
export interface OvfVboxMachine {
  name: string | null
  osType: string | null
  firmware: 'bios' | 'efi' | null
  /** MAC addresses (lower-case, colon-separated) of enabled adapters, by slot order. */
  macs: string[]
}

/** A parsed OVF envelope (one VirtualSystem: the first one when there are several). */
export interface OvfEnvelope {
  version: '1' | '2'
  files: OvfFile[]
  disks: OvfDisk[]
  networks: OvfNetwork[]
  /** Default DeploymentOptionSection configuration id, if any. */
  defaultConfiguration: string | null
  virtualSystem: {
    id: string | null
    name: string | null
    os: OvfOperatingSystem
    hardwareSections: OvfHardwareSection[]
    vbox: OvfVboxMachine | null
  }
  warnings: string[]
}

// ---------------------------------------------------------------------------------------------
// Numbers and units

/** A non-negative integer count from descriptor text, null when absent. `E_MIG_MALFORMED_ARCHIVE` naming `what`. */
export function parseCount(s: string | null, label: string, what: string): number | null {
  if (s === null) return null
  const t = s.trim()
  if (!/^[0-9]{1,16}$/.test(t) || Number(t) > Number.MAX_SAFE_INTEGER)
    throw malformed(label, `${what}: not a non-negative integer: ${JSON.stringify(t.slice(0, 40))}`)
  return Number(t)
}

const UNIT_WORDS: Record<string, number> = Object.assign(Object.create(null), {
  byte: 1,
  bytes: 1,
  b: 1,
  kilobyte: 2 ** 10,
  kilobytes: 2 ** 10,
  kb: 2 ** 10,
  kib: 2 ** 10,
  megabyte: 2 ** 20,
  megabytes: 2 ** 20,
  mb: 2 ** 20,
  mib: 2 ** 20,
  gigabyte: 2 ** 30,
  gigabytes: 2 ** 30,
  gb: 2 ** 30,
  gib: 2 ** 30,
  terabyte: 2 ** 40,
  terabytes: 2 ** 40,
  tb: 2 ** 40,
  tib: 2 ** 40,
})

/**
 * Multiplier (bytes per unit) of a DSP0004 programmatic unit such as `byte * 2^30`, `byte*2^20`,
 * `byte * 1024 * 1024`, `byte * 10^9`, or of the words VirtualBox and older exporters write
 * (`MegaBytes`, `GB`). Null/empty gives `dflt`.
 *
 * @throws E_MIG_MALFORMED_ARCHIVE unknown or non-byte units, or a multiplier beyond 2^60.
 */
export function allocationUnitsMultiplier(units: string | null | undefined, dflt: number, label: string): number {
  if (units === null || units === undefined || units.trim() === '') return dflt
  const s = units.replace(/\s+/g, '').toLowerCase()
  const word = UNIT_WORDS[s]
  if (word !== undefined) return word
  const m = /^bytes?((?:\*[0-9]{1,10}(?:\^[0-9]{1,3})?)+)$/.exec(s)
  if (!m) throw malformed(label, `unknown allocation units ${JSON.stringify(units.slice(0, 40))}`)
  let mult = 1
  for (const f of m[1]!.split('*').slice(1)) {
    const [b, e] = f.split('^')
    const v = Number(b) ** (e === undefined ? 1 : Number(e))
    mult *= v
    if (!Number.isFinite(mult) || mult > 2 ** 60 || mult < 1) throw malformed(label, `allocation units ${JSON.stringify(units)} out of range`)
  }
  return mult
}

/** `qty * mult` bytes, checked to stay a safe integer. `E_MIG_MALFORMED_ARCHIVE` naming `what`. */
export function bytesOf(qty: number, mult: number, label: string, what: string): number {
  const v = qty * mult
  if (!Number.isSafeInteger(v)) throw malformed(label, `${what}: ${qty} x ${mult} bytes is out of range`)
  return v
}

// ---------------------------------------------------------------------------------------------
// Envelope parsing

function parseItem(el: XEl, label: string): OvfItem | null {
  const p = (local: string): XEl | null => {
    for (const ns of CIM_ITEM_NS) {
      const k = kid(el, [ns], local)
      if (k) return k
    }
    return null
  }
  const all = (local: string): string[] =>
    el.children
      .filter((c) => c.local === local && CIM_ITEM_NS.includes(c.ns))
      .map((c) => c.text)
      .filter((t) => t !== '')
  const rt = textOf(p('ResourceType'))
  if (rt === null) return null
  const resourceType = Number(rt)
  if (!/^[0-9]{1,5}$/.test(rt)) throw malformed(label, `Item ${textOf(p('InstanceID')) ?? '?'}: bad ResourceType ${JSON.stringify(rt.slice(0, 20))}`)
  const cps = kid(el, [NS.vmw], 'CoresPerSocket')
  const conf = attr(el, OVF_NS, 'configuration')
  return {
    instanceId: textOf(p('InstanceID')) ?? '',
    resourceType,
    resourceSubType: textOf(p('ResourceSubType')),
    elementName: textOf(p('ElementName')) ?? textOf(p('Caption')),
    address: textOf(p('Address')),
    addressOnParent: textOf(p('AddressOnParent')),
    parent: textOf(p('Parent')),
    hostResource: all('HostResource'),
    connection: all('Connection'),
    virtualQuantity: textOf(p('VirtualQuantity')),
    allocationUnits: textOf(p('AllocationUnits')),
    coresPerSocket: cps ? parseCount(cps.text, label, 'vmw:CoresPerSocket') : null,
    configuration: conf === null ? null : conf.split(/\s+/).filter(Boolean),
    bound: attr(el, OVF_NS, 'bound'),
  }
}

function parseHardwareSection(el: XEl, label: string): OvfHardwareSection {
  const sys = kid(el, OVF_NS, 'System')
  const systemTypes: string[] = []
  if (sys) for (const t of kids(sys, [NS.vssd], 'VirtualSystemType')) systemTypes.push(...t.text.split(/[\s,]+/).filter(Boolean))
  const items: OvfItem[] = []
  const config = new Map<string, string>()
  for (const c of el.children) {
    if (OVF_NS.includes(c.ns) && (c.local === 'Item' || c.local === 'StorageItem' || c.local === 'EthernetPortItem')) {
      if (items.length >= MAX_ITEMS) throw malformed(label, `more than ${MAX_ITEMS} hardware items`)
      const it = parseItem(c, label)
      if (it) items.push(it)
    } else if (c.ns === NS.vmw && (c.local === 'Config' || c.local === 'ExtraConfig')) {
      const k = attr(c, [NS.vmw], 'key', false)
      const v = attr(c, [NS.vmw], 'value', false)
      if (k !== null && v !== null && config.size < MAX_ITEMS) config.set(k, v)
    }
  }
  return { id: attr(el, OVF_NS, 'id'), systemTypes, items, config }
}

function parseVboxMachine(el: XEl): OvfVboxMachine {
  const hw = kid(el, null, 'Hardware')
  let firmware: 'bios' | 'efi' | null = null
  const macs: string[] = []
  if (hw) {
    const fw = kid(hw, null, 'Firmware')
    const t = fw ? (attr(fw, [], 'type') ?? '') : ''
    if (/^EFI/i.test(t)) firmware = 'efi'
    else if (fw) firmware = 'bios'
    const net = kid(hw, null, 'Network')
    if (net) {
      const adapters = kids(net, null, 'Adapter')
        .filter((a) => (attr(a, [], 'enabled') ?? 'false').toLowerCase() === 'true')
        .sort((a, b) => Number(attr(a, [], 'slot') ?? 0) - Number(attr(b, [], 'slot') ?? 0))
      for (const a of adapters) {
        const m = normalizeMac(attr(a, [], 'MACAddress'))
        if (m) macs.push(m)
      }
    }
  }
  return { name: attr(el, [], 'name'), osType: attr(el, [], 'OSType'), firmware, macs }
}

function findVirtualSystems(el: XEl, out: XEl[], depth: number): void {
  if (depth > 8) return
  for (const c of el.children) {
    if (!OVF_NS.includes(c.ns)) continue
    if (c.local === 'VirtualSystem') out.push(c)
    else if (c.local === 'VirtualSystemCollection') findVirtualSystems(c, out, depth + 1)
  }
}

function collectProperties(el: XEl, props: Map<string, string>, depth: number): void {
  if (depth > 8) return
  for (const c of el.children) {
    if (!OVF_NS.includes(c.ns)) continue
    if (c.local === 'ProductSection') {
      for (const p of kids(c, OVF_NS, 'Property')) {
        const key = attr(p, OVF_NS, 'key')
        const value = attr(p, OVF_NS, 'value')
        if (key !== null && value !== null && props.size < MAX_ITEMS) props.set(key, value)
      }
    } else if (c.local === 'VirtualSystem' || c.local === 'VirtualSystemCollection') collectProperties(c, props, depth + 1)
  }
}

/**
 * Parses an OVF descriptor (DSP0243 1.x or 2.0 envelope).
 *
 * Reads References/File, DiskSection/Disk (capacity in bytes after `ovf:capacityAllocationUnits`,
 * default bytes; `${property}` capacities resolved from ProductSection defaults),
 * NetworkSection, DeploymentOptionSection default, and of the first VirtualSystem: name/id,
 * OperatingSystemSection, every VirtualHardwareSection, and an embedded `vbox:Machine`.
 *
 * @param xml descriptor text (at most {@link MAX_DESCRIPTOR_BYTES}).
 * @param label file or member name for messages.
 * @throws E_MIG_MALFORMED_ARCHIVE not well-formed XML, DOCTYPE, root not an OVF Envelope, missing
 *   required attributes (File href/id, Disk diskId/capacity), bad numbers or units, duplicate ids.
 * @throws E_MIG_UNSUPPORTED_FORMAT an OVF 0.9 envelope, an unknown `ovf:compression`.
 */
export function parseOvfEnvelope(xml: string, label: string): OvfEnvelope {
  const root = parseXml(xml.replace(/^\uFEFF/, ''), label)
  if (root.local !== 'Envelope') throw malformed(label, `root element is ${root.local}, not an OVF Envelope`)
  if (root.ns === NS.ovf09) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: OVF 0.9 envelopes are not supported (DSP0243 1.0 or later needed)`)
  if (!OVF_NS.includes(root.ns)) throw malformed(label, `Envelope is in namespace ${JSON.stringify(root.ns)}, not an OVF envelope namespace`)
  const version: '1' | '2' = root.ns === NS.ovf2 ? '2' : '1'
  const warnings: string[] = []

  const props = new Map<string, string>()
  collectProperties(root, props, 0)

  // References
  const files: OvfFile[] = []
  const fileIds = new Set<string>()
  const refs = kid(root, OVF_NS, 'References')
  if (refs) {
    for (const f of kids(refs, OVF_NS, 'File')) {
      if (files.length >= MAX_FILES) throw malformed(label, `more than ${MAX_FILES} References/File entries`)
      const id = attr(f, OVF_NS, 'id')
      const href = attr(f, OVF_NS, 'href')
      if (!id || !href) throw malformed(label, 'References/File without ovf:id or ovf:href')
      if (fileIds.has(id)) throw malformed(label, `duplicate File ovf:id ${JSON.stringify(id)}`)
      fileIds.add(id)
      const comp = attr(f, OVF_NS, 'compression')
      let compression: 'gzip' | null = null
      if (comp === 'gzip') compression = 'gzip'
      else if (comp !== null && comp !== 'identity' && comp !== '')
        throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: File ${href}: compression ${JSON.stringify(comp)} is not supported`)
      const chunk = parseCount(attr(f, OVF_NS, 'chunkSize'), label, `File ${href} ovf:chunkSize`)
      if (chunk === 0) throw malformed(label, `File ${href}: ovf:chunkSize is 0`)
      files.push({ id, href, size: parseCount(attr(f, OVF_NS, 'size'), label, `File ${href} ovf:size`), compression, chunkSize: chunk })
    }
  }

  const vsList: XEl[] = []
  findVirtualSystems(root, vsList, 0)
  if (vsList.length === 0) throw malformed(label, 'no VirtualSystem in the envelope')
  if (vsList.length > 1) warnings.push(`${label}: ${vsList.length} virtual systems; importing the first (${attr(vsList[0]!, OVF_NS, 'id') ?? 'unnamed'})`)
  const vs = vsList[0]!

  // DiskSection(s): in the Envelope (1.x) and possibly in the VirtualSystem (2.0).
  const disks: OvfDisk[] = []
  const diskIds = new Set<string>()
  for (const ds of [...kids(root, OVF_NS, 'DiskSection'), ...kids(vs, OVF_NS, 'DiskSection')]) {
    for (const d of kids(ds, OVF_NS, 'Disk')) {
      if (disks.length >= MAX_FILES) throw malformed(label, `more than ${MAX_FILES} disks`)
      const diskId = attr(d, OVF_NS, 'diskId')
      if (!diskId) throw malformed(label, 'DiskSection/Disk without ovf:diskId')
      if (diskIds.has(diskId)) throw malformed(label, `duplicate Disk ovf:diskId ${JSON.stringify(diskId)}`)
      diskIds.add(diskId)
      let capText = attr(d, OVF_NS, 'capacity')
      if (capText === null) throw malformed(label, `Disk ${diskId}: no ovf:capacity`)
      const pm = /^\$\{([^}]{1,200})\}$/.exec(capText.trim())
      if (pm) {
        const v = props.get(pm[1]!)
        if (v === undefined) throw malformed(label, `Disk ${diskId}: ovf:capacity refers to unknown property ${pm[1]}`)
        capText = v
      }
      const cap = parseCount(capText, label, `Disk ${diskId} ovf:capacity`)!
      const mult = allocationUnitsMultiplier(attr(d, OVF_NS, 'capacityAllocationUnits'), 1, `${label}: Disk ${diskId}`)
      const populated = parseCount(attr(d, OVF_NS, 'populatedSize'), label, `Disk ${diskId} ovf:populatedSize`)
      disks.push({
        diskId,
        fileRef: attr(d, OVF_NS, 'fileRef') || null,
        capacity: bytesOf(cap, mult, label, `Disk ${diskId} capacity`),
        populatedSize: populated,
        format: attr(d, OVF_NS, 'format'),
        parentRef: attr(d, OVF_NS, 'parentRef'),
      })
    }
  }
  for (const d of disks)
    if (d.fileRef !== null && !fileIds.has(d.fileRef))
      throw malformed(label, `Disk ${d.diskId}: ovf:fileRef ${JSON.stringify(d.fileRef)} names no References/File`)

  const networks: OvfNetwork[] = []
  for (const ns of kids(root, OVF_NS, 'NetworkSection')) {
    for (const n of kids(ns, OVF_NS, 'Network')) {
      const name = attr(n, OVF_NS, 'name')
      if (name !== null && networks.length < MAX_FILES) networks.push({ name, description: textOf(kid(n, OVF_NS, 'Description')) })
    }
  }

  let defaultConfiguration: string | null = null
  const dos = kid(root, OVF_NS, 'DeploymentOptionSection')
  if (dos) {
    const confs = kids(dos, OVF_NS, 'Configuration')
    const def = confs.find((c) => (attr(c, OVF_NS, 'default') ?? '').toLowerCase() === 'true') ?? confs[0]
    if (def) defaultConfiguration = attr(def, OVF_NS, 'id')
  }

  const oss = kid(vs, OVF_NS, 'OperatingSystemSection')
  let cimId: number | null = null
  if (oss) {
    const idText = attr(oss, OVF_NS, 'id')
    if (idText !== null && /^[0-9]{1,5}$/.test(idText.trim())) cimId = Number(idText.trim())
    else if (idText !== null) warnings.push(`${label}: OperatingSystemSection ovf:id ${JSON.stringify(idText.slice(0, 20))} is not a CIM OsType number`)
  }
  const vboxEl = kid(vs, [NS.vbox], 'Machine')
  const vbox = vboxEl ? parseVboxMachine(vboxEl) : null
  const os: OvfOperatingSystem = {
    cimId,
    vmwOsType: oss ? attr(oss, [NS.vmw], 'osType', false) : null,
    vboxOsType: (oss ? textOf(kid(oss, [NS.vbox], 'OSType')) : null) ?? vbox?.osType ?? null,
    description: oss ? textOf(kid(oss, OVF_NS, 'Description')) : null,
  }

  const hardwareSections = kids(vs, OVF_NS, 'VirtualHardwareSection').map((h) => parseHardwareSection(h, label))
  if (hardwareSections.length === 0) throw malformed(label, `VirtualSystem ${attr(vs, OVF_NS, 'id') ?? ''}: no VirtualHardwareSection`)

  return {
    version,
    files,
    disks,
    networks,
    defaultConfiguration,
    virtualSystem: {
      id: attr(vs, OVF_NS, 'id'),
      name: textOf(kid(vs, OVF_NS, 'Name')) ?? vbox?.name ?? null,
      os,
      hardwareSections,
      vbox,
    },
    warnings,
  }
}

// ---------------------------------------------------------------------------------------------
// Hardware section choice, CIM OS types, formats

/**
 * Picks the VirtualHardwareSection a KVM host can use when a VirtualSystem has several (DSP0243
 * 9.5 allows one per virtualization platform). Rule, best first, ties broken by document order:
 * 3: a type naming KVM/QEMU/libvirt; 2: a generic, VMware (`vmx-*`) or VirtualBox
 * (`virtualbox-*`) section (their items are plain CIM RASD that a KVM host can map);
 * 1: a section without VirtualSystemType; 0: other vendor-specific types (e.g. `xen-*`,
 * `hyperv-*`, `ovirt-*`) whose items may rely on that platform.
 */
export function pickHardwareSection(env: OvfEnvelope): OvfHardwareSection {
  const score = (s: OvfHardwareSection): number => {
    if (s.systemTypes.length === 0) return 1
    let best = 0
    for (const t of s.systemTypes) {
      if (/kvm|qemu|libvirt/i.test(t)) best = Math.max(best, 3)
      else if (/^vmx-\d+$/i.test(t) || /^virtualbox-/i.test(t) || /generic/i.test(t)) best = Math.max(best, 2)
    }
    return best
  }
  let pick = env.virtualSystem.hardwareSections[0]!
  for (const s of env.virtualSystem.hardwareSections) if (score(s) > score(pick)) pick = s
  return pick
}

/**
 * qemu format of a DiskSection `ovf:format` URI: VMware's `…/vmdk.html#streamOptimized` (and
 * `#sparse`, `#monolithicSparse`, `#compressed`) is `vmdk`; qcow URIs `qcow2`; VHDX `vhdx`; VHD
 * (Microsoft/Citrix `…vhd…`) `vpc`; VirtualBox VDI `vdi`; `raw`. Unknown or absent: null.
 */
export function diskFormatFromUri(uri: string | null): DiskFormat | null {
  if (!uri) return null
  const u = uri.toLowerCase()
  if (u.includes('vmdk')) return 'vmdk'
  if (u.includes('qcow')) return 'qcow2'
  if (u.includes('vhdx')) return 'vhdx'
  if (u.includes('vdi')) return 'vdi'
  if (/\bvhd\b|vhd\.|#vhd|virtualhd|bb676673|linkid=137171/.test(u)) return 'vpc'
  if (/\braw\b/.test(u)) return 'raw'
  return null
}

/**
 * Checks an OVF `ovf:href` (or `.mf` name) and returns it as a normalized relative POSIX path.
 * DSP0243 allows relative URLs; the migrator refuses absolute paths, `..` segments, backslashes,
 * NUL bytes and any URL scheme (`http:`, `file:`, `C:`), which would reach outside the package.
 *
 * @throws E_MIG_HOST_PATH_REJECTED naming the href and `label`.
 */
export function checkHref(href: string, label: string): string {
  const reject = (why: string) =>
    new MigError('E_MIG_HOST_PATH_REJECTED', `${label}: href ${JSON.stringify(href.slice(0, 200))} rejected: ${why}`, { details: { href: href.slice(0, 200) } })
  if (href === '' || href.includes('\0')) throw reject('empty or NUL')
  if (/^[A-Za-z][A-Za-z0-9+.-]*:/.test(href)) throw reject('URL scheme or drive letter')
  if (href.includes('\\')) throw reject('backslash')
  let decoded = href
  if (href.includes('%')) {
    try {
      decoded = decodeURIComponent(href)
    } catch {
      throw reject('bad percent-encoding')
    }
    if (decoded.includes('\0') || decoded.includes('\\')) throw reject('encoded NUL or backslash')
  }
  for (const s of [href, decoded]) {
    if (s.startsWith('/')) throw reject('absolute path')
    if (s.split('/').some((seg) => seg === '..')) throw reject('".." path segment')
  }
  const norm = posix.normalize(href)
  if (norm === '.' || norm.startsWith('../') || norm === '..') throw reject('does not name a file')
  return norm
}

/**
 * Decodes descriptor bytes to text: UTF-8 (BOM stripped) or UTF-16 with a BOM.
 */
export function decodeDescriptor(buf: Buffer): string {
  if (buf.length >= 2 && buf[0] === 0xff && buf[1] === 0xfe) return buf.subarray(2).toString('utf16le')
  if (buf.length >= 2 && buf[0] === 0xfe && buf[1] === 0xff) {
    const body = buf.subarray(2, 2 + ((buf.length - 2) & ~1))
    return Buffer.from(body).swap16().toString('utf16le')
  }
  return buf.toString('utf8').replace(/^\uFEFF/, '')
}

/**
 * qemu format of one OVF disk file from its DiskSection `ovf:format` URI and the magic bytes of
 * its data (`head`: first bytes, already inflated when the file is gzip-compressed; `tail`: last
 * 512 bytes of an uncompressed file, for fixed VHD). The magic wins when both are known and
 * disagree (a warning is pushed); a URI-declared image format whose magic is absent is an error;
 * neither known means `raw`, with a warning.
 *
 * @throws E_MIG_MALFORMED_ARCHIVE the URI says vmdk/qcow2/vhdx/vdi/vpc but the data does not start
 *   with that format's signature (`name` is named).
 */
export function chooseDiskFormat(p: { uri: string | null; head: Uint8Array; tail?: Uint8Array; name: string; warnings: string[] }): DiskFormat {
  const declared = diskFormatFromUri(p.uri)
  const sniffed = sniffDiskFormat(p.head, p.tail)
  if (sniffed) {
    if (declared && declared !== sniffed && declared !== 'raw')
      p.warnings.push(`${p.name}: DiskSection format says ${declared} but the data is ${sniffed}; using ${sniffed}`)
    return sniffed
  }
  if (declared && declared !== 'raw') {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${p.name}: DiskSection format is ${declared} but the data has no ${declared} signature`, {
      details: { file: p.name },
    })
  }
  if (!declared) p.warnings.push(`${p.name}: format not declared and not recognized; reading it as raw`)
  return 'raw'
}
