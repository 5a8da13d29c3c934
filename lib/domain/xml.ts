/**
 * Libvirt domain XML for an imported VM (spec 1.2 "Starting", DESIGN.md section 6), following the
 * libvirt domain XML format (https://libvirt.org/formatdomain.html).
 *
 * The document is built as a plain object tree and serialized with fast-xml-parser's XMLBuilder,
 * which escapes `& < > " '` in every text node and attribute value. Names, labels and paths come from
 * hostile descriptors: characters XML 1.0 cannot carry are stripped, the domain name is sanitized to
 * `[A-Za-z0-9_.-]` (at most 63 characters), and paths must be absolute.
 *
 * Rules (documented choices):
 * - Machine: `q35`, except when a disk is on the `ide` bus (only through a per-volume `bus` override,
 *   for legacy BIOS guests that only have IDE drivers): then `pc` (i440FX), because q35 has no IDE
 *   controller. Secure boot needs q35 (SMM), so secure boot + IDE is refused.
 * - Guest family: `plan.guest_os` when set, else `manifest.guest_os.family`.
 * - Default disk bus: `sata` for Windows (AHCI drivers are in every Windows since Vista, virtio is
 *   only usable after V2V, which then passes `bus: 'virtio'` per volume) and for `unknown` guests
 *   (the bus most operating systems boot from without extra drivers); `virtio` for Linux and other.
 * - Disk driver: raw, `discard='unmap'`. `cache='none' io='native'` (O_DIRECT + Linux AIO) when the
 *   volume supports O_DIRECT: block devices always; files only when `directIo: true` is passed (the
 *   caller probes it: tmpfs and some FUSE file systems refuse O_DIRECT, and qemu then fails to open
 *   the disk). Otherwise `cache='writeback' io='threads'`.
 * - Boot: `<boot order='1'/>` on the first disk (manifest order is boot order).
 * - NICs: MACs preserved (valid unicast only; invalid, multicast or duplicate MACs are omitted and
 *   libvirt generates one). The NIC's `network` name is looked up in `plan.networks[].source` to pick
 *   a bridge; else `defaultBridge`; else `<interface type='user'>` (qemu user-mode networking: it
 *   needs no host bridge nor libvirt network, so a guest always gets a working NIC). Model `virtio`,
 *   `e1000` for Windows (no virtio-net driver before V2V), overridable with `nicModel`.
 * - Firmware: `plan.firmware` else `manifest.firmware`. UEFI uses OVMF as pflash with a per-domain
 *   NVRAM copied by libvirt from a template; secure boot (manifest `secure_boot`, UEFI only) uses the
 *   `secure='yes'` loader, the Microsoft-keys VARS template and the SMM feature. BIOS guests get
 *   `<bios useserial='yes'/>` (qemu `-machine graphics=off`: SeaBIOS writes its messages, such as
 *   "No bootable device", to the serial console too, where the boot check reads them).
 * - Serial: `<serial type='file'>` to `serialLogPath` plus a `<console>` on it; VNC on 127.0.0.1 with
 *   autoport; the qemu guest agent channel `org.qemu.guest_agent.0`; a pvpanic device (`<panic
 *   model='isa'>`) so a guest kernel panic shows as a crashed domain (the boot check reads it).
 * - SCSI controller model: `scsiModel` (the hardware choice, lib/domain/hardware.ts), default
 *   `virtio-scsi`. qemu's `pvscsi` and `mptsas1068` have one LUN per target, and libvirt puts
 *   its N-th disk of a controller on LUN N of target 0 for every model but `lsilogic`: on those
 *   two models each disk gets `<address type='drive'>` target N, unit (LUN) 0, instead
 *   ({@link SCSI_TARGETS_ONLY}); more disks than the model's targets fail.
 * - Memory: `manifest.memory_bytes` rounded up to KiB; 0 (unknown) becomes 1 GiB.
 * - vCPUs: `cpu.count`, topology sockets x cores x 1 thread with cores = `cores_per_socket` when it
 *   divides the count, else 1 core per socket. KVM uses `host-passthrough`; TCG (`qemu`) the default
 *   model.
 */
import { DESTINATION_LIMITS } from '../limits.ts'
import { XMLBuilder } from 'fast-xml-parser'
import { MigError } from '../errors.ts'
import { normalizeMac } from '../mac.ts'
import type { GuestFamily, VmManifest } from '../manifest.ts'
import type { Plan } from '../plan.ts'

/** Disk buses the destination can attach a volume to. */
export type DiskBus = 'virtio' | 'sata' | 'scsi' | 'ide'

/** NIC models the destination can use (qemu 7.2 emulates each; `vmxnet3` is VMware's). */
export type NicModel = 'virtio' | 'vmxnet3' | 'e1000' | 'e1000e' | 'rtl8139'

/**
 * libvirt SCSI controller models for the `scsi` bus: `virtio-scsi`, `vmpvscsi` (qemu `pvscsi`,
 * VMware PVSCSI), `lsisas1068` (qemu `mptsas1068`, LSI Logic SAS), `lsilogic` (qemu `lsi53c895a`).
 */
export type ScsiModel = 'virtio-scsi' | 'vmpvscsi' | 'lsisas1068' | 'lsilogic'

/**
 * One destination volume, the copy of `manifest.disks[i]` (same index).
 * - `path`: absolute path of a block device (zvol, loop device) or raw image file.
 * - `kind`: `block` or `file`; default `block` when `path` is under `/dev/`, else `file`.
 * - `bus`: overrides the default bus of the guest family (e.g. `virtio` after V2V).
 * - `directIo`: the file accepts O_DIRECT (ignored for block devices, which always do).
 * - `format`: the image format qemu opens (default `raw`; `qcow2` for a test boot's overlay, whose
 *   backing file and its format qemu reads from the overlay's header).
 * - `stopOnError`: a read or write error pauses the guest (`error_policy` and `rerror_policy`
 *   `stop`) instead of reporting it to the guest: a live import's overlay, whose backing export
 *   may be away for a while.
 */
export interface DomainVolume {
  label: string
  path: string
  kind?: 'block' | 'file'
  bus?: DiskBus
  directIo?: boolean
  format?: 'raw' | 'qcow2'
  stopOnError?: boolean
}

/** OVMF files: the read-only code image, the VARS template and the per-domain NVRAM path. */
export interface OvmfPaths {
  code: string
  varsTemplate: string
  nvram: string
}

/** The plan fields that override the manifest (spec 2.1, DESIGN.md section 3). */
export type DomainPlanOverrides = Partial<Pick<Plan, 'name' | 'guest_os' | 'firmware' | 'networks'>>

/**
 * Input of {@link buildDomainXml}.
 * - `uuid`: the domain UUID (RFC 4122 text form).
 * - `domainType`: `kvm` in production, `qemu` (TCG) in tests.
 * - `defaultBridge`: host bridge for NICs the plan does not map, or null for user networking.
 * - `ovmf`: OVMF paths for UEFI guests; default {@link debianOvmf} with the NVRAM under
 *   `/var/lib/libvirt/qemu/nvram/<name>_VARS.fd`.
 * - `serialLogPath`: absolute path of the serial console log file.
 * - `nicModel`: overrides the NIC model of every NIC (e.g. `virtio` after V2V).
 * - `scsiModel`: the SCSI controller model when a disk is on the `scsi` bus (default `virtio-scsi`).
 */
export interface DomainXmlInput {
  manifest: VmManifest
  plan?: DomainPlanOverrides
  volumes: DomainVolume[]
  uuid: string
  domainType: 'kvm' | 'qemu'
  defaultBridge: string | null
  ovmf?: OvmfPaths
  serialLogPath: string
  nicModel?: NicModel
  scsiModel?: ScsiModel
}

/**
 * SCSI controller models whose qemu device has a single LUN per target (qemu `pvscsi`: 64
 * targets, LUN 0 only; `mptsas1068`: 8 ports, LUN 0 only), with their number of targets: a disk
 * at libvirt's default address (target 0, unit = LUN N) makes qemu refuse to start ("bad scsi
 * device lun: 1"), so each disk is addressed to a target of its own.
 */
export const SCSI_TARGETS_ONLY: Partial<Record<ScsiModel, number>> = { vmpvscsi: 64, lsisas1068: 8 }

/** Most disks a domain built here may have (bounds hostile manifests; `lib/limits.ts`). */
export const MAX_DISKS = DESTINATION_LIMITS.maxDisks
/** Most NICs a domain built here may have (bounds hostile manifests; `lib/limits.ts`). */
export const MAX_NICS = DESTINATION_LIMITS.maxNics

/** Debian's `ovmf` package (12, bookworm) 4 MiB images; secure boot uses the MS-keys VARS template. */
export function debianOvmf(secureBoot: boolean, nvram: string): OvmfPaths {
  return secureBoot
    ? { code: '/usr/share/OVMF/OVMF_CODE_4M.secboot.fd', varsTemplate: '/usr/share/OVMF/OVMF_VARS_4M.ms.fd', nvram }
    : { code: '/usr/share/OVMF/OVMF_CODE_4M.fd', varsTemplate: '/usr/share/OVMF/OVMF_VARS_4M.fd', nvram }
}

// XML 1.0 Char production: everything else is dropped.
const NON_XML_CHARS = /[^\x09\x0A\x0D\x20-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/gu

/** `s` without characters XML 1.0 cannot represent (escaping of `&<>"'` is the serializer's job). */
export function xmlSafeText(s: string, maxLen = 4096): string {
  return s.replace(NON_XML_CHARS, '').slice(0, maxLen)
}

/**
 * A libvirt domain name from any text: runs of characters outside `[A-Za-z0-9_.-]` become `_`,
 * leading `.`/`_`/`-` are dropped, at most 63 characters, `vm` when nothing is left. Names virsh
 * would read as a domain id (all digits) or UUID get a `vm-` prefix.
 */
export function sanitizeDomainName(s: string): string {
  let n = s
    .replace(/[^A-Za-z0-9_.-]+/g, '_')
    .replace(/^[._-]+/, '')
    .slice(0, 63)
    .replace(/[._-]+$/, '')
  if (n === '') n = 'vm'
  if (/^[0-9]+$/.test(n) || /^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$/i.test(n)) n = `vm-${n}`.slice(0, 63)
  return n
}

/** The guest family the destination uses: `plan.guest_os` when set, else the manifest's. */
export function effectiveGuestFamily(manifest: VmManifest, plan?: DomainPlanOverrides): GuestFamily {
  return plan?.guest_os ?? manifest.guest_os.family
}

/** Default disk bus per guest family (see the module rules). */
export function defaultDiskBus(family: GuestFamily): DiskBus {
  return family === 'windows' || family === 'unknown' ? 'sata' : 'virtio'
}

/** Default NIC model per guest family: `e1000` for Windows, `virtio` otherwise. */
export function defaultNicModel(family: GuestFamily): NicModel {
  return family === 'windows' ? 'e1000' : 'virtio'
}

/**
 * Guest device name of the `index`-th (0-based) disk with prefix `vd`/`sd`/`hd`, spelled as libvirt
 * does: `a`..`z`, `aa`..`zz`, ... (`vda`, `vdz`, `vdaa`).
 */
export function targetDevName(prefix: 'vd' | 'sd' | 'hd', index: number): string {
  return prefix + driveLetters(index)
}

/** The letters of disk `index` as libvirt and virt-v2v spell them: 0 -> `a`, 25 -> `z`, 26 -> `aa`, 27 -> `ab`, ... */
export function driveLetters(index: number): string {
  let n = index
  let s = ''
  do {
    s = String.fromCharCode(97 + (n % 26)) + s
    n = Math.floor(n / 26) - 1
  } while (n >= 0)
  return s
}

function fail(msg: string): never {
  throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', msg)
}

function checkPath(what: string, p: string): string {
  if (typeof p !== 'string' || !p.startsWith('/') || p.length > 4096 || /[\x00-\x1f\x7f]/.test(p) || p.includes('/../') || p.endsWith('/..')) {
    fail(`${what}: not a clean absolute path: ${JSON.stringify(String(p).slice(0, 200))}`)
  }
  return p
}

const builder = new XMLBuilder({
  ignoreAttributes: false,
  attributeNamePrefix: '@_',
  textNodeName: '#text',
  format: true,
  indentBy: '  ',
  suppressEmptyNode: true,
  processEntities: true,
})

/**
 * Serializes a libvirt `<domain>` object tree (attributes as `@_name` keys, text as `#text`;
 * entities escaped) into indented XML. Used for the destination domain and for the domain
 * descriptions virt-v2v reads (lib/v2v/).
 */
export function serializeDomainXml(domain: Record<string, unknown>): string {
  return String(builder.build({ domain }))
}

type Node = Record<string, unknown>

/**
 * The libvirt domain XML of an imported VM (see the module rules for every choice).
 * Throws `E_MIG_DOMAIN_DEFINE_FAILED` when the input cannot make a valid domain: volume count not
 * matching the manifest's disks, more than {@link MAX_DISKS} disks or {@link MAX_NICS} NICs, a
 * non-absolute path, secure boot with IDE, more than 4 IDE disks, a malformed UUID.
 */
export function buildDomainXml(input: DomainXmlInput): string {
  const { manifest, plan, volumes } = input
  if (volumes.length !== manifest.disks.length) fail(`${volumes.length} volume(s) for ${manifest.disks.length} manifest disk(s)`)
  if (volumes.length === 0) fail('the VM has no disk')
  if (volumes.length > MAX_DISKS) fail(`too many disks (${volumes.length} > ${MAX_DISKS})`)
  if (manifest.nics.length > MAX_NICS) fail(`too many NICs (${manifest.nics.length} > ${MAX_NICS})`)
  if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(input.uuid))
    fail(`invalid domain uuid ${JSON.stringify(input.uuid.slice(0, 64))}`)

  const name = sanitizeDomainName(plan?.name ?? manifest.name)
  const family = effectiveGuestFamily(manifest, plan)
  const firmware = plan?.firmware ?? manifest.firmware
  const secureBoot = firmware === 'efi' && manifest.secure_boot
  const windows = family === 'windows'
  const kvm = input.domainType === 'kvm'

  // Disks
  const buses = volumes.map((v) => v.bus ?? defaultDiskBus(family))
  const ideCount = buses.filter((b) => b === 'ide').length
  if (ideCount > 4) fail(`${ideCount} IDE disks: the IDE controller has 4 slots`)
  if (ideCount > 0 && secureBoot) fail('secure boot needs the q35 machine, which has no IDE controller')
  const machine = ideCount > 0 ? 'pc' : 'q35'
  const counters = { vd: 0, sd: 0, hd: 0 }
  const scsiModel = input.scsiModel ?? 'virtio-scsi'
  const scsiTargets = SCSI_TARGETS_ONLY[scsiModel]
  const scsiCount = buses.filter((b) => b === 'scsi').length
  if (scsiTargets !== undefined && scsiCount > scsiTargets)
    fail(`${scsiCount} SCSI disks: the ${scsiModel} controller has ${scsiTargets} targets of one LUN each`)
  let scsiTarget = 0
  const disks: Node[] = volumes.map((v, i) => {
    const path = checkPath(`disk ${i}`, v.path)
    const kind = v.kind ?? (path.startsWith('/dev/') ? 'block' : 'file')
    const direct = kind === 'block' || v.directIo === true
    const bus = buses[i]!
    const prefix = bus === 'virtio' ? 'vd' : bus === 'ide' ? 'hd' : 'sd'
    const dev = targetDevName(prefix, counters[prefix]++)
    const disk: Node = {
      '@_type': kind,
      '@_device': 'disk',
      driver: {
        '@_name': 'qemu',
        '@_type': v.format ?? 'raw',
        '@_cache': direct ? 'none' : 'writeback',
        '@_io': direct ? 'native' : 'threads',
        '@_discard': 'unmap',
        ...(v.stopOnError ? { '@_error_policy': 'stop', '@_rerror_policy': 'stop' } : {}),
      },
      source: kind === 'block' ? { '@_dev': path } : { '@_file': path },
      target: { '@_dev': dev, '@_bus': bus },
    }
    if (bus === 'scsi' && scsiTargets !== undefined)
      disk.address = { '@_type': 'drive', '@_controller': '0', '@_bus': '0', '@_target': String(scsiTarget++), '@_unit': '0' }
    if (i === 0) disk.boot = { '@_order': '1' }
    return disk
  })

  // NICs
  const bridgeOf = new Map<string, string>()
  for (const m of plan?.networks ?? []) if (!bridgeOf.has(m.source)) bridgeOf.set(m.source, m.bridge)
  const model = input.nicModel ?? defaultNicModel(family)
  const seenMacs = new Set<string>()
  const interfaces: Node[] = manifest.nics.map((nic) => {
    const bridge = (nic.network !== null ? bridgeOf.get(nic.network) : undefined) ?? input.defaultBridge
    const iface: Node = { '@_type': bridge ? 'bridge' : 'user' }
    const mac = normalizeMac(nic.mac)
    if (mac && !seenMacs.has(mac)) {
      seenMacs.add(mac)
      iface.mac = { '@_address': mac }
    }
    if (bridge) {
      if (!/^[A-Za-z0-9][A-Za-z0-9._:-]{0,14}$/.test(bridge)) fail(`invalid bridge name ${JSON.stringify(bridge.slice(0, 64))}`)
      iface.source = { '@_bridge': bridge }
    }
    iface.model = { '@_type': model }
    return iface
  })

  // Firmware
  const os: Node = { type: { '@_arch': 'x86_64', '@_machine': machine, '#text': 'hvm' } }
  if (firmware === 'efi') {
    const ovmf = input.ovmf ?? debianOvmf(secureBoot, `/var/lib/libvirt/qemu/nvram/${name}_VARS.fd`)
    os.loader = {
      '@_readonly': 'yes',
      '@_secure': secureBoot ? 'yes' : 'no',
      '@_type': 'pflash',
      '#text': checkPath('OVMF code', ovmf.code),
    }
    os.nvram = { '@_template': checkPath('OVMF vars template', ovmf.varsTemplate), '#text': checkPath('NVRAM', ovmf.nvram) }
  } else {
    // SeaBIOS mirrors its console to the serial port: "No bootable device" reaches the serial log,
    // which the boot check reads as evidence (OVMF writes to the serial port by itself).
    os.bios = { '@_useserial': 'yes' }
  }
  const features: Node = { acpi: '', apic: '' }
  if (kvm && windows) {
    features.hyperv = {
      '@_mode': 'custom',
      relaxed: { '@_state': 'on' },
      vapic: { '@_state': 'on' },
      spinlocks: { '@_state': 'on', '@_retries': '8191' },
    }
  }
  if (secureBoot) features.smm = { '@_state': 'on' }

  // CPU and memory
  const count = manifest.cpu.count
  const cps = manifest.cpu.cores_per_socket
  const cores = cps <= count && count % cps === 0 ? cps : 1
  const topology = { '@_sockets': String(count / cores), '@_dies': '1', '@_cores': String(cores), '@_threads': '1' }
  const cpu: Node = kvm ? { '@_mode': 'host-passthrough', '@_check': 'none', '@_migratable': 'on', topology } : { topology }
  const kib = manifest.memory_bytes > 0 ? Math.ceil(manifest.memory_bytes / 1024) : 1024 * 1024
  const clock: Node = { '@_offset': windows ? 'localtime' : 'utc' }
  if (kvm && windows) clock.timer = [{ '@_name': 'hypervclock', '@_present': 'yes' }]

  const serialLog = checkPath('serial log', input.serialLogPath)
  const devices: Node = {
    disk: disks,
    ...(buses.includes('scsi') ? { controller: [{ '@_type': 'scsi', '@_index': '0', '@_model': scsiModel }] } : {}),
    ...(interfaces.length ? { interface: interfaces } : {}),
    serial: { '@_type': 'file', source: { '@_path': serialLog }, target: { '@_port': '0' } },
    console: { '@_type': 'file', source: { '@_path': serialLog }, target: { '@_type': 'serial', '@_port': '0' } },
    channel: { '@_type': 'unix', target: { '@_type': 'virtio', '@_name': 'org.qemu.guest_agent.0' } },
    graphics: { '@_type': 'vnc', '@_port': '-1', '@_autoport': 'yes', '@_listen': '127.0.0.1', listen: { '@_type': 'address', '@_address': '127.0.0.1' } },
    video: { model: { '@_type': windows ? 'vga' : 'virtio' } },
    memballoon: { '@_model': 'virtio' },
    // pvpanic (ISA, port 0x505): a guest kernel panic shows as a crashed domain.
    panic: { '@_model': 'isa' },
  }

  const title = xmlSafeText(`Imported ${manifest.source_format}: ${manifest.name}`, 512).replace(/[\r\n\t]+/g, ' ')
  const description = xmlSafeText(
    [
      `Imported by the VM migrator from ${manifest.source_format}.`,
      `Source name: ${manifest.name}`,
      `Guest OS: ${family}${manifest.guest_os.id ? ` (${manifest.guest_os.id})` : ''}`,
      ...manifest.disks.map((d, i) => `Disk ${i}: ${d.label} -> ${volumes[i]!.path}`),
    ].join('\n'),
    16384,
  )

  const domain: Node = {
    '@_type': input.domainType,
    name,
    uuid: input.uuid.toLowerCase(),
    title,
    description,
    memory: { '@_unit': 'KiB', '#text': String(kib) },
    currentMemory: { '@_unit': 'KiB', '#text': String(kib) },
    vcpu: { '@_placement': 'static', '#text': String(count) },
    os,
    features,
    cpu,
    clock,
    on_poweroff: 'destroy',
    on_reboot: 'restart',
    on_crash: 'destroy',
    devices,
  }
  return serializeDomainXml(domain)
}
