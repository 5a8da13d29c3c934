/**
 * `vmdk` importer (spec 1.1): one VMDK on its own: a sparse extent (monolithicSparse,
 * streamOptimized), a COWD extent, or a text descriptor with its extents (monolithicFlat,
 * twoGbMaxExtent*, vmfs*, snapshot deltas). The disk is inspected with {@link inspectVmdk};
 * the VM around it is unknown, so CPU, memory, firmware and guest are defaults, said in warnings.
 */
import * as path from 'node:path'
import { resolveInRoot } from '../hostpath.ts'
import { sanitizeLabel, type VmManifest } from '../manifest.ts'
import { busOfAdapterType, inspectVmdk, manifestDiskOf } from '../formats/vmdk/inspect.ts'
import type { Importer, InspectContext } from './types.ts'

const GiB = 1024 * 1024 * 1024

/**
 * Inspects one `.vmdk`: name from the file name, one disk on the bus of `ddb.adapterType`
 * (ide -> ide at `ide0:0`; buslogic/lsilogic/legacyESX/lsisas1068/pvscsi -> scsi at `scsi0:0`;
 * absent -> unknown at `0`), `firmware: 'bios'`, 1 vCPU, 2 GiB, guest unknown, no NIC.
 * Throws what {@link inspectVmdk} throws.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  const abs = resolveInRoot(ctx.importRoot, inputPath, { allowUploads: ctx.allowUploads })
  const info = await inspectVmdk(abs, ctx)
  const name = path.basename(abs).replace(/\.vmdk$/i, '') || 'vmdk'
  const controller = busOfAdapterType(info.adapterType)
  const address = controller === 'unknown' ? '0' : `${controller}0:0`
  return {
    name,
    source_format: 'vmdk',
    guest_os: { family: 'unknown', id: null },
    firmware: 'bios',
    secure_boot: false,
    cpu: { count: 1, cores_per_socket: 1 },
    memory_bytes: 2 * GiB,
    disks: [manifestDiskOf(info, sanitizeLabel(name), controller, address)],
    nics: [],
    cbt_available: false,
    warnings: [
      'a lone VMDK carries no VM configuration: CPU (1 vCPU), memory (2 GiB), firmware (bios) and guest OS (unknown) are defaults',
      ...(info.adapterType ? [] : ['the VMDK names no ddb.adapterType: the disk bus is unknown']),
      ...info.warnings,
    ],
  }
}

/** The `vmdk` importer. */
export const importer: Importer = { kind: 'vmdk', inspect }
