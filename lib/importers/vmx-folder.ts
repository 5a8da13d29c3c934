/**
 * `vmx_folder` importer (spec 1.1): a VMware VM folder (Workstation/Fusion/ESXi datastore
 * folder) holding one `.vmx`, or the `.vmx` file itself. The VMX is parsed with
 * {@link parseVmx}; each disk it names is resolved relative to the VMX's folder inside the import
 * root and inspected with {@link inspectVmdk} (descriptors, sparse/flat extents, snapshot chains).
 */
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { resolveInRoot } from '../hostpath.ts'
import { readFileRange, statPath } from '../formats/io.ts'
import { sanitizeLabel, type VmManifest } from '../manifest.ts'
import { inspectVmdk, manifestDiskOf } from '../formats/vmdk/inspect.ts'
import { MAX_VMX_BYTES, parseVmx, vmxToManifest } from '../formats/vmx.ts'
import { findDescriptor } from './find-descriptor.ts'
import type { Importer, InspectContext } from './types.ts'

/**
 * Finds the `.vmx` of `inputPath`: the file itself, or the single `*.vmx` regular file of the
 * folder ({@link findDescriptor}: `E_MIG_MALFORMED_ARCHIVE`, `E_MIG_UNSUPPORTED_FORMAT`,
 * `E_MIG_DISK_READ_FAILED`).
 */
export function findVmx(inputPath: string): Promise<string> {
  return findDescriptor(inputPath, '.vmx')
}

/**
 * Inspects a VMX folder or file. Disks: each `fileName` resolved with `resolveInRoot` relative
 * to the VMX folder (`E_MIG_HOST_PATH_REJECTED` outside the root); a missing file is
 * `E_MIG_MALFORMED_ARCHIVE` naming the VMX key and the file; the rest per {@link inspectVmdk}.
 * Labels are the disk file names without `.vmdk`, sanitized.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  const vmxPath = await findVmx(resolveInRoot(ctx.importRoot, inputPath, { allowUploads: ctx.allowUploads }))
  const st = await statPath(vmxPath)
  if (st.size > MAX_VMX_BYTES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${vmxPath}: VMX larger than 4 MiB (${st.size} bytes)`)
  // through the input scope: the pinned descriptor, or a remote export's ranged reads
  const bytes = await readFileRange(vmxPath, 0, st.size)
  const vmx = parseVmx(bytes, path.basename(vmxPath))
  const folder = path.dirname(vmxPath)
  return vmxToManifest(vmx, {
    fallbackName: path.basename(vmxPath).replace(/\.vmx$/i, ''),
    resolveDisk: async (fileName, bus, address, key) => {
      const abs = resolveInRoot(ctx.importRoot, fileName, { base: folder, allowUploads: ctx.allowUploads })
      const s = await statPath(abs).catch(() => null)
      if (!s) {
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${path.basename(vmxPath)}: ${key} = ${JSON.stringify(fileName)}: disk file does not exist`, {
          details: { key, file: fileName },
        })
      }
      const info = await inspectVmdk(abs, ctx)
      const label = sanitizeLabel(path.basename(fileName.replace(/\\/g, '/')).replace(/\.vmdk$/i, ''))
      return { disk: manifestDiskOf(info, label, bus, address), warnings: info.warnings }
    },
  })
}

/** The `vmx_folder` importer. */
export const importer: Importer = { kind: 'vmx_folder', inspect }
