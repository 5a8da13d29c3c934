/**
 * VmManifest: what inspecting a source VM or an offline input yields (spec 2.5), before anything
 * is copied. All sizes are bytes. The zod schema is the single source of the type.
 */
import { z } from 'zod'
import { ADAPTER_KINDS, IMPORTER_KINDS } from './kinds.ts'

/** Guest OS families the destination cares about (Windows needs V2V, spec 1.2). */
export const GuestFamily = z.enum(['windows', 'linux', 'other', 'unknown'])
export type GuestFamily = z.infer<typeof GuestFamily>

/** Disk formats, spelled as qemu's block drivers spell them (`qemu-img -f`). */
export const DiskFormat = z.enum(['raw', 'qcow2', 'vmdk', 'vhdx', 'vpc', 'vdi'])
export type DiskFormat = z.infer<typeof DiskFormat>

/** Bus of the controller a disk hangs off in the source VM. */
export const ControllerBus = z.enum(['ide', 'sata', 'scsi', 'nvme', 'virtio', 'xen', 'unknown'])
export type ControllerBus = z.infer<typeof ControllerBus>

/**
 * Where a disk's bytes are.
 * - `path`: absolute host path of the file qemu or the direct reader opens (for a tar member,
 *   the archive), or for a live source the datastore path.
 * - `offset`/`length`: byte range of a tar member's data inside `path` (OVA, XVA).
 * - `member`: the tar member name, for messages.
 * - `compression`: `gzip` when the OVF References/File says `ovf:compression="gzip"`.
 * - `layout`: set when a tar member's data is not one contiguous range:
 *   `xva_blocks`: `member` is the XVA VDI directory (`Ref:5`) whose `NNNNNNNN` members are 1 MiB
 *   blocks at `N * 1 MiB` of the disk, missing blocks being zeros (XVA format, xapi);
 *   `ovf_chunks`: `member` is the OVF href whose `<href>.NNNNNNNNN` members concatenate to the
 *   file (DSP0243 `ovf:chunkSize`).
 * - `digest`: the `.mf` manifest digest of the file, verified while the data is copied when it was
 *   too large to verify at inspect time.
 * - `device_key`: the vSphere virtual device key (live sources only).
 */
export const DiskSource = z.object({
  path: z.string(),
  offset: z.number().int().nonnegative().optional(),
  length: z.number().int().nonnegative().optional(),
  member: z.string().optional(),
  compression: z.enum(['gzip']).optional(),
  layout: z.enum(['xva_blocks', 'ovf_chunks']).optional(),
  digest: z.object({ algorithm: z.enum(['sha1', 'sha256', 'sha512']), hex: z.string() }).optional(),
  device_key: z.number().int().optional(),
})
export type DiskSource = z.infer<typeof DiskSource>

/**
 * One disk of the VM, in source order (boot disk first where the source says so).
 * - `capacity_bytes`: virtual size the guest sees.
 * - `allocated_bytes`: bytes the source actually stores, when the header tells.
 * - `disk_format`: how to read `source` (qemu driver name; `raw` for flat extents).
 * - `backing_chain`: absolute paths of parent images, nearest first (qcow2 backing files,
 *   VMDK/VBOX differencing parents, VHDX parent locators); all inside the import root.
 */
export const ManifestDisk = z.object({
  label: z.string(),
  capacity_bytes: z.number().int().nonnegative(),
  allocated_bytes: z.number().int().nonnegative().optional(),
  disk_format: DiskFormat,
  source: DiskSource,
  controller: ControllerBus,
  address: z.string(),
  backing_chain: z.array(z.string()).optional(),
})
export type ManifestDisk = z.infer<typeof ManifestDisk>

/**
 * Whether the copy loop reads the disk's file exactly as stored: a raw file (or tar member) read
 * in place, neither gzip-compressed nor chunked. Then the file's `.mf` digest (`source.digest`)
 * is checked on the bytes the copy reads; otherwise it is checked on the stored file before.
 */
export function copyReadsStoredBytes(disk: ManifestDisk): boolean {
  return disk.disk_format === 'raw' && !disk.source.compression && disk.source.layout !== 'ovf_chunks'
}

/**
 * One network adapter. `mac` is lower-case `aa:bb:cc:dd:ee:ff`, or null when the source generates
 * it. `pci_slot`: the source's PCI slot number of the NIC when the descriptor says it (VMX
 * `ethernetN.pciSlotNumber`; VMware guests name the NIC `ens<slot>` after it), absent otherwise.
 */
export const ManifestNic = z.object({
  label: z.string(),
  mac: z.string().nullable(),
  model: z.string(),
  network: z.string().nullable(),
  pci_slot: z.number().int().nonnegative().optional(),
})
export type ManifestNic = z.infer<typeof ManifestNic>

/** The manifest of one VM (spec 2.5; fields per DESIGN.md and issue "Offline formats"). */
export const VmManifest = z.object({
  name: z.string(),
  source_format: z.enum([...IMPORTER_KINDS, ...ADAPTER_KINDS]),
  guest_os: z.object({ family: GuestFamily, id: z.string().nullable() }),
  firmware: z.enum(['bios', 'efi']),
  secure_boot: z.boolean(),
  cpu: z.object({ count: z.number().int().positive(), cores_per_socket: z.number().int().positive() }),
  memory_bytes: z.number().int().nonnegative(),
  disks: z.array(ManifestDisk),
  nics: z.array(ManifestNic),
  cbt_available: z.boolean(),
  warnings: z.array(z.string()),
})
export type VmManifest = z.infer<typeof VmManifest>

/**
 * Guest family from a raw OS identifier of any source format: OVF `vmw:osType`/`ovf:id` text,
 * VMX `guestOS` (`windows9-64`, `rhel7-64`), VBOX `OSType` (`Windows2016_64`, `Ubuntu_64`),
 * XVA platform strings. Unknown or empty identifiers give `unknown`.
 */
export function guestFamilyOf(id: string | null | undefined): GuestFamily {
  if (!id) return 'unknown'
  const s = id.toLowerCase()
  if (/win|microsoft/.test(s) && !/darwin/.test(s)) return 'windows'
  if (
    /linux|rhel|centos|ubuntu|debian|suse|sles|fedora|redhat|oracle|arch|gentoo|mandr|turbo|asianux|coreos|photon|alma|rocky|amazon|mint|opensuse|ttylinux/.test(
      s,
    )
  )
    return 'linux'
  if (/other|freebsd|solaris|netware|darwin|mac|os2|dos|bsd|unix|sco|eComStation/i.test(s)) return 'other'
  return 'unknown'
}

/** A label safe for file names and zvol names: `[A-Za-z0-9._-]`, at most 64 characters, never `.`/`..`. */
export function sanitizeLabel(label: string): string {
  const s = label
    .replace(/[^A-Za-z0-9._-]+/g, '_')
    .replace(/^[._]+/, '')
    .slice(0, 64)
  return s === '' ? 'disk' : s
}
