/**
 * OVF envelope reader (DMTF DSP0243 "Open Virtualization Format Specification", 1.x and 2.0
 * envelopes) and the OVF-to-{@link VmManifest} assembly shared by the `ova_archive` and
 * `ovf_folder` importers.
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
import { gunzipSync, constants as zconst } from 'node:zlib'
import * as posix from 'node:path/posix'
import { MigError } from '../errors.ts'
import { malformed } from './io.ts'
import { decodeXmlText, parseOrderedXml, UNSAFE_MARK, UNSAFE_NAMES } from './xml.ts'
import type { ManifestVerification } from './ovf-manifest.ts'
import { guestFamilyOf, type ControllerBus, type DiskFormat, type DiskSource, type GuestFamily, type ManifestDisk, type ManifestNic, type VmManifest } from '../manifest.ts'

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

const OVF_NS: readonly string[] = [NS.ovf1, NS.ovf2]
const CIM_ITEM_NS: readonly string[] = [NS.rasd, NS.sasd, NS.epasd]

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
// Minimal namespace-aware DOM over fast-xml-parser's ordered output

interface XAttr { ns: string; local: string; value: string }
interface XEl { ns: string; local: string; attrs: XAttr[]; children: XEl[]; text: string }


function splitQName(q: string): [string | null, string] {
  const i = q.indexOf(':')
  return i < 0 ? [null, q] : [q.slice(0, i), q.slice(i + 1)]
}

/** Builds the namespace-resolved tree from fast-xml-parser's `preserveOrder` output. */
function buildTree(nodes: unknown[], scope: Map<string, string>, label: string, depth: number): XEl[] {
  const out: XEl[] = []
  if (depth > 200) throw malformed(label, 'XML nested too deeply')
  for (const node of nodes) {
    if (!node || typeof node !== 'object') continue
    const keys = Object.keys(node).filter((k) => k !== ':@' && k !== '#text' && k !== '#cdata')
    if (keys.length !== 1) continue
    const qname = keys[0]!
    if (qname.startsWith(UNSAFE_MARK) || qname.startsWith('?') || qname.startsWith('!')) continue
    const rawAttrs = ((node as Record<string, unknown>)[':@'] ?? {}) as Record<string, unknown>
    // Namespace declarations of this element.
    let local = scope
    for (const [k, v] of Object.entries(rawAttrs)) {
      if (typeof v !== 'string') continue
      if (k === 'xmlns' || k.startsWith('xmlns:')) {
        if (local === scope) local = new Map(scope)
        local.set(k === 'xmlns' ? '' : k.slice(6), decodeXmlText(v, label))
      }
    }
    const [prefix, lname] = splitQName(qname)
    const ns = prefix === null ? (local.get('') ?? '') : local.get(prefix)
    if (ns === undefined) throw malformed(label, `undeclared namespace prefix ${JSON.stringify(prefix)} on element ${JSON.stringify(qname)}`)
    const attrs: XAttr[] = []
    for (const [k, v] of Object.entries(rawAttrs)) {
      if (typeof v !== 'string' || k === 'xmlns' || k.startsWith('xmlns:') || k.startsWith(UNSAFE_MARK)) continue
      const [ap, al] = splitQName(k)
      if (UNSAFE_NAMES.has(al)) continue
      let ans = ''
      if (ap === 'xml') ans = NS.xml
      else if (ap !== null) {
        const u = local.get(ap)
        if (u === undefined) throw malformed(label, `undeclared namespace prefix ${JSON.stringify(ap)} on attribute ${JSON.stringify(k)}`)
        ans = u
      }
      attrs.push({ ns: ans, local: al, value: decodeXmlText(v, label) })
    }
    const kids = (node as Record<string, unknown>)[qname]
    const children: XEl[] = []
    let text = ''
    if (Array.isArray(kids)) {
      for (const k of kids) {
        if (k && typeof k === 'object') {
          const t = (k as Record<string, unknown>)['#text']
          if (typeof t === 'string' || typeof t === 'number') text += decodeXmlText(String(t), label)
          const c = (k as Record<string, unknown>)['#cdata']
          if (Array.isArray(c)) for (const ct of c) if (ct && typeof (ct as Record<string, unknown>)['#text'] === 'string') text += (ct as Record<string, string>)['#text']
        }
      }
      children.push(...buildTree(kids, local, label, depth + 1))
    }
    if (UNSAFE_NAMES.has(lname)) continue
    out.push({ ns, local: lname, attrs, children, text: text.trim() })
  }
  return out
}

/**
 * Parses XML text into the namespace-resolved tree. Refuses DOCTYPE (and so any entity
 * declaration), malformed XML, undeclared prefixes, non-predefined entities.
 */
function parseXml(xml: string, label: string): XEl {
  if (xml.length > MAX_DESCRIPTOR_BYTES) throw malformed(label, `descriptor larger than ${MAX_DESCRIPTOR_BYTES} bytes`)
  const raw = parseOrderedXml(xml, label, { trim: true, cdata: true, maxNestedTags: 200 })
  const roots = buildTree(raw, new Map([['xml', NS.xml]]), label, 0)
  if (roots.length !== 1) throw malformed(label, `expected one root element, found ${roots.length}`)
  return roots[0]!
}

function attr(el: XEl, nss: readonly string[], local: string, unqualifiedFallback = true): string | null {
  for (const a of el.attrs) if (a.local === local && nss.includes(a.ns)) return a.value
  if (unqualifiedFallback) for (const a of el.attrs) if (a.local === local && a.ns === '') return a.value
  return null
}
function kids(el: XEl, nss: readonly string[] | null, local: string): XEl[] {
  return el.children.filter((c) => c.local === local && (nss === null || nss.includes(c.ns)))
}
function kid(el: XEl, nss: readonly string[] | null, local: string): XEl | null {
  return el.children.find((c) => c.local === local && (nss === null || nss.includes(c.ns))) ?? null
}
function textOf(el: XEl | null): string | null {
  if (!el) return null
  return el.text === '' ? null : el.text
}

// ---------------------------------------------------------------------------------------------
// Numbers and units

function parseCount(s: string | null, label: string, what: string): number | null {
  if (s === null) return null
  const t = s.trim()
  if (!/^[0-9]{1,16}$/.test(t) || Number(t) > Number.MAX_SAFE_INTEGER) throw malformed(label, `${what}: not a non-negative integer: ${JSON.stringify(t.slice(0, 40))}`)
  return Number(t)
}

const UNIT_WORDS: Record<string, number> = Object.assign(Object.create(null), {
  byte: 1, bytes: 1, b: 1,
  kilobyte: 2 ** 10, kilobytes: 2 ** 10, kb: 2 ** 10, kib: 2 ** 10,
  megabyte: 2 ** 20, megabytes: 2 ** 20, mb: 2 ** 20, mib: 2 ** 20,
  gigabyte: 2 ** 30, gigabytes: 2 ** 30, gb: 2 ** 30, gib: 2 ** 30,
  terabyte: 2 ** 40, terabytes: 2 ** 40, tb: 2 ** 40, tib: 2 ** 40,
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

function bytesOf(qty: number, mult: number, label: string, what: string): number {
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
  const all = (local: string): string[] => el.children.filter((c) => c.local === local && CIM_ITEM_NS.includes(c.ns)).map((c) => c.text).filter((t) => t !== '')
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

function normalizeMac(s: string | null | undefined): string | null {
  if (!s) return null
  const hex = s.trim().replace(/[:\-.\s]/g, '')
  if (!/^[0-9a-fA-F]{12}$/.test(hex)) return null
  return hex.toLowerCase().match(/../g)!.join(':')
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
      else if (comp !== null && comp !== 'identity' && comp !== '') throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: File ${href}: compression ${JSON.stringify(comp)} is not supported`)
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
  for (const d of disks) if (d.fileRef !== null && !fileIds.has(d.fileRef)) throw malformed(label, `Disk ${d.diskId}: ovf:fileRef ${JSON.stringify(d.fileRef)} names no References/File`)

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

/** CIM_OperatingSystem.OSType ValueMap (CIM schema 2.52, values 0-120): description and family. */
const CIM_OS: readonly string[] = [
  'Unknown', 'Other', 'MACOS', 'ATTUNIX', 'DGUX', 'DECNT', 'Tru64 UNIX', 'OpenVMS', 'HPUX', 'AIX',
  'MVS', 'OS400', 'OS/2', 'JavaVM', 'MSDOS', 'WIN3x', 'WIN95', 'WIN98', 'WINNT', 'WINCE',
  'NCR3000', 'NetWare', 'OSF', 'DC/OS', 'Reliant UNIX', 'SCO UnixWare', 'SCO OpenServer', 'Sequent', 'IRIX', 'Solaris',
  'SunOS', 'U6000', 'ASERIES', 'HP NonStop OS', 'HP NonStop OSS', 'BS2000', 'LINUX', 'Lynx', 'XENIX', 'VM',
  'Interactive UNIX', 'BSDUNIX', 'FreeBSD', 'NetBSD', 'GNU Hurd', 'OS9', 'MACH Kernel', 'Inferno', 'QNX', 'EPOC',
  'IxWorks', 'VxWorks', 'MiNT', 'BeOS', 'HP MPE', 'NextStep', 'PalmPilot', 'Rhapsody', 'Windows 2000', 'Dedicated',
  'OS/390', 'VSE', 'TPF', 'Windows (R) Me', 'Caldera Open UNIX', 'OpenBSD', 'Not Applicable', 'Windows XP', 'z/OS', 'Microsoft Windows Server 2003',
  'Microsoft Windows Server 2003 64-Bit', 'Windows XP 64-Bit', 'Windows XP Embedded', 'Windows Vista', 'Windows Vista 64-Bit', 'Windows Embedded for Point of Service', 'Microsoft Windows Server 2008', 'Microsoft Windows Server 2008 64-Bit', 'FreeBSD 64-Bit', 'RedHat Enterprise Linux',
  'RedHat Enterprise Linux 64-Bit', 'Solaris 64-Bit', 'SUSE', 'SUSE 64-Bit', 'SLES', 'SLES 64-Bit', 'Novell OES', 'Novell Linux Desktop', 'Sun Java Desktop System', 'Mandriva',
  'Mandriva 64-Bit', 'TurboLinux', 'TurboLinux 64-Bit', 'Ubuntu', 'Ubuntu 64-Bit', 'Debian', 'Debian 64-Bit', 'Linux 2.4.x', 'Linux 2.4.x 64-Bit', 'Linux 2.6.x',
  'Linux 2.6.x 64-Bit', 'Linux 64-Bit', 'Other 64-Bit', 'Microsoft Windows Server 2008 R2', 'VMware ESXi', 'Microsoft Windows 7', 'CentOS 32-bit', 'CentOS 64-bit', 'Oracle Linux 32-bit', 'Oracle Linux 64-bit',
  'eComStation 32-bitx', 'Microsoft Windows Server 2011', 'Microsoft Windows Server 2012', 'Microsoft Windows 8', 'Microsoft Windows 8 64-bit', 'Microsoft Windows Server 2012 R2', 'Microsoft Windows 8.1', 'Microsoft Windows 8.1 64-bit', 'Microsoft Windows Server 2016', 'Microsoft Windows 10',
  'Microsoft Windows 10 64-bit',
]
const CIM_WINDOWS = new Set([5, 15, 16, 17, 18, 19, 58, 63, 67, 69, 70, 71, 72, 73, 74, 75, 76, 77, 103, 105, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120])
const CIM_LINUX = new Set([36, 79, 80, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 106, 107, 108, 109])

/**
 * Description and guest family of a CIM_OperatingSystem OSType value (the OVF
 * OperatingSystemSection `ovf:id`): Windows ids (WIN3x..Windows 10 64-bit), Linux ids (LINUX,
 * RHEL, SUSE, Ubuntu, Debian, Linux 2.x, CentOS, Oracle Linux, ...), other known ids `other`,
 * 0 / 66 / unknown numbers `unknown`.
 */
export function cimOsType(id: number): { name: string | null; family: GuestFamily } {
  const name = CIM_OS[id] ?? null
  if (CIM_WINDOWS.has(id)) return { name, family: 'windows' }
  if (CIM_LINUX.has(id)) return { name, family: 'linux' }
  if (name === null || id === 0 || id === 66) return { name, family: 'unknown' }
  return { name, family: 'other' }
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
 * Disk format from magic bytes at the start of the data (qemu's probes): `KDMV` or
 * `# Disk DescriptorFile` VMDK, `QFI\xfb` qcow2, `vhdxfile` VHDX, `conectix` VHD (dynamic disks
 * carry a footer copy at offset 0; fixed ones only at the end: pass `tail`, the last 512 bytes),
 * VDI signature `0xbeda107f` at 0x40. Returns null when none matches (raw or unknown).
 */
export function sniffDiskFormat(head: Uint8Array, tail?: Uint8Array): DiskFormat | null {
  const b = Buffer.from(head.buffer, head.byteOffset, head.byteLength)
  if (b.length >= 4 && b.toString('latin1', 0, 4) === 'KDMV') return 'vmdk'
  if (b.length >= 20 && b.toString('latin1', 0, 20) === '# Disk DescriptorFile') return 'vmdk'
  if (b.length >= 4 && b[0] === 0x51 && b[1] === 0x46 && b[2] === 0x49 && b[3] === 0xfb) return 'qcow2'
  if (b.length >= 8 && b.toString('latin1', 0, 8) === 'vhdxfile') return 'vhdx'
  if (b.length >= 8 && b.toString('latin1', 0, 8) === 'conectix') return 'vpc'
  if (b.length >= 0x44 && b.readUInt32LE(0x40) === 0xbeda107f) return 'vdi'
  if (tail && tail.length >= 8 && Buffer.from(tail.buffer, tail.byteOffset, 8).toString('latin1') === 'conectix') return 'vpc'
  return null
}

/**
 * First bytes (at most 64 KiB) of a gzip member (`ovf:compression="gzip"`): inflates growing
 * prefixes of the compressed data (512 B .. 64 KiB) until at least 512 bytes come out, each
 * attempt capped at 16 MiB of output (deflate expands at most ~1032:1). Empty when it cannot
 * be inflated.
 */
export function inflateHead(gz: Uint8Array): Buffer {
  let best = Buffer.alloc(0)
  for (const n of [512, 2048, 8192, 32768, 65536]) {
    try {
      const out = gunzipSync(gz.subarray(0, n), { finishFlush: zconst.Z_SYNC_FLUSH, maxOutputLength: 16 * 1024 * 1024 })
      if (out.length > best.length) best = out.subarray(0, 64 * 1024)
      if (out.length >= 512 || n >= gz.length) break
    } catch {
      break
    }
  }
  return best
}

/**
 * Checks an OVF `ovf:href` (or `.mf` name) and returns it as a normalized relative POSIX path.
 * DSP0243 allows relative URLs; the migrator refuses absolute paths, `..` segments, backslashes,
 * NUL bytes and any URL scheme (`http:`, `file:`, `C:`), which would reach outside the package.
 *
 * @throws E_MIG_HOST_PATH_REJECTED naming the href and `label`.
 */
export function checkHref(href: string, label: string): string {
  const reject = (why: string) => new MigError('E_MIG_HOST_PATH_REJECTED', `${label}: href ${JSON.stringify(href.slice(0, 200))} rejected: ${why}`, { details: { href: href.slice(0, 200) } })
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

// ---------------------------------------------------------------------------------------------
// Manifest assembly

/** How an importer located one References/File: the manifest DiskSource, qemu format, and (for `ovf:/file/` disks without a DiskSection entry) a capacity. */
export interface ResolvedOvfFile {
  source: DiskSource
  disk_format: DiskFormat
  capacity_bytes?: number
}

/** One disk of the chosen hardware section with its DiskSection entry and File. */
export interface OvfDiskRef {
  item: OvfItem
  disk: OvfDisk | null
  file: OvfFile
}

/**
 * Applies a verified `.mf` (see `verifyOvfManifest`) to the resolved disk files of an OVF
 * package (OVA or folder alike): a digest deferred from inspect (file over 64 MiB) goes to the
 * file's `DiskSource.digest`, to be checked when the disk is copied; a chunked file's deferred
 * chunk digests and a file the manifest does not list get a warning in `warnings`.
 * `mfName` names the manifest in the warnings. Throws what {@link checkHref} throws.
 */
export function attachManifestDigests(
  refs: readonly OvfDiskRef[],
  sources: Map<string, ResolvedOvfFile>,
  listedNames: ReadonlySet<string>,
  deferred: ManifestVerification['deferred'],
  mfName: string,
  label: string,
  warnings: string[],
): void {
  for (const { file } of refs) {
    const rel = checkHref(file.href, label)
    const src = sources.get(file.id)!
    if (file.chunkSize !== null) {
      const big = [...deferred.keys()].filter((n) => n.startsWith(`${rel}.`))
      if (big.length) warnings.push(`${file.href}: ${big.length} chunk digest(s) over 64 MiB are not verified at inspect`)
      continue
    }
    const d = deferred.get(rel)
    if (d) src.source.digest = { algorithm: d.algorithm, hex: d.hex }
    if (!listedNames.has(rel)) warnings.push(`${file.href}: not listed in the manifest ${mfName}; not verified`)
  }
}

function itemApplies(env: OvfEnvelope, it: OvfItem): boolean {
  if (it.bound !== null && it.bound !== 'normal') return false
  if (it.configuration === null) return true
  return env.defaultConfiguration !== null && it.configuration.includes(env.defaultConfiguration)
}

const DISK_TYPES = new Set([17, 19, 31])

/**
 * Disks of `section` that have data (HostResource `ovf:/disk/<id>` with a fileRef, or
 * `ovf:/file/<id>`; VirtualBox's `/disk/<id>` spelling too), in section order, plus warnings for
 * disks without data (new empty disks) that are left out.
 *
 * @throws E_MIG_MALFORMED_ARCHIVE a HostResource naming no Disk or File.
 */
export function ovfDiskRefs(env: OvfEnvelope, section: OvfHardwareSection, label = 'OVF'): { refs: OvfDiskRef[]; warnings: string[] } {
  const refs: OvfDiskRef[] = []
  const warnings: string[] = []
  const diskById = new Map(env.disks.map((d) => [d.diskId, d]))
  const fileById = new Map(env.files.map((f) => [f.id, f]))
  for (const it of section.items) {
    if (!DISK_TYPES.has(it.resourceType) || !itemApplies(env, it)) continue
    const name = it.elementName ?? `item ${it.instanceId}`
    const hr = it.hostResource[0]
    if (hr === undefined) {
      if (it.resourceType === 17) warnings.push(`${name}: no HostResource (an empty disk to create); not imported`)
      continue
    }
    const m = /^(?:ovf:)?\/?(disk|file)\/(.+)$/.exec(hr.trim())
    if (!m) {
      warnings.push(`${name}: HostResource ${JSON.stringify(hr.slice(0, 80))} is not ovf:/disk/ or ovf:/file/; not imported`)
      continue
    }
    if (m[1] === 'disk') {
      const disk = diskById.get(m[2]!)
      if (!disk) throw malformed(label, `${name}: HostResource ${hr} names no DiskSection disk`)
      if (disk.fileRef === null) {
        warnings.push(`${name}: disk ${disk.diskId} has no ovf:fileRef (an empty disk to create); not imported`)
        continue
      }
      if (disk.parentRef !== null) warnings.push(`${name}: disk ${disk.diskId} is a delta of ${disk.parentRef}; only its own file is imported`)
      refs.push({ item: it, disk, file: fileById.get(disk.fileRef)! })
    } else {
      const file = fileById.get(m[2]!)
      if (!file) throw malformed(label, `${name}: HostResource ${hr} names no References/File`)
      refs.push({ item: it, disk: null, file })
    }
  }
  return { refs, warnings }
}

/**
 * Bus of a controller item: ResourceType 5 IDE, 6 SCSI (lsilogic, lsilogicsas, VirtualSCSI,
 * buslogic), 20 "other storage" by ResourceSubType (AHCI = sata, `vmware.nvme.controller` = nvme).
 */
export function controllerBus(c: OvfItem): ControllerBus {
  const sub = (c.resourceSubType ?? '').toLowerCase()
  if (c.resourceType === 5) return 'ide'
  if (c.resourceType === 6) return 'scsi'
  if (c.resourceType === 20) {
    if (sub.includes('nvme')) return 'nvme'
    if (sub.includes('ahci') || sub.includes('sata')) return 'sata'
    if (sub.includes('virtio')) return 'virtio'
    if (sub.includes('ide') || sub.includes('piix')) return 'ide'
    if (sub.includes('scsi') || sub.includes('lsi') || sub.includes('buslogic')) return 'scsi'
  }
  return 'unknown'
}

/** Options of {@link ovfToManifest}. */
export interface OvfToManifestOptions {
  sourceFormat: 'ova_archive' | 'ovf_folder'
  /** Section to use (default {@link pickHardwareSection}). */
  section?: OvfHardwareSection
  /** Every File id used by {@link ovfDiskRefs} resolved by the importer. */
  sources: Map<string, ResolvedOvfFile>
  /** Importer warnings to carry (first). */
  warnings?: string[]
  /** Name when the descriptor gives none (e.g. the descriptor's base name). */
  fallbackName?: string
  label?: string
}

/**
 * Builds the {@link VmManifest} of an OVF package (shared by the OVA and OVF-folder importers).
 *
 * - disks: data-bearing disks of the hardware section in its order; bus from the parent
 *   controller item (5 IDE, 6 SCSI, 20 AHCI = sata / `vmware.nvme.controller` = nvme);
 *   `address` is `"<controller index>:<AddressOnParent>"`, the controller index being its
 *   `rasd:Address` (else its rank among controllers of the same bus); capacity in bytes from the
 *   DiskSection (`ovf:/file/` disks use the importer's `capacity_bytes`); allocated bytes from
 *   `ovf:populatedSize`.
 * - cpu: ResourceType 3 VirtualQuantity and `vmw:CoresPerSocket`; memory: ResourceType 4
 *   VirtualQuantity x AllocationUnits (default MiB).
 * - guest: `vmw:osType`, else VirtualBox OSType, else the CIM OsType table ({@link cimOsType}).
 * - NICs: ResourceType 10 items (items of non-default deployment options and `ovf:bound`
 *   min/max items skipped); MAC from `rasd:Address` lower-cased, else from the enabled adapters
 *   of an embedded `vbox:Machine`, else null.
 * - firmware: `vmw:Config firmware=efi`, else `vbox:Machine` Firmware, else BIOS; secure boot
 *   from `uefi.secureBoot.enabled` / `bootOptions.efiSecureBootEnabled`.
 *
 * @throws E_MIG_MALFORMED_ARCHIVE a disk file not resolved, bad quantities, an image whose header
 *   virtual size (VMDK sparse/qcow2 header, or a raw file's size) exceeds its DiskSection capacity
 *   (a smaller image is grown to the capacity, with a warning).
 */
export function ovfToManifest(env: OvfEnvelope, opts: OvfToManifestOptions): VmManifest {
  const label = opts.label ?? 'OVF'
  const section = opts.section ?? pickHardwareSection(env)
  const warnings = [...(opts.warnings ?? []), ...env.warnings]
  if (env.virtualSystem.hardwareSections.length > 1) warnings.push(`${env.virtualSystem.hardwareSections.length} VirtualHardwareSections; using the one of type ${section.systemTypes.join(' ') || '(none)'}`)
  const items = section.items.filter((it) => itemApplies(env, it))
  const byId = new Map<string, OvfItem>()
  for (const it of items) if (it.instanceId !== '' && !byId.has(it.instanceId)) byId.set(it.instanceId, it)

  // CPU
  const cpuItem = items.find((i) => i.resourceType === 3)
  let count = 1
  let cores = 1
  if (cpuItem?.virtualQuantity != null) count = parseCount(cpuItem.virtualQuantity, label, 'CPU VirtualQuantity')!
  else warnings.push('no CPU item; assuming 1 vCPU')
  if (count < 1 || count > 4096) throw malformed(label, `CPU VirtualQuantity ${count} out of range`)
  if (cpuItem?.coresPerSocket != null) {
    if (cpuItem.coresPerSocket >= 1 && count % cpuItem.coresPerSocket === 0) cores = cpuItem.coresPerSocket
    else warnings.push(`vmw:CoresPerSocket ${cpuItem.coresPerSocket} does not divide ${count} vCPUs; using 1`)
  }

  // Memory
  const memItem = items.find((i) => i.resourceType === 4)
  let memory = 0
  if (memItem?.virtualQuantity != null) {
    const q = parseCount(memItem.virtualQuantity, label, 'memory VirtualQuantity')!
    memory = bytesOf(q, allocationUnitsMultiplier(memItem.allocationUnits, 2 ** 20, `${label}: memory`), label, 'memory')
  } else warnings.push('no memory item; memory size unknown')

  // Guest OS
  const os = env.virtualSystem.os
  const cim = os.cimId !== null ? cimOsType(os.cimId) : null
  const vendorId = os.vmwOsType ?? os.vboxOsType
  let family: GuestFamily = guestFamilyOf(vendorId)
  if (family === 'unknown' && cim) family = cim.family
  if (family === 'unknown') family = guestFamilyOf(os.description)
  const guestId = vendorId ?? cim?.name ?? os.description ?? null

  // Firmware
  const cfg = section.config
  let firmware: 'bios' | 'efi' = 'bios'
  const fw = cfg.get('firmware')?.toLowerCase()
  if (fw === 'efi') firmware = 'efi'
  else if (fw === undefined && env.virtualSystem.vbox?.firmware === 'efi') firmware = 'efi'
  const sbText = (cfg.get('uefi.secureBoot.enabled') ?? cfg.get('bootOptions.efiSecureBootEnabled') ?? '').toLowerCase()
  const secure_boot = firmware === 'efi' && (sbText === 'true' || sbText === '1')

  // Disks
  const { refs, warnings: dw } = ovfDiskRefs(env, section, label)
  warnings.push(...dw)
  const ctrlRank = new Map<string, number>()
  const busCount = new Map<ControllerBus, number>()
  for (const it of items) {
    if (![5, 6, 20].includes(it.resourceType)) continue
    const bus = controllerBus(it)
    const n = busCount.get(bus) ?? 0
    busCount.set(bus, n + 1)
    const a = it.address !== null && /^[0-9]{1,4}$/.test(it.address) ? Number(it.address) : n
    ctrlRank.set(it.instanceId, a)
  }
  const labels = new Set<string>()
  const disks: ManifestDisk[] = []
  const perCtrl = new Map<string, number>()
  for (const r of refs) {
    const resolved = opts.sources.get(r.file.id)
    if (!resolved) throw malformed(label, `File ${r.file.href} (ovf:id ${r.file.id}) was not resolved`)
    const parent = r.item.parent !== null ? byId.get(r.item.parent) : undefined
    let controller: ControllerBus = 'unknown'
    let ctrlIndex = 0
    if (parent && [5, 6, 20].includes(parent.resourceType)) {
      controller = controllerBus(parent)
      ctrlIndex = ctrlRank.get(parent.instanceId) ?? 0
    } else if (r.item.parent !== null) warnings.push(`${r.item.elementName ?? r.file.href}: Parent ${r.item.parent} is not a disk controller`)
    const key = parent?.instanceId ?? ''
    const seq = perCtrl.get(key) ?? 0
    perCtrl.set(key, seq + 1)
    const unit = r.item.addressOnParent !== null && /^[0-9]{1,4}$/.test(r.item.addressOnParent) ? Number(r.item.addressOnParent) : seq
    let lbl = r.item.elementName ?? r.disk?.diskId ?? r.file.href
    for (let n = 2; labels.has(lbl); n++) lbl = `${r.item.elementName ?? r.disk?.diskId ?? r.file.href} (${n})`
    labels.add(lbl)
    const capacity = r.disk ? r.disk.capacity : resolved.capacity_bytes
    if (capacity === undefined) throw malformed(label, `${lbl}: capacity unknown`)
    if (r.disk && resolved.capacity_bytes !== undefined && resolved.capacity_bytes !== r.disk.capacity) {
      // The destination volume is sized from the DiskSection: an image larger than that does not
      // fit, and one smaller would silently become a much larger volume (issue 12 item 5: a
      // 16 MiB image under a 1 TiB ovf:capacity); the descriptor and the image must agree.
      const why = resolved.capacity_bytes > r.disk.capacity ? 'the data does not fit the declared capacity' : 'the descriptor and the image disagree; fix ovf:capacity to the image\'s size'
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: ${lbl}: DiskSection ovf:capacity is ${r.disk.capacity} bytes but ${r.file.href} holds a ${resolved.capacity_bytes}-byte image: ${why}`, { details: { file: r.file.href, declared: r.disk.capacity, image: resolved.capacity_bytes } })
    }
    const d: ManifestDisk = {
      label: lbl,
      capacity_bytes: capacity,
      disk_format: resolved.disk_format,
      source: resolved.source,
      controller,
      address: `${ctrlIndex}:${unit}`,
    }
    if (r.disk?.populatedSize != null) d.allocated_bytes = r.disk.populatedSize
    disks.push(d)
  }

  // NICs
  const nics: ManifestNic[] = []
  const vboxMacs = [...(env.virtualSystem.vbox?.macs ?? [])]
  let nicN = 0
  for (const it of items) {
    if (it.resourceType !== 10) continue
    nicN++
    let mac = normalizeMac(it.address)
    if (it.address && !mac) warnings.push(`${it.elementName ?? `NIC ${nicN}`}: Address ${JSON.stringify(it.address.slice(0, 40))} is not a MAC address`)
    const vboxMac = vboxMacs.shift()
    if (!mac && vboxMac) mac = vboxMac
    nics.push({
      label: it.elementName ?? `Ethernet ${nicN}`,
      mac,
      model: (it.resourceSubType ?? 'e1000').toLowerCase(),
      network: it.connection[0] ?? null,
    })
  }

  return {
    name: env.virtualSystem.name ?? env.virtualSystem.id ?? opts.fallbackName ?? 'vm',
    source_format: opts.sourceFormat,
    guest_os: { family, id: guestId },
    firmware,
    secure_boot,
    cpu: { count, cores_per_socket: cores },
    memory_bytes: memory,
    disks,
    nics,
    cbt_available: false,
    warnings,
  }
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
    if (declared && declared !== sniffed && declared !== 'raw') p.warnings.push(`${p.name}: DiskSection format says ${declared} but the data is ${sniffed}; using ${sniffed}`)
    return sniffed
  }
  if (declared && declared !== 'raw') {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${p.name}: DiskSection format is ${declared} but the data has no ${declared} signature`, { details: { file: p.name } })
  }
  if (!declared) p.warnings.push(`${p.name}: format not declared and not recognized; reading it as raw`)
  return 'raw'
}

/**
 * Virtual size in bytes read from an image header, for disks referenced as `ovf:/file/<id>`
 * (no DiskSection capacity): VMDK sparse extent header `capacity` (sectors, u64 LE at offset 12;
 * VMDK spec 5.0 "SparseExtentHeader"), qcow2 `size` (u64 BE at offset 24; qemu
 * docs/interop/qcow2.txt). Null for other formats or a short head.
 */
export function capacityFromHeader(format: DiskFormat, head: Uint8Array): number | null {
  const b = Buffer.from(head.buffer, head.byteOffset, head.byteLength)
  let v: bigint | null = null
  if (format === 'vmdk' && b.length >= 20 && b.toString('latin1', 0, 4) === 'KDMV') v = b.readBigUInt64LE(12) * 512n
  else if (format === 'qcow2' && b.length >= 32) v = b.readBigUInt64BE(24)
  if (v === null || v > BigInt(Number.MAX_SAFE_INTEGER)) return null
  return Number(v)
}
