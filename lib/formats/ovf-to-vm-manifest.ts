/**
 * Assembles the {@link VmManifest} of a parsed OVF envelope (DSP0243): the disks of the chosen
 * hardware section with their DiskSection entries and Files, controllers, NICs, CPU, memory,
 * firmware and guest OS; and attaches the `.mf` digests (`ovf-manifest.ts`) to the disks.
 */
import { MigError } from '../errors.ts'
import { normalizeMac } from '../mac.ts'
import {
  guestFamilyOf,
  type ControllerBus,
  type DiskFormat,
  type DiskSource,
  type GuestFamily,
  type ManifestDisk,
  type ManifestNic,
  type VmManifest,
} from '../manifest.ts'
import { cimOsType } from './cim-os.ts'
import { malformed } from './io.ts'
import {
  allocationUnitsMultiplier,
  bytesOf,
  checkHref,
  parseCount,
  pickHardwareSection,
  type OvfDisk,
  type OvfEnvelope,
  type OvfFile,
  type OvfHardwareSection,
  type OvfItem,
} from './ovf.ts'
import type { ManifestVerification } from './ovf-manifest.ts'

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
 *   (or is smaller: the descriptor and the image must agree).
 */
export function ovfToManifest(env: OvfEnvelope, opts: OvfToManifestOptions): VmManifest {
  const label = opts.label ?? 'OVF'
  const section = opts.section ?? pickHardwareSection(env)
  const warnings = [...(opts.warnings ?? []), ...env.warnings]
  if (env.virtualSystem.hardwareSections.length > 1)
    warnings.push(`${env.virtualSystem.hardwareSections.length} VirtualHardwareSections; using the one of type ${section.systemTypes.join(' ') || '(none)'}`)
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
      // fit, and one smaller would silently become a much larger volume (a
      // 16 MiB image under a 1 TiB ovf:capacity); the descriptor and the image must agree.
      const why =
        resolved.capacity_bytes > r.disk.capacity
          ? 'the data does not fit the declared capacity'
          : "the descriptor and the image disagree; fix ovf:capacity to the image's size"
      throw new MigError(
        'E_MIG_MALFORMED_ARCHIVE',
        `${label}: ${lbl}: DiskSection ovf:capacity is ${r.disk.capacity} bytes but ${r.file.href} holds a ${resolved.capacity_bytes}-byte image: ${why}`,
        { details: { file: r.file.href, declared: r.disk.capacity, image: resolved.capacity_bytes } },
      )
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
