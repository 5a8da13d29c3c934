/**
 * VirtualBox machine settings file (`.vbox`) reader.
 *
 * Follows VirtualBox's settings schema (`src/VBox/Main/xml/VirtualBox-settings.xsd`, settings
 * versions 1.x, written by `settings::MachineConfigFile`): the root `<VirtualBox version="1.19-linux">`
 * holds one `<Machine uuid name OSType>` with
 * - `MediaRegistry/HardDisks/HardDisk` (`uuid`, `location`, `format` VDI/VMDK/VHD/..., `type`), a
 *   differencing image being a `HardDisk` nested inside its parent's element;
 * - the current state's `Hardware` (`CPU@count`, `Memory@RAMSize` in MiB, `Firmware@type`,
 *   `Network/Adapter`, `StorageControllers/StorageController/AttachedDevice/Image@uuid`);
 *   settings older than 1.9 keep `StorageControllers` directly under `Machine`, which is read too;
 * - `Snapshot` subtrees with their own `Hardware`: ignored, the current state is what is migrated.
 *
 * The XML is parsed by the hostile-input-safe reader of `xml.ts` (no DOCTYPE, no entities beyond
 * XML's five, `__proto__`-like names dropped), the text capped at 4 MiB.
 */
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { normalizeMac } from '../mac.ts'
import { malformed, statPath } from './io.ts'
import { checkDestinationLimits } from '../limits.ts'
import { resolveInRoot } from '../hostpath.ts'
import { guestFamilyOf, sanitizeLabel, type ControllerBus, type DiskFormat, type ManifestDisk, type ManifestNic, type VmManifest } from '../manifest.ts'
import { qemuImgInfo } from './qemu-info.ts'
import { parseXmlDocument, xmlChild, xmlChildren, type XmlNode } from './xml.ts'

/** Largest `.vbox` accepted, bytes (4 MiB). */
export const MAX_VBOX_BYTES = 4 * 1024 * 1024
/** Bounds on one settings file: registered media, controllers, attachments, adapters, chain depth. */
export const VBOX_LIMITS = { media: 4096, controllers: 64, attachments: 1024, adapters: 64, chainDepth: 64 } as const
/** Largest `RAMSize` accepted, MiB (16 TiB), and `CPU@count` (VirtualBox allows 1..1024). */
const MAX_RAM_MIB = 16 * 1024 * 1024
const MAX_CPUS = 1024
const MiB = 1024 * 1024

// ---------------------------------------------------------------------------------------------
// The settings model

/**
 * One registered hard disk image (`MediaRegistry/HardDisks/HardDisk`).
 * - `uuid`: lower-case, without braces. `location`: as written (relative to the `.vbox` folder or
 *   absolute). `format`: VirtualBox's backend name upper-cased (`VDI`, `VMDK`, `VHD`, ...).
 * - `type`: `Normal`, `Immutable`, `Writethrough`, `Shareable`, `MultiAttach`, `Readonly`, or null
 *   (differencing images carry none). `parent`: uuid of the enclosing `HardDisk`, null for a base.
 */
export interface VboxMedium {
  uuid: string
  location: string
  format: string
  type: string | null
  parent: string | null
}

/**
 * One `AttachedDevice type="HardDisk"` of a controller: `port` (IDE channel / SATA port / SCSI
 * target), `device` (IDE master 0 / slave 1, else 0), `imageUuid` (lower-case, no braces).
 */
export interface VboxAttachment {
  port: number
  device: number
  imageUuid: string
}

/**
 * A `StorageController`: `name`, `type` (PIIX3/PIIX4/ICH6, AHCI, LsiLogic, BusLogic, LsiLogicSas,
 * NVMe, VirtioSCSI, USB, I82078), the KVM-side `bus` it maps to, and its hard-disk attachments in
 * port/device order (DVD and floppy attachments are ignored).
 */
export interface VboxController {
  name: string
  type: string
  bus: ControllerBus
  attachments: VboxAttachment[]
}

/**
 * A `Network/Adapter` of the current state.
 * - `slot`: adapter index (0-based). `enabled`: the `enabled` attribute (absent means false).
 * - `mac`: lower-case `aa:bb:cc:dd:ee:ff` from the 12-hex-digit `MACAddress`, null when absent/invalid.
 * - `type`: chip (`82540EM`, `82543GC`, `82545EM`, `Am79C970A`, `Am79C973`, `Am79C960`, `virtio`),
 *   default `Am79C973` as in VirtualBox. `model`: the libvirt model name (`e1000`, `pcnet`, `virtio`).
 * - `attachment`: `NAT`, `BridgedInterface`, `InternalNetwork`, `HostOnlyInterface`,
 *   `GenericInterface`, `NATNetwork`, `CloudNetwork`, or null (not attached); `network`: its
 *   `name` attribute (bridge, internal network, host-only interface), `NAT` for NAT, else null.
 */
export interface VboxAdapter {
  slot: number
  enabled: boolean
  mac: string | null
  type: string
  model: string
  attachment: string | null
  network: string | null
}

/**
 * A parsed `.vbox`. `settingsVersion` is the root `version` (`1.19-linux`); `memoryMiB` is
 * `Memory@RAMSize`; `cpuCount` is `CPU@count` (default 1); `firmware` is `Firmware@type` as written
 * (`BIOS`, `EFI`, `EFI32`, `EFI64`, `EFIDUAL`; default `BIOS`); `media` maps uuid to
 * {@link VboxMedium}; `controllers` and `adapters` are the current state's (not snapshots').
 */
export interface VboxMachine {
  label: string
  settingsVersion: string | null
  uuid: string | null
  name: string
  osType: string | null
  cpuCount: number
  memoryMiB: number | null
  firmware: string
  media: Map<string, VboxMedium>
  controllers: VboxController[]
  adapters: VboxAdapter[]
  warnings: string[]
}

/** `StorageController@type` to the destination bus. */
const CONTROLLER_BUS: Record<string, ControllerBus> = Object.assign(Object.create(null), {
  PIIX3: 'ide',
  PIIX4: 'ide',
  ICH6: 'ide',
  AHCI: 'sata',
  LsiLogic: 'scsi',
  BusLogic: 'scsi',
  LsiLogicSas: 'scsi',
  VirtioSCSI: 'scsi',
  NVMe: 'nvme',
  USB: 'unknown',
  I82078: 'unknown',
})

/** `Adapter@type` to the libvirt NIC model. */
const NIC_MODEL: Record<string, string> = Object.assign(Object.create(null), {
  '82540EM': 'e1000',
  '82543GC': 'e1000',
  '82545EM': 'e1000',
  Am79C970A: 'pcnet',
  Am79C973: 'pcnet',
  Am79C960: 'pcnet',
  virtio: 'virtio',
})

const ATTACHMENT_KINDS = [
  'NAT',
  'BridgedInterface',
  'InternalNetwork',
  'HostOnlyInterface',
  'GenericInterface',
  'NATNetwork',
  'CloudNetwork',
  'HostOnlyNetwork',
]

/** `{8-4-4-4-12}` (braces optional) to lower-case without braces; null when not a UUID. */
export function normalizeVboxUuid(s: string | undefined | null): string | null {
  if (!s) return null
  const m = /^\{?([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\}?$/.exec(s.trim())
  return m ? m[1]!.toLowerCase() : null
}

function intAttr(n: XmlNode | null, attr: string, min: number, max: number, label: string, what: string): number | null {
  const v = n?.attrs.get(attr)
  if (v === undefined) return null
  if (!/^\s*[0-9]{1,10}\s*$/.test(v)) throw malformed(label, `${what} = ${JSON.stringify(v.slice(0, 40))} is not a number`)
  const x = Number(v)
  if (x < min || x > max) throw malformed(label, `${what} = ${x} is out of range ${min}..${max}`)
  return x
}

function boolAttr(v: string | undefined): boolean {
  return v !== undefined && /^(true|yes|on|1)$/i.test(v.trim())
}

/** Walks `HardDisks` recursively, registering each `HardDisk` with its parent uuid. */
function readMedia(hardDisks: XmlNode | null, label: string, warnings: string[]): Map<string, VboxMedium> {
  const media = new Map<string, VboxMedium>()
  const walk = (n: XmlNode, parent: string | null, depth: number): void => {
    for (const hd of xmlChildren(n, 'HardDisk')) {
      if (depth > VBOX_LIMITS.chainDepth) throw malformed(label, `HardDisk nesting deeper than ${VBOX_LIMITS.chainDepth}`)
      const uuid = normalizeVboxUuid(hd.attrs.get('uuid'))
      if (!uuid) throw malformed(label, `HardDisk uuid ${JSON.stringify(hd.attrs.get('uuid') ?? null)} is not a UUID`)
      const location = hd.attrs.get('location')
      if (!location) throw malformed(label, `HardDisk {${uuid}} has no location`)
      if (media.has(uuid)) throw malformed(label, `HardDisk {${uuid}} is registered twice`)
      if (media.size >= VBOX_LIMITS.media) throw malformed(label, `more than ${VBOX_LIMITS.media} registered media`)
      const format = (hd.attrs.get('format') ?? '').trim()
      if (!format) warnings.push(`HardDisk {${uuid}} has no format attribute: taken from the file name`)
      media.set(uuid, { uuid, location, format: (format || formatFromName(location)).toUpperCase(), type: hd.attrs.get('type') ?? null, parent })
      walk(hd, uuid, depth + 1)
    }
  }
  if (hardDisks) walk(hardDisks, null, 0)
  return media
}

function formatFromName(location: string): string {
  const m = /\.([A-Za-z0-9]{1,8})$/.exec(location)
  return m ? m[1]!.toUpperCase() : ''
}

function readControllers(scs: XmlNode | null, label: string, warnings: string[]): VboxController[] {
  const out: VboxController[] = []
  if (!scs) return out
  const list = xmlChildren(scs, 'StorageController')
  if (list.length > VBOX_LIMITS.controllers) throw malformed(label, `more than ${VBOX_LIMITS.controllers} storage controllers`)
  let attachments = 0
  for (const sc of list) {
    const name = sc.attrs.get('name') ?? `controller${out.length}`
    const type = sc.attrs.get('type') ?? ''
    let bus = CONTROLLER_BUS[type]
    if (bus === undefined) {
      warnings.push(`StorageController ${JSON.stringify(name)}: unknown type ${JSON.stringify(type)}`)
      bus = 'unknown'
    }
    const atts: VboxAttachment[] = []
    for (const ad of xmlChildren(sc, 'AttachedDevice')) {
      if (++attachments > VBOX_LIMITS.attachments) throw malformed(label, `more than ${VBOX_LIMITS.attachments} attached devices`)
      if (ad.attrs.get('type') !== 'HardDisk') continue
      const where = `StorageController ${JSON.stringify(name)} AttachedDevice`
      const port = intAttr(ad, 'port', 0, 65535, label, `${where} port`) ?? 0
      const device = intAttr(ad, 'device', 0, 65535, label, `${where} device`) ?? 0
      const raw = xmlChild(ad, 'Image')?.attrs.get('uuid')
      const imageUuid = normalizeVboxUuid(raw)
      if (!imageUuid) throw malformed(label, `${where} port ${port} device ${device}: Image uuid ${JSON.stringify(raw ?? null)} is not a UUID`)
      atts.push({ port, device, imageUuid })
    }
    atts.sort((a, b) => a.port - b.port || a.device - b.device)
    out.push({ name, type, bus, attachments: atts })
  }
  return out
}

function readAdapters(network: XmlNode | null, label: string, warnings: string[]): VboxAdapter[] {
  const out: VboxAdapter[] = []
  if (!network) return out
  const list = xmlChildren(network, 'Adapter')
  if (list.length > VBOX_LIMITS.adapters) throw malformed(label, `more than ${VBOX_LIMITS.adapters} network adapters`)
  for (const a of list) {
    const slot = intAttr(a, 'slot', 0, 255, label, 'Adapter slot') ?? out.length
    const rawMac = a.attrs.get('MACAddress')
    let mac: string | null = null
    if (rawMac !== undefined) {
      mac = normalizeMac(rawMac)
      if (mac === null)
        warnings.push(`Adapter slot ${slot}: MACAddress ${JSON.stringify(rawMac.slice(0, 40))} is not a unicast MAC address: a new MAC is generated`)
    }
    const type = a.attrs.get('type') ?? 'Am79C973'
    let model = NIC_MODEL[type]
    if (model === undefined) {
      warnings.push(`Adapter slot ${slot}: unknown adapter type ${JSON.stringify(type)}: using e1000`)
      model = 'e1000'
    }
    // The active attachment is a direct child; `DisabledModes` keeps inactive ones and is skipped.
    let attachment: string | null = null
    let net: string | null = null
    for (const c of a.children) {
      if (!ATTACHMENT_KINDS.includes(c.name)) continue
      attachment = c.name
      net = c.name === 'NAT' ? 'NAT' : (c.attrs.get('name') ?? c.attrs.get('driver') ?? null)
      break
    }
    out.push({ slot, enabled: boolAttr(a.attrs.get('enabled')), mac, type, model, attachment, network: net })
  }
  out.sort((x, y) => x.slot - y.slot)
  return out
}

/**
 * Parses a `.vbox` (bytes or text) into a {@link VboxMachine}.
 *
 * @param label file name for messages.
 * @throws E_MIG_MALFORMED_ARCHIVE over 4 MiB, DOCTYPE/ENTITY, not well-formed, root is not
 *   `VirtualBox` or has no `Machine`, a HardDisk/Image uuid that is not a UUID, a HardDisk without
 *   location or registered twice, non-numeric or out-of-range `RAMSize`/`CPU@count`/`port`/
 *   `device`/`slot`, bounds of {@link VBOX_LIMITS} exceeded.
 * @throws E_MIG_UNSUPPORTED_FORMAT the settings are encrypted (VirtualBox 7 full-VM encryption:
 *   `Machine` holds only `keyId`/`keyStore` and an encrypted blob).
 */
export function parseVbox(input: string | Uint8Array, label: string): VboxMachine {
  if (typeof input !== 'string' && input.length > MAX_VBOX_BYTES) throw malformed(label, `settings file larger than ${MAX_VBOX_BYTES} bytes`)
  const text = typeof input === 'string' ? input : Buffer.from(input.buffer, input.byteOffset, input.length).toString('utf8')
  const root = parseXmlDocument(text.replace(/^\uFEFF/, ''), label)
  if (root.name !== 'VirtualBox') throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: root element is <${root.name}>, not a VirtualBox settings file`)
  const machine = xmlChild(root, 'Machine')
  if (!machine) throw malformed(label, 'no <Machine> element')
  if (machine.attrs.has('keyId') || machine.attrs.has('keyStore') || xmlChild(machine, 'Encrypted')) {
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: the VM settings are encrypted: decrypt the VM in VirtualBox first`)
  }
  const warnings: string[] = []
  const hw = xmlChild(machine, 'Hardware')
  if (!hw) throw malformed(label, 'the current state has no <Hardware> element')
  const media = readMedia(xmlChild(xmlChild(machine, 'MediaRegistry'), 'HardDisks'), label, warnings)
  const cpuCount = intAttr(xmlChild(hw, 'CPU'), 'count', 1, MAX_CPUS, label, 'CPU count') ?? 1
  const memoryMiB = intAttr(xmlChild(hw, 'Memory'), 'RAMSize', 1, MAX_RAM_MIB, label, 'Memory RAMSize')
  const firmware = (xmlChild(hw, 'Firmware')?.attrs.get('type') ?? 'BIOS').trim() || 'BIOS'
  // Settings 1.9+ keep StorageControllers in Hardware; older files directly in Machine.
  const scs = xmlChild(hw, 'StorageControllers') ?? xmlChild(machine, 'StorageControllers')
  const controllers = readControllers(scs, label, warnings)
  const adapters = readAdapters(xmlChild(hw, 'Network'), label, warnings)
  const name = (machine.attrs.get('name') ?? '').trim()
  return {
    label,
    settingsVersion: root.attrs.get('version') ?? null,
    uuid: normalizeVboxUuid(machine.attrs.get('uuid')),
    name,
    osType: machine.attrs.get('OSType')?.trim() || null,
    cpuCount,
    memoryMiB,
    firmware,
    media,
    controllers,
    adapters,
    warnings,
  }
}

/**
 * The differencing chain of image `uuid`: the image itself first, then its parents down to the
 * base image (the `HardDisk` nesting of the media registry).
 *
 * @throws E_MIG_MALFORMED_ARCHIVE the uuid is not in the media registry (message names it), or the
 *   chain is deeper than 64.
 */
export function vboxMediumChain(m: VboxMachine, uuid: string): VboxMedium[] {
  const chain: VboxMedium[] = []
  let cur: string | null = uuid
  while (cur !== null) {
    const md = m.media.get(cur)
    if (!md) {
      throw malformed(m.label, `image {${cur}} is not in the media registry of the .vbox (registered in VirtualBox's global VirtualBox.xml?)`, { uuid: cur })
    }
    chain.push(md)
    if (chain.length > VBOX_LIMITS.chainDepth) throw malformed(m.label, `differencing chain of {${uuid}} deeper than ${VBOX_LIMITS.chainDepth}`)
    cur = md.parent
  }
  return chain
}

/** VirtualBox medium format to the qemu driver, null when qemu has no matching driver here. */
export function qemuFormatOfVbox(format: string): DiskFormat | null {
  switch (format.toUpperCase()) {
    case 'VDI':
      return 'vdi'
    case 'VMDK':
      return 'vmdk'
    case 'VHD':
      return 'vpc'
    case 'VHDX':
      return 'vhdx'
    case 'RAW':
      return 'raw'
    default:
      return null
  }
}

/**
 * Options of {@link vboxToManifest}: `vboxPath` is the absolute, root-confined path of the `.vbox`;
 * image locations are resolved relative to its folder inside `importRoot`.
 */
export interface VboxManifestOptions {
  vboxPath: string
  importRoot: string
  allowUploads?: boolean
  qemuImg?: string
}

/**
 * Builds the {@link VmManifest} of a parsed `.vbox`.
 *
 * Disks: each hard-disk attachment of the current state, in controller order then port/device
 * order. The attached image may be a differencing child: `source.path` is that image,
 * `backing_chain` its parents (nearest first, absolute paths), `disk_format` from the registry
 * format (VDI `vdi`, VMDK `vmdk`, VHD `vpc`, VHDX `vhdx`, RAW `raw`), `capacity_bytes` from the
 * image header via `qemu-img info -f <fmt>` on the attached image, `allocated_bytes` the sum of
 * qemu's `actual-size` over the chain. `address` is `<controller index>:<port>:<device>`; labels
 * are the file names of the chain base images (without extension), sanitized and made unique. NICs: enabled
 * adapters by slot. Firmware: `EFI*` is `efi` (secure boot lives in the NVRAM file, not the
 * settings, so `secure_boot` is false with a warning), else `bios`.
 *
 * @throws E_MIG_HOST_PATH_REJECTED an image location escapes the import root.
 * @throws E_MIG_MALFORMED_ARCHIVE an attached or parent image is missing (message names the file
 *   and the uuid) or not in the media registry, or qemu-img cannot read it as its declared format.
 * @throws E_MIG_UNSUPPORTED_FORMAT an image format qemu cannot read here (Parallels, QED, iSCSI...).
 */
export async function vboxToManifest(m: VboxMachine, opts: VboxManifestOptions): Promise<VmManifest> {
  const warnings = [...m.warnings]
  const base = path.dirname(opts.vboxPath)
  const disks: ManifestDisk[] = []
  const labels = new Set<string>()
  const resolved = new Map<string, string>()
  const resolveMedium = async (md: VboxMedium): Promise<string> => {
    const hit = resolved.get(md.uuid)
    if (hit) return hit
    // Windows hosts write backslashes; the location is a host path relative to the .vbox folder.
    const loc = /^[A-Za-z]:[\\/]/.test(md.location) ? md.location : md.location.replace(/\\/g, '/')
    const abs = resolveInRoot(opts.importRoot, loc, { base, allowUploads: opts.allowUploads })
    const st = await statPath(abs).catch(() => null)
    if (!st || !st.isFile()) {
      throw malformed(m.label, `image ${JSON.stringify(md.location)} of medium {${md.uuid}} does not exist`, { uuid: md.uuid, file: md.location })
    }
    resolved.set(md.uuid, abs)
    return abs
  }
  m.controllers.forEach((c) => {
    if (c.bus === 'unknown' && c.attachments.length > 0)
      warnings.push(`StorageController ${JSON.stringify(c.name)} (${c.type}): its disks are attached to a default bus on the destination`)
  })
  checkDestinationLimits(m.label, { disks: m.controllers.reduce((n, c) => n + c.attachments.length, 0) })
  for (let ci = 0; ci < m.controllers.length; ci++) {
    const c = m.controllers[ci]!
    for (const a of c.attachments) {
      const chain = vboxMediumChain(m, a.imageUuid)
      const top = chain[0]!
      const fmt = qemuFormatOfVbox(top.format)
      if (fmt === null) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${m.label}: image {${top.uuid}} has format ${top.format}, which cannot be imported`)
      const paths: string[] = []
      let allocated = 0
      let allocatedKnown = true
      let capacity = 0
      for (let i = 0; i < chain.length; i++) {
        const md = chain[i]!
        const f = qemuFormatOfVbox(md.format)
        if (f === null) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${m.label}: image {${md.uuid}} has format ${md.format}, which cannot be imported`)
        const abs = await resolveMedium(md)
        paths.push(abs)
        const info = await qemuImgInfo(abs, { format: f, qemuImg: opts.qemuImg })
        if (i === 0) capacity = info.virtual_size
        if (info.actual_size === null) allocatedKnown = false
        else allocated += info.actual_size
      }
      // Differencing children are named after their uuid: the base image names the disk.
      const baseName = path.basename(chain[chain.length - 1]!.location.replace(/\\/g, '/')).replace(/\.[A-Za-z0-9]{1,8}$/, '')
      const stem = sanitizeLabel(baseName)
      let label = stem
      for (let k = 2; labels.has(label); k++) label = `${stem}_${k}`
      labels.add(label)
      if (chain.length > 1)
        warnings.push(`${label}: attached image {${top.uuid}} is a differencing image over ${chain.length - 1} parent(s); the chain is flattened on import`)
      disks.push({
        label,
        capacity_bytes: capacity,
        ...(allocatedKnown ? { allocated_bytes: allocated } : {}),
        disk_format: fmt,
        source: { path: paths[0]! },
        controller: c.bus,
        address: `${ci}:${a.port}:${a.device}`,
        ...(paths.length > 1 ? { backing_chain: paths.slice(1) } : {}),
      })
    }
  }
  if (disks.length === 0) warnings.push('the current state attaches no hard disk')
  const nics: ManifestNic[] = m.adapters.filter((a) => a.enabled).map((a) => ({ label: `nic${a.slot}`, mac: a.mac, model: a.model, network: a.network }))
  const fw = m.firmware.toUpperCase()
  const firmware: 'bios' | 'efi' = fw.startsWith('EFI') ? 'efi' : 'bios'
  if (fw !== 'BIOS' && !fw.startsWith('EFI')) warnings.push(`Firmware type ${JSON.stringify(m.firmware)} is unknown: using bios`)
  if (firmware === 'efi') warnings.push('UEFI guest: VirtualBox keeps the secure boot state in the NVRAM file, not the .vbox; secure boot is assumed off')
  let memoryMiB = m.memoryMiB
  if (memoryMiB === null) {
    memoryMiB = 128
    warnings.push('Memory RAMSize absent: VirtualBox default of 128 MiB used')
  }
  return {
    name: m.name || path.basename(opts.vboxPath).replace(/\.vbox$/i, ''),
    source_format: 'vbox_folder',
    guest_os: { family: guestFamilyOf(m.osType), id: m.osType },
    firmware,
    secure_boot: false,
    cpu: { count: m.cpuCount, cores_per_socket: 1 },
    memory_bytes: memoryMiB * MiB,
    disks,
    nics,
    cbt_available: false,
    warnings,
  }
}
