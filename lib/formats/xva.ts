/**
 * XenServer / XCP-ng XVA export: the `ova.xml` model (the VM, its VBDs, VDIs and VIFs).
 *
 * Follows the format xapi writes (`ocaml/xapi/export.ml`; xapi docs "VM import/export"): a tar
 * whose first member `ova.xml` is an XML-RPC value (a `struct` with `version` and `objects`, the
 * latter an `array` of `struct {class, id, snapshot}` records, one per exported VM, VBD, VDI, VIF,
 * network, SR ...), followed for each VDI by its data in a directory named after the VDI's export
 * id (`Ref:5/`), whose chunk members `xva-chunks.ts` indexes and verifies.
 *
 * `ova.xml` is parsed by the hostile-input-safe XML reader of `xml.ts` (DOCTYPE refused, 4 MiB
 * cap, prototype-safe maps) and decoded by `xmlrpc.ts`.
 */

import { normalizeMac } from '../mac.ts'
import { malformed } from './io.ts'
import { parseXmlDocument } from './xml.ts'
import { decodeXmlRpcValue, type XmlRpcStruct, type XmlRpcValue } from './xmlrpc.ts'

/** Largest `ova.xml` accepted, bytes (4 MiB). */
export const MAX_OVA_XML_BYTES = 4 * 1024 * 1024
/** Largest VDI virtual size accepted, bytes (64 TiB). */
export const MAX_XVA_VDI_SIZE = 64 * 2 ** 40
/** Most objects accepted in one `ova.xml` (the XML-RPC nesting and value bounds are `xmlrpc.ts`'s). */
const MAX_OBJECTS = 100_000

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
