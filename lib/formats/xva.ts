/**
 * XenServer / XCP-ng XVA export reader.
 *
 * Follows the format xapi writes (`ocaml/xapi/export.ml`, `stream_vdi.ml`; xapi docs "VM
 * import/export"): a tar whose first member `ova.xml` is an XML-RPC value (a `struct` with
 * `version` and `objects`, the latter an `array` of `struct {class, id, snapshot}` records, one per
 * exported VM, VBD, VDI, VIF, network, SR ...), followed for each VDI by its data in a directory
 * named after the VDI's export id (`Ref:5/`): members `NNNNNNNN` (decimal chunk number, 8 digits)
 * of 1 MiB each holding bytes `[N MiB, N+1 MiB)` of the disk (the disk's last chunk is shorter
 * when its size is not a multiple of 1 MiB; chunks that are all zero are omitted, except the
 * first and the last), each followed by a checksum companion: `NNNNNNNN.checksum` (SHA-1, lower
 * or upper-case hex, older xapi) or `NNNNNNNN.xxhash` (XXH64 seed 0 as `%016LX`: what
 * `stream_vdi.ml`'s `write_block` writes today).
 * xapi's keep-alive writes a zero-length chunk that is later re-sent in full under the same name:
 * zero-length chunks are therefore skipped.
 *
 * `ova.xml` is parsed by the hostile-input-safe XML reader of `vbox.ts` (DOCTYPE refused,
 * 4 MiB cap, prototype-safe maps).
 */

import { sha1Hex, xxh64Hex } from '../crypto/hash-threads.ts'
import { normalizeMac } from '../mac.ts'
import { malformed, openRead, readAt } from './io.ts'
import type { TarMember } from './tar.ts'
import { parseXmlDocument, xmlChild, xmlChildren, type XmlNode } from './xml.ts'

/** Size of an XVA data chunk ("block"), bytes (xapi `chunk_size`). */
export const XVA_BLOCK_SIZE = 1024 * 1024
/** Largest `ova.xml` accepted, bytes (4 MiB). */
export const MAX_OVA_XML_BYTES = 4 * 1024 * 1024
/**
 * Members listed at most in one archive (inspection and reader: one bound, so the job walks the
 * archive once): a fully allocated 2 TiB VDI has 2 Mi chunks plus as many checksum companions,
 * and xapi's own limit for a VDI is 2 TiB on VHD storage.
 */
export const XVA_MAX_MEMBERS = 8_000_000
/** Largest VDI virtual size accepted, bytes (64 TiB). */
export const MAX_XVA_VDI_SIZE = 64 * 2 ** 40
/** Bounds on `ova.xml`: objects, XML-RPC nesting, array/struct sizes. */
const MAX_OBJECTS = 100_000
const MAX_RPC_DEPTH = 64
const MAX_RPC_ITEMS = 1_000_000

/** An XML-RPC value: string (also `dateTime.iso8601`, `base64` text), number, boolean, null (`nil`), array, struct. */
export type XmlRpcValue = string | number | boolean | null | XmlRpcValue[] | XmlRpcStruct
/** An XML-RPC `struct`: a null-prototype-safe map of member names to values. */
export interface XmlRpcStruct extends Map<string, XmlRpcValue> {}

/**
 * Decodes one XML-RPC `<value>` element (XML-RPC spec: `i4`/`int`/`i8`, `boolean`, `string`,
 * `double`, `dateTime.iso8601`, `base64`, `struct`, `array`, `nil`; a `<value>` with text and no
 * type element is a string).
 *
 * @throws E_MIG_MALFORMED_ARCHIVE an unknown type element, a bad number or boolean, a `struct`
 *   member without `name`/`value`, nesting deeper than 64, more than 1 000 000 items.
 */
export function decodeXmlRpcValue(v: XmlNode, label: string, depth = 0, budget = { left: MAX_RPC_ITEMS }): XmlRpcValue {
  if (depth > MAX_RPC_DEPTH) throw malformed(label, 'XML-RPC value nested too deeply')
  if (--budget.left < 0) throw malformed(label, 'XML-RPC document has too many values')
  if (v.name !== 'value') throw malformed(label, `expected an XML-RPC <value>, found <${v.name}>`)
  if (v.children.length === 0) return v.text
  if (v.children.length !== 1) throw malformed(label, '<value> holds several elements')
  const t = v.children[0]!
  switch (t.name) {
    case 'string':
    case 'dateTime.iso8601':
    case 'base64':
      return t.text
    case 'i4':
    case 'int':
    case 'i8': {
      const s = t.text.trim()
      if (!/^[-+]?[0-9]{1,16}$/.test(s) || !Number.isSafeInteger(Number(s))) throw malformed(label, `bad XML-RPC integer ${JSON.stringify(s.slice(0, 40))}`)
      return Number(s)
    }
    case 'double': {
      const x = Number(t.text.trim())
      if (!Number.isFinite(x)) throw malformed(label, `bad XML-RPC double ${JSON.stringify(t.text.slice(0, 40))}`)
      return x
    }
    case 'boolean': {
      const s = t.text.trim()
      if (s === '1' || s === 'true') return true
      if (s === '0' || s === 'false') return false
      throw malformed(label, `bad XML-RPC boolean ${JSON.stringify(s.slice(0, 40))}`)
    }
    case 'nil':
      return null
    case 'array': {
      const data = xmlChild(t, 'data')
      if (!data) throw malformed(label, '<array> without <data>')
      return xmlChildren(data, 'value').map((c) => decodeXmlRpcValue(c, label, depth + 1, budget))
    }
    case 'struct': {
      const out: XmlRpcStruct = new Map()
      for (const m of xmlChildren(t, 'member')) {
        const name = xmlChild(m, 'name')
        const val = xmlChild(m, 'value')
        if (!name || !val) throw malformed(label, 'struct <member> without <name> or <value>')
        out.set(name.text, decodeXmlRpcValue(val, label, depth + 1, budget))
      }
      return out
    }
    default:
      throw malformed(label, `unknown XML-RPC type <${t.name}>`)
  }
}

function isStruct(v: XmlRpcValue | undefined): v is XmlRpcStruct {
  return v instanceof Map
}

/**
 * One exported object: `cls` (`VM`, `VBD`, `VDI`, `VIF`, `network`, `SR`, `VM_guest_metrics`,
 * ...), `id` (the export reference, `Ref:5`, used for cross references and as the VDI's data
 * directory), `fields` (the object's `snapshot` record).
 */
export interface XvaObject {
  cls: string
  id: string
  fields: XmlRpcStruct
}

/** A VBD of the VM: `userdevice` (position, `"0"`..), `type` (`Disk`/`CD`/`Floppy`), `vdi` (export ref or null when empty), `bootable`. */
export interface XvaVbd {
  id: string
  userdevice: string
  type: string
  vdi: string | null
  bootable: boolean
}

/** A VDI: `id` (export ref = data directory), `name_label`, `virtual_size` (bytes). */
export interface XvaVdi {
  id: string
  name_label: string
  virtual_size: number
}

/** A VIF: `device` (position), `mac` (lower-case colon form or null), `network` (the network's `name_label`, else its bridge, else null). */
export interface XvaVif {
  id: string
  device: string
  mac: string | null
  network: string | null
}

/**
 * The VM of an `ova.xml`, with what the migrator needs.
 * - `memory_static_max`: bytes. `vcpus_max`: `VCPUs_max`. `cores_per_socket`: `platform
 *   ["cores-per-socket"]` when it divides `vcpus_max`, else 1.
 * - `firmware`: `efi` when `HVM_boot_params.firmware` is `uefi`, else `bios`. `secure_boot`:
 *   `platform.secureboot` is `true` (UEFI only). `hvm`: `HVM_boot_policy` is set (else a PV guest).
 * - `os_hint`: the best guest OS string: `VM_guest_metrics.os_version.name`/`distro`, then
 *   `other_config["base_template_name"]`, `other_config["install-distro"]`, `reference_label`;
 *   `os_hint_source` says which. `platform`/`other_config`: the raw string maps.
 * - `vbds` by `userdevice` (numeric order), `vdis` by id, `vifs` by `device`.
 */
export interface XvaVm {
  id: string
  name_label: string
  memory_static_max: number
  vcpus_max: number
  cores_per_socket: number
  firmware: 'bios' | 'efi'
  secure_boot: boolean
  hvm: boolean
  os_hint: string | null
  os_hint_source: string | null
  platform: Map<string, string>
  other_config: Map<string, string>
  vbds: XvaVbd[]
  vdis: Map<string, XvaVdi>
  vifs: XvaVif[]
}

/** A parsed `ova.xml`: the export `version` record (string fields), all objects, the chosen VM, warnings. */
export interface XvaDescriptor {
  version: Map<string, string>
  objects: XvaObject[]
  vm: XvaVm
  warnings: string[]
}

function sget(s: XmlRpcStruct, k: string): string | null {
  const v = s.get(k)
  return typeof v === 'string' ? v : typeof v === 'number' || typeof v === 'boolean' ? String(v) : null
}
function stringMap(v: XmlRpcValue | undefined): Map<string, string> {
  const out = new Map<string, string>()
  if (isStruct(v)) for (const [k, x] of v) if (typeof x === 'string' || typeof x === 'number' || typeof x === 'boolean') out.set(k, String(x))
  return out
}
function boolField(s: XmlRpcStruct, k: string): boolean {
  const v = s.get(k)
  return v === true || v === 'true'
}
function intField(s: XmlRpcStruct, k: string, label: string, what: string, max: number): number {
  const v = s.get(k)
  const str = typeof v === 'number' ? String(v) : typeof v === 'string' ? v.trim() : ''
  if (!/^[0-9]{1,16}$/.test(str))
    throw malformed(label, `${what}: ${k} = ${JSON.stringify(typeof v === 'string' ? v.slice(0, 40) : (v ?? null))} is not a non-negative integer`)
  const n = Number(str)
  if (!Number.isSafeInteger(n) || n > max) throw malformed(label, `${what}: ${k} = ${str} is out of range`)
  return n
}
function refField(s: XmlRpcStruct, k: string): string | null {
  const v = s.get(k)
  if (typeof v !== 'string' || v === '' || v === 'OpaqueRef:NULL') return null
  return v
}
function refList(s: XmlRpcStruct, k: string): string[] {
  const v = s.get(k)
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : []
}
/** Numeric-aware order of `userdevice`/`device` strings. */
function byPosition(a: string, b: string): number {
  const na = /^[0-9]+$/.test(a) ? Number(a) : Infinity
  const nb = /^[0-9]+$/.test(b) ? Number(b) : Infinity
  return na - nb || (a < b ? -1 : a > b ? 1 : 0)
}

/**
 * Parses `ova.xml` (bytes or text) and picks the exported VM.
 *
 * The VM is the one object of class `VM` that is not the control domain and not a snapshot
 * (when the export holds snapshots too); several candidates are an error.
 *
 * @param label the archive and member for messages (`vm.xva!ova.xml`).
 * @throws E_MIG_MALFORMED_ARCHIVE over 4 MiB, DOCTYPE/ENTITY, not well-formed; not XML-RPC (root
 *   not `<value>`, no `objects` array, objects without `class`/`id`/`snapshot`); no VM or several;
 *   a VBD/VIF reference to a missing object; non-integer or out-of-range `memory_static_max`,
 *   `VCPUs_max`, `virtual_size`.
 */
export function parseOvaXml(input: string | Uint8Array, label: string): XvaDescriptor {
  if (typeof input !== 'string' && input.length > MAX_OVA_XML_BYTES) throw malformed(label, `ova.xml larger than ${MAX_OVA_XML_BYTES} bytes`)
  const text = typeof input === 'string' ? input : Buffer.from(input.buffer, input.byteOffset, input.length).toString('utf8')
  const root = parseXmlDocument(text.replace(/^\uFEFF/, ''), label, MAX_OVA_XML_BYTES)
  if (root.name !== 'value') throw malformed(label, `not an XVA ova.xml: root element is <${root.name}>, not an XML-RPC <value>`)
  const top = decodeXmlRpcValue(root, label)
  if (!isStruct(top)) throw malformed(label, 'not an XVA ova.xml: the XML-RPC value is not a struct')
  const objs = top.get('objects')
  if (!Array.isArray(objs)) throw malformed(label, 'not an XVA ova.xml: no "objects" array')
  if (objs.length > MAX_OBJECTS) throw malformed(label, `more than ${MAX_OBJECTS} objects`)
  const warnings: string[] = []
  const objects: XvaObject[] = []
  const byId = new Map<string, XvaObject>()
  for (const [i, o] of objs.entries()) {
    if (!isStruct(o)) throw malformed(label, `object ${i} is not a struct`)
    const cls = o.get('class')
    const id = o.get('id')
    const snap = o.get('snapshot')
    if (typeof cls !== 'string' || typeof id !== 'string' || !isStruct(snap)) throw malformed(label, `object ${i} lacks class, id or snapshot`)
    if (byId.has(id)) throw malformed(label, `object id ${id} appears twice`)
    const obj = { cls, id, fields: snap }
    objects.push(obj)
    byId.set(id, obj)
  }
  const vms = objects.filter((o) => o.cls === 'VM' && !boolField(o.fields, 'is_control_domain'))
  const live = vms.filter((o) => !boolField(o.fields, 'is_a_snapshot'))
  const cands = live.length > 0 ? live : vms
  if (cands.length === 0) throw malformed(label, 'the export holds no VM object')
  if (cands.length > 1) throw malformed(label, `the export holds ${cands.length} VMs (${cands.map((c) => c.id).join(', ')}); expected one`)
  const vmObj = cands[0]!
  const f = vmObj.fields
  const name_label = sget(f, 'name_label') ?? ''
  const what = `VM ${vmObj.id}`
  const memory_static_max = intField(f, 'memory_static_max', label, what, 2 ** 52)
  const vcpus_max = intField(f, 'VCPUs_max', label, what, 4096)
  if (vcpus_max < 1) throw malformed(label, `${what}: VCPUs_max is 0`)
  const platform = stringMap(f.get('platform'))
  const other_config = stringMap(f.get('other_config'))
  const hvmParams = stringMap(f.get('HVM_boot_params'))
  const firmware = (hvmParams.get('firmware') ?? '').toLowerCase() === 'uefi' ? 'efi' : 'bios'
  const sbRaw = (platform.get('secureboot') ?? '').toLowerCase()
  const secure_boot = firmware === 'efi' && sbRaw === 'true'
  if (firmware === 'efi' && sbRaw === 'auto') warnings.push('platform:secureboot = auto: secure boot state depends on the pool certificates; assumed off')
  const hvm = (sget(f, 'HVM_boot_policy') ?? '') !== ''
  if (!hvm) warnings.push('the VM is a PV guest (HVM_boot_policy empty): it needs an HVM-capable kernel and bootloader to boot under KVM')
  let cps = Number(platform.get('cores-per-socket') ?? '1')
  if (!Number.isSafeInteger(cps) || cps < 1 || vcpus_max % cps !== 0) cps = 1

  // Guest OS hint.
  let os_hint: string | null = null
  let os_hint_source: string | null = null
  const gm = refField(f, 'guest_metrics')
  const gmObj = gm ? byId.get(gm) : undefined
  if (gmObj && gmObj.cls === 'VM_guest_metrics') {
    const osv = stringMap(gmObj.fields.get('os_version'))
    const v = osv.get('name') ?? osv.get('distro')
    if (v) [os_hint, os_hint_source] = [v, 'VM_guest_metrics.os_version']
  }
  for (const [k, src] of [
    [other_config.get('base_template_name'), 'other_config:base_template_name'],
    [other_config.get('install-distro'), 'other_config:install-distro'],
    [sget(f, 'reference_label'), 'reference_label'],
  ] as const) {
    if (os_hint === null && k) [os_hint, os_hint_source] = [k, src]
  }

  // Disks.
  const vbds: XvaVbd[] = []
  const vdis = new Map<string, XvaVdi>()
  for (const ref of refList(f, 'VBDs')) {
    const o = byId.get(ref)
    if (!o) {
      warnings.push(`VBD ${ref} is not in the export: skipped`)
      continue
    }
    if (o.cls !== 'VBD') throw malformed(label, `${what}: VBDs lists ${ref}, which is a ${o.cls}`)
    const vdiRef = refField(o.fields, 'VDI')
    const type = sget(o.fields, 'type') ?? 'Disk'
    const vbd: XvaVbd = { id: ref, userdevice: sget(o.fields, 'userdevice') ?? '', type, vdi: vdiRef, bootable: boolField(o.fields, 'bootable') }
    vbds.push(vbd)
    if (type !== 'Disk' || vdiRef === null) continue
    const vo = byId.get(vdiRef)
    if (vo?.cls !== 'VDI') throw malformed(label, `VBD ${ref} (userdevice ${vbd.userdevice}): VDI ${vdiRef} is not in the export`)
    const size = intField(vo.fields, 'virtual_size', label, `VDI ${vdiRef}`, MAX_XVA_VDI_SIZE)
    vdis.set(vdiRef, { id: vdiRef, name_label: sget(vo.fields, 'name_label') ?? '', virtual_size: size })
  }
  vbds.sort((a, b) => byPosition(a.userdevice, b.userdevice))

  // NICs.
  const vifs: XvaVif[] = []
  for (const ref of refList(f, 'VIFs')) {
    const o = byId.get(ref)
    if (o?.cls !== 'VIF') {
      warnings.push(`VIF ${ref} is not in the export: skipped`)
      continue
    }
    const rawMac = sget(o.fields, 'MAC')
    const mac = normalizeMac(rawMac)
    if (rawMac && !mac) warnings.push(`VIF ${ref}: MAC ${JSON.stringify(rawMac.slice(0, 40))} is not a MAC address: a new one is generated`)
    const netRef = refField(o.fields, 'network')
    const net = netRef ? byId.get(netRef) : undefined
    const network = net && net.cls === 'network' ? sget(net.fields, 'name_label') || sget(net.fields, 'bridge') || null : null
    vifs.push({ id: ref, device: sget(o.fields, 'device') ?? '', mac, network })
  }
  vifs.sort((a, b) => byPosition(a.device, b.device))

  return {
    version: stringMap(top.get('version')),
    objects,
    vm: {
      id: vmObj.id,
      name_label,
      memory_static_max,
      vcpus_max,
      cores_per_socket: cps,
      firmware,
      secure_boot,
      hvm,
      os_hint,
      os_hint_source,
      platform,
      other_config,
      vbds,
      vdis,
      vifs,
    },
    warnings,
  }
}

// ---------------------------------------------------------------------------------------------
// Blocks

/**
 * One data chunk of a VDI: `index` (chunk number N: bytes `[N MiB, N MiB + size)` of the disk),
 * `member` (the tar member), and its checksum companion if any (`sha1` = `.checksum`, `xxh64` =
 * `.xxhash`).
 */
export interface XvaBlock {
  index: number
  member: TarMember
  checksum: { algorithm: 'sha1' | 'xxh64'; member: TarMember } | null
}

/** The chunks of one VDI directory (`Ref:5`), in chunk order, and their total bytes. */
export interface XvaBlockDir {
  dir: string
  blocks: XvaBlock[]
  bytes: number
}

const BLOCK_RE = /^(Ref:[0-9]+)\/([0-9]{8})(\.checksum|\.xxhash)?$/

/**
 * Groups the archive members into VDI block directories and checks the block structure.
 *
 * @param members all members of the archive (from `listTarMembers`).
 * @param vdiSizes virtual size in bytes of each VDI directory expected (`Ref:5` -> bytes).
 * @param label archive name for messages.
 * @returns the directories of `vdiSizes` (a directory without blocks has an empty list) and the
 *   names of members that are neither `ova.xml` nor blocks of a known VDI (`ignored`).
 * @throws E_MIG_MALFORMED_ARCHIVE a block that is not a regular file; a block larger than 1 MiB;
 *   a block shorter than 1 MiB that is not the disk's last (partial) chunk of exactly the
 *   remaining size; a block number at or beyond the VDI's virtual size; a block or companion
 *   present twice with data; a companion over 128 bytes or without its block. Messages name the
 *   member. A companion is its block's when it follows it (the first one after it wins) or, when
 *   no keep-alive chunk of that name exists, when it precedes it.
 */
export function indexXvaBlocks(
  members: readonly TarMember[],
  vdiSizes: Map<string, number>,
  label: string,
): { dirs: Map<string, XvaBlockDir>; ignored: string[] } {
  const dirs = new Map<string, XvaBlockDir>()
  for (const d of vdiSizes.keys()) dirs.set(d, { dir: d, blocks: [], bytes: 0 })
  const blocks = new Map<string, Map<number, XvaBlock>>()
  const companions: Array<{ dir: string; index: number; ext: string; m: TarMember }> = []
  const ignored: string[] = []
  for (const m of members) {
    const name = m.name.replace(/^\.\//, '')
    if (name === 'ova.xml') continue
    const r = BLOCK_RE.exec(name)
    if (!r || !vdiSizes.has(r[1]!)) {
      if (!(m.type === 'directory' && vdiSizes.has(name.replace(/\/$/, '')))) ignored.push(m.name)
      continue
    }
    const dir = r[1]!
    const index = Number(r[2])
    if (m.type !== 'file') throw malformed(label, `member ${m.name} is a ${m.type}, not a regular file`, { member: m.name })
    if (r[3]) {
      companions.push({ dir, index, ext: r[3], m })
      continue
    }
    if (m.size === 0) continue // xapi keep-alive: the chunk is sent again in full.
    const vsize = vdiSizes.get(dir)!
    const start = index * XVA_BLOCK_SIZE
    if (start >= vsize) throw malformed(label, `block ${m.name} lies at byte ${start}, beyond the VDI's virtual size ${vsize}`, { member: m.name })
    if (m.size > XVA_BLOCK_SIZE) throw malformed(label, `block ${m.name} is ${m.size} bytes, larger than 1 MiB`, { member: m.name })
    const expected = Math.min(XVA_BLOCK_SIZE, vsize - start)
    if (m.size !== expected) throw malformed(label, `block ${m.name} is ${m.size} bytes; expected ${expected}`, { member: m.name })
    let map = blocks.get(dir)
    if (!map) blocks.set(dir, (map = new Map()))
    if (map.has(index)) throw malformed(label, `block ${m.name} appears twice`, { member: m.name })
    map.set(index, { index, member: m, checksum: null })
  }
  const keepAlives = new Set(members.filter((m) => m.size === 0).map((m) => m.name.replace(/^\.\//, '')))
  for (const c of companions) {
    if (c.m.size > 128) throw malformed(label, `checksum member ${c.m.name} is ${c.m.size} bytes`, { member: c.m.name })
    const b = blocks.get(c.dir)?.get(c.index)
    const keptAlive = keepAlives.has(`${c.dir}/${String(c.index).padStart(8, '0')}`)
    // xapi writes a block's companion after it; one before it belongs to a keep-alive
    // (zero-length) chunk of the same name, if there is one. Without a keep-alive, a companion
    // before its block is the block's (an archive repacked in directory order).
    if (b && (c.m.offset > b.member.offset || !keptAlive)) {
      const after = (m: TarMember) => m.offset > b.member.offset
      const held = b.checksum?.member
      if (!held || (after(c.m) && (!after(held) || c.m.offset < held.offset))) b.checksum = { algorithm: c.ext === '.checksum' ? 'sha1' : 'xxh64', member: c.m }
      continue
    }
    if (keptAlive) continue
    throw malformed(label, `checksum member ${c.m.name} has no block`, { member: c.m.name })
  }
  for (const [dir, map] of blocks) {
    const d = dirs.get(dir)!
    d.blocks = [...map.values()].sort((a, b) => a.index - b.index)
    d.bytes = d.blocks.reduce((s, b) => s + b.member.size, 0)
  }
  return { dirs, ignored }
}

/** Digest of each companion kind: name for messages, companion extension, hex digits. */
const DIGESTS = {
  sha1: { name: 'SHA-1', ext: '.checksum', hexDigits: 40 },
  xxh64: { name: 'XXH64', ext: '.xxhash', hexDigits: 16 },
} as const

/**
 * Checks one block's bytes (`data`, the whole block) against the text of its checksum companion
 * (xapi `stream_vdi`): a `.checksum` holds a SHA-1 hex digest (older xapi), an `.xxhash` the XXH64
 * (seed 0) as 16 hex digits (xapi writes `%016LX`; either case and surrounding white space are
 * accepted). The caller keeps `data` unchanged until the promise settles: a SHA-1 of a
 * `SharedArrayBuffer` view runs in place on a hashing thread ({@link sha1Hex}), an XXH64 on the
 * calling thread ({@link xxh64Hex}). A block without a companion resolves at once. `label`
 * names the archive in messages. Rejects with `E_MIG_MALFORMED_ARCHIVE` when the companion holds
 * no digest of its kind, or when the digests differ (details: `member`, `expected`, `actual`).
 */
export async function checkXvaBlock(label: string, block: XvaBlock, data: Uint8Array, companion: string): Promise<void> {
  if (!block.checksum) return
  const d = DIGESTS[block.checksum.algorithm]
  const name = block.checksum.member.name
  const want = companion.trim().toLowerCase()
  if (want.length !== d.hexDigits || !/^[0-9a-f]+$/.test(want))
    throw malformed(label, `checksum member ${name} does not hold a ${d.name} hex digest (${d.hexDigits} hex digits)`, { member: name })
  const got = await (block.checksum.algorithm === 'sha1' ? sha1Hex(data) : xxh64Hex(data))
  if (got !== want)
    throw malformed(label, `block ${block.member.name}: ${d.name} ${got} does not match its ${d.ext} ${want}`, {
      member: block.member.name,
      expected: want,
      actual: got,
    })
}

/** Blocks {@link verifyXvaBlocks} reads and checks at once (reads and SHA-1s: thread pool work). */
const BLOCKS_IN_FLIGHT = 4

/** Options of {@link verifyXvaBlocks}: `vdiSizes` as for {@link indexXvaBlocks}; `maxBytes` the budget of block bytes hashed (default unbounded); `dirs` restricts to these directories. */
export interface VerifyXvaOptions {
  vdiSizes: Map<string, number>
  maxBytes?: number
  dirs?: string[]
}

/**
 * Result of {@link verifyXvaBlocks}: `verified` blocks whose SHA-1 or XXH64 matched (and their
 * bytes, `verifiedBytes`); `deferred` blocks with a companion left for the copy (over the byte
 * budget); `unchecked` blocks without any companion; `warnings` summarising the last two.
 */
export interface VerifyXvaResult {
  dirs: Map<string, XvaBlockDir>
  verified: number
  verifiedBytes: number
  deferred: string[]
  unchecked: string[]
  warnings: string[]
}

/**
 * Checks the blocks of an XVA: the structure per {@link indexXvaBlocks}, then each block that has
 * a checksum companion against it ({@link checkXvaBlock}: SHA-1 `.checksum` or XXH64 `.xxhash`),
 * in archive order, until `maxBytes` of block data have been hashed. Reads are positioned (four
 * blocks at once, each into a 1 MiB buffer of its own, reused), never a whole-archive read.
 *
 * @param path the archive. @param members its members (from `listTarMembers`).
 * @throws E_MIG_MALFORMED_ARCHIVE as {@link indexXvaBlocks}; a companion that holds no digest of
 *   its kind; a block whose digest differs from its companion's (message names the block); a
 *   member cut short by the end of the archive.
 * @throws E_MIG_DISK_READ_FAILED the archive cannot be read.
 */
export async function verifyXvaBlocks(path: string, members: readonly TarMember[], opts: VerifyXvaOptions): Promise<VerifyXvaResult> {
  const { dirs } = indexXvaBlocks(members, opts.vdiSizes, path)
  const budget = opts.maxBytes ?? Number.MAX_SAFE_INTEGER
  const res: VerifyXvaResult = { dirs, verified: 0, verifiedBytes: 0, deferred: [], unchecked: [], warnings: [] }
  const selected = [...dirs.values()].filter((d) => !opts.dirs || opts.dirs.includes(d.dir))
  const all = selected.flatMap((d) => d.blocks).sort((a, b) => a.member.offset - b.member.offset)
  const toCheck: XvaBlock[] = []
  for (const b of all) {
    if (!b.checksum) res.unchecked.push(b.member.name)
    else if (res.verifiedBytes + b.member.size > budget) res.deferred.push(b.member.name)
    else {
      toCheck.push(b)
      res.verified++
      res.verifiedBytes += b.member.size
    }
  }
  const fh = await openRead(path)
  // BLOCKS_IN_FLIGHT lanes, each with a buffer of its own, take the blocks in archive order: the
  // reads run side by side on the thread pool, as do the SHA-1 digests. Every lane finishes
  // before the archive is closed; the failure first in archive order is the one reported.
  let next = 0
  const failures: Array<{ offset: number; error: unknown }> = []
  const lane = async (): Promise<void> => {
    const buf = Buffer.allocUnsafe(XVA_BLOCK_SIZE)
    const readExact = async (m: TarMember): Promise<Buffer> => {
      const got = await readAt(fh, `${path} member ${m.name}`, m.size, m.offset, buf)
      if (got.length < m.size) throw malformed(path, `member ${m.name} is cut short by the end of the archive`, { member: m.name })
      return got
    }
    while (next < toCheck.length && failures.length === 0) {
      const b = toCheck[next++]!
      try {
        const want = (await readExact(b.checksum!.member)).toString('latin1')
        await checkXvaBlock(path, b, await readExact(b.member), want)
      } catch (error) {
        failures.push({ offset: b.member.offset, error })
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: Math.min(BLOCKS_IN_FLIGHT, toCheck.length) }, lane))
  } finally {
    await fh.close()
  }
  if (failures.length > 0) throw failures.sort((a, b) => a.offset - b.offset)[0]!.error
  // The XVA reader (lib/pipeline/readers/xva-blocks.ts) checks every block it copies.
  if (res.deferred.length > 0)
    res.warnings.push(`${res.deferred.length} blocks with a checksum are verified while the data is copied (inspect verified ${res.verified})`)
  if (res.unchecked.length > 0) res.warnings.push(`${res.unchecked.length} blocks have no checksum companion`)
  return res
}
