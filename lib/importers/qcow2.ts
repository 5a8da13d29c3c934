/**
 * The `qcow2` importer (spec 1.1 "Qcow2"): one qcow2 image, optionally with a backing chain,
 * becomes a one-disk VM manifest. A lone disk image carries no VM configuration, so CPU, memory,
 * firmware and guest OS are defaults the plan can override (listed in `warnings`).
 *
 * Reads the qcow2 header (`lib/formats/qcow2.ts`, qemu `docs/interop/qcow2.txt`), follows the
 * backing chain inside the import root, and asks `qemu-img info` for the allocated bytes.
 */
import * as nodePath from 'node:path'
import { MigError } from '../errors.ts'
import { remoteInput } from '../hostpath.ts'
import { qemuImgInfo } from '../formats/qemu-info.ts'
import { readQcow2Header, resolveQcow2BackingChain } from '../formats/qcow2.ts'
import type { ImporterKind } from '../kinds.ts'
import { sanitizeLabel, type DiskFormat, type VmManifest } from '../manifest.ts'
import type { Importer, InspectContext } from './types.ts'

/** Memory of a VM built from a lone disk image, bytes (2 GiB). */
export const DEFAULT_MEMORY_BYTES = 2 * 1024 * 1024 * 1024

/** The warning every single-disk manifest carries about its defaulted settings. */
export const DEFAULTS_WARNING =
  'a disk image carries no VM configuration: CPU (1 vCPU), memory (2 GiB), firmware (BIOS) and guest OS (unknown) are defaults the plan can override'

/**
 * The manifest of a VM made of one disk image (shared by the `qcow2` and `vhdx` importers).
 * - `file`: absolute image path; the VM `name` and disk `label` come from its file name.
 * - `capacity`: virtual size from the header, bytes; `allocated`: qemu's actual size, bytes.
 * - `chain`: absolute parent paths, nearest first. `warnings`: extra warnings after the defaults one.
 */
export function singleDiskManifest(args: {
  kind: ImporterKind
  file: string
  format: DiskFormat
  capacity: number
  allocated?: number | null
  chain: string[]
  warnings?: string[]
}): VmManifest {
  const base = nodePath.basename(args.file)
  const stem = base.includes('.') && !base.startsWith('.') ? base.slice(0, base.lastIndexOf('.')) : base
  return {
    name: stem,
    source_format: args.kind,
    guest_os: { family: 'unknown', id: null },
    firmware: 'bios',
    secure_boot: false,
    cpu: { count: 1, cores_per_socket: 1 },
    memory_bytes: DEFAULT_MEMORY_BYTES,
    disks: [
      {
        label: sanitizeLabel(stem),
        capacity_bytes: args.capacity,
        ...(args.allocated !== null && args.allocated !== undefined ? { allocated_bytes: args.allocated } : {}),
        disk_format: args.format,
        source: { path: args.file },
        controller: 'virtio',
        address: '0',
        ...(args.chain.length ? { backing_chain: args.chain } : {}),
      },
    ],
    nics: [],
    cbt_available: false,
    warnings: [DEFAULTS_WARNING, ...(args.warnings ?? [])],
  }
}

/**
 * Inspects a qcow2 image.
 * @throws E_MIG_UNSUPPORTED_FORMAT not qcow2 (incl. legacy qcow v1), encrypted, external data file.
 * @throws E_MIG_MALFORMED_ARCHIVE inconsistent header, broken backing chain (missing, loop, depth
 *   over 16), qemu-img disagreeing with the header or failing on the image.
 * @throws E_MIG_HOST_PATH_REJECTED a backing file outside the import root.
 * @throws E_MIG_DISK_READ_FAILED unreadable file. E_MIG_INTERNAL qemu-img is not installed.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  // a remote input (its URL) is read by the header and cluster readers only, never by qemu-img
  const remote = remoteInput(inputPath) !== undefined
  const file = remote ? inputPath : nodePath.resolve(inputPath)
  const header = await readQcow2Header(file)
  const chain = await resolveQcow2BackingChain(file, ctx)
  const info = remote ? { virtual_size: header.virtual_size, actual_size: null } : await qemuImgInfo(file, { format: 'qcow2', qemuImg: ctx.qemuImg })
  if (info.virtual_size !== header.virtual_size) {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${file}: header says ${header.virtual_size} bytes, qemu-img says ${info.virtual_size}`)
  }
  const warnings: string[] = []
  if (header.dirty) warnings.push(`${nodePath.basename(file)}: image is marked dirty (lazy refcounts); qemu repairs refcounts on open, data is unaffected`)
  const foreign = chain.filter((c) => c.format !== 'qcow2')
  for (const c of foreign) warnings.push(`backing file ${c.name} is ${c.format ?? 'of unknown format'}; qemu reads it through the chain`)
  return singleDiskManifest({
    kind: 'qcow2',
    file,
    format: 'qcow2',
    capacity: header.virtual_size,
    allocated: info.actual_size,
    chain: chain.map((c) => c.path),
    warnings,
  })
}

/** The `qcow2` importer. */
export const importer: Importer = { kind: 'qcow2', inspect }
