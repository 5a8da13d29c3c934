/**
 * `xva_archive` importer (spec 1.1 `XvaArchive`): a XenServer / XCP-ng `.xva` export (a plain tar,
 * see `lib/formats/xva.ts` and `xva-chunks.ts`). The archive is walked without extraction
 * ({@link listTarMembers}), `ova.xml` is read (4 MiB cap) and parsed ({@link parseOvaXml}); each
 * disk VBD of the VM becomes a disk whose source is the archive with `member: 'Ref:<n>'` and
 * `layout: 'xva_blocks'` (the reader places chunk N at N MiB and leaves missing chunks as zeros),
 * `disk_format: 'raw'`, `capacity_bytes` the VDI's `virtual_size`, `allocated_bytes` the bytes of
 * the chunks present.
 * The block structure of every disk is checked at inspect; the checksums (XXH64 `.xxhash` or SHA-1
 * `.checksum`) of the first 64 MiB of blocks (in archive order) are verified at inspect, the rest
 * while the data is copied.
 */
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { resolveInRoot } from '../hostpath.ts'
import { guestFamilyOf, sanitizeLabel, type ManifestDisk, type ManifestNic, type VmManifest } from '../manifest.ts'
import { assertSafeMemberNames, listTarMembers, readTarMember } from '../formats/tar.ts'
import { MAX_OVA_XML_BYTES, parseOvaXml } from '../formats/xva.ts'
import { verifyXvaBlocks, XVA_MAX_MEMBERS } from '../formats/xva-chunks.ts'
import type { Importer, InspectContext } from './types.ts'
import { statPath } from '../formats/io.ts'

/** Block bytes whose checksum is verified at inspect time (64 MiB). */
export const XVA_INSPECT_VERIFY_BYTES = 64 * 1024 * 1024

/**
 * Inspects an `.xva` archive.
 *
 * Throws `E_MIG_UNSUPPORTED_FORMAT` (a folder, a compressed archive, no `ova.xml`),
 * `E_MIG_MALFORMED_ARCHIVE` (not a tar, bad `ova.xml`, not XML-RPC, a bad block size or number,
 * a block whose digest differs from its `.xxhash` or `.checksum`: messages name the member),
 * `E_MIG_HOST_PATH_REJECTED` (a member named outside the archive: absolute or `..`),
 * `E_MIG_DISK_READ_FAILED`.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  const archive = resolveInRoot(ctx.importRoot, inputPath, { allowUploads: ctx.allowUploads })
  const st = await statPath(archive)
  if (!st.isFile()) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${archive}: an XVA is a single tar file (an unpacked XVA folder is not supported)`)
  const members = await listTarMembers(archive, { maxMembers: XVA_MAX_MEMBERS })
  assertSafeMemberNames(members, path.basename(archive))
  const xmlIdx = members.findIndex((m) => m.name.replace(/^\.\//, '') === 'ova.xml' && m.type === 'file')
  if (xmlIdx < 0) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${archive}: not an XVA (no ova.xml member)`)
  const warnings: string[] = []
  if (xmlIdx !== 0) warnings.push(`ova.xml is member ${xmlIdx + 1} of the archive, not the first as xapi writes it`)
  const label = `${path.basename(archive)}!ova.xml`
  const desc = parseOvaXml(await readTarMember(archive, members[xmlIdx]!, MAX_OVA_XML_BYTES), label)
  warnings.push(...desc.warnings)
  const vm = desc.vm

  const vdiSizes = new Map<string, number>()
  for (const [id, v] of vm.vdis) vdiSizes.set(id, v.virtual_size)
  const check = await verifyXvaBlocks(archive, members, { vdiSizes, maxBytes: XVA_INSPECT_VERIFY_BYTES })
  warnings.push(...check.warnings)

  const disks: ManifestDisk[] = []
  const labels = new Set<string>()
  for (const vbd of vm.vbds) {
    if (vbd.type !== 'Disk' || vbd.vdi === null) continue
    const vdi = vm.vdis.get(vbd.vdi)!
    const dir = check.dirs.get(vdi.id)!
    if (dir.blocks.length === 0) warnings.push(`VDI ${vdi.id} (${vdi.name_label || 'unnamed'}): no data blocks in the archive: the disk is imported as zeros`)
    const stem = sanitizeLabel(vdi.name_label || `disk${vbd.userdevice}`)
    let lbl = stem
    for (let k = 2; labels.has(lbl); k++) lbl = `${stem}_${k}`
    labels.add(lbl)
    disks.push({
      label: lbl,
      capacity_bytes: vdi.virtual_size,
      allocated_bytes: dir.bytes,
      disk_format: 'raw',
      source: { path: archive, member: vdi.id, layout: 'xva_blocks' },
      controller: 'xen',
      address: vbd.userdevice,
    })
  }
  if (disks.length === 0) warnings.push('the VM has no disk VBD')
  const nics: ManifestNic[] = vm.vifs.map((v) => ({ label: `nic${v.device}`, mac: v.mac, model: 'e1000', network: v.network }))
  const family = guestFamilyOf(vm.os_hint)
  if (vm.os_hint === null) warnings.push('the export records no guest OS hint: guest family unknown (set plan.guest_os)')
  if (vm.memory_static_max === 0) warnings.push('memory_static_max is 0')
  return {
    name: vm.name_label.trim() || path.basename(archive).replace(/\.xva$/i, ''),
    source_format: 'xva_archive',
    guest_os: { family, id: vm.os_hint },
    firmware: vm.firmware,
    secure_boot: vm.secure_boot,
    cpu: { count: vm.vcpus_max, cores_per_socket: vm.cores_per_socket },
    memory_bytes: vm.memory_static_max,
    disks,
    nics,
    cbt_available: false,
    warnings,
  }
}

/** The `xva_archive` importer. */
export const importer: Importer = { kind: 'xva_archive', inspect }
