/**
 * `vmx_folder` importer (spec 1.1): a VMware VM folder (Workstation/Fusion/ESXi datastore
 * folder) holding one `.vmx`, or the `.vmx` file itself. The VMX is parsed with
 * {@link parseVmx}; each disk it names is resolved relative to the VMX's folder inside the import
 * root and inspected with {@link inspectVmdk} (descriptors, sparse/flat extents, snapshot chains).
 */
import { readdir, stat } from 'node:fs/promises'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { resolveInRoot } from '../hostpath.ts'
import { sanitizeLabel, type VmManifest } from '../manifest.ts'
import { inspectVmdk, manifestDiskOf } from '../formats/vmdk.ts'
import { MAX_VMX_BYTES, parseVmx, vmxToManifest } from '../formats/vmx.ts'
import { readFile } from 'node:fs/promises'
import type { Importer, InspectContext } from './types.ts'

/** Most directory entries scanned for the `.vmx` of a folder. */
const MAX_DIR_ENTRIES = 10000

/**
 * Finds the `.vmx` of `inputPath`: the file itself, or the single `*.vmx` regular file of the
 * folder. Throws `E_MIG_MALFORMED_ARCHIVE` (no `.vmx`, or several: they are listed),
 * `E_MIG_UNSUPPORTED_FORMAT` (a file not named `.vmx`), `E_MIG_DISK_READ_FAILED`.
 */
export async function findVmx(inputPath: string): Promise<string> {
  let st
  try {
    st = await stat(inputPath)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${inputPath}: cannot stat: ${(e as Error).message}`)
  }
  if (st.isFile()) {
    if (!/\.vmx$/i.test(inputPath)) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: not a .vmx file`)
    return inputPath
  }
  if (!st.isDirectory()) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: neither a folder nor a .vmx file`)
  let names: string[]
  try {
    names = await readdir(inputPath)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${inputPath}: cannot list: ${(e as Error).message}`)
  }
  if (names.length > MAX_DIR_ENTRIES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: more than ${MAX_DIR_ENTRIES} entries`)
  const vmx: string[] = []
  for (const n of names.sort()) {
    if (!/\.vmx$/i.test(n)) continue
    const s = await stat(path.join(inputPath, n)).catch(() => null)
    if (s?.isFile()) vmx.push(n)
  }
  if (vmx.length === 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: the folder holds no .vmx file`)
  if (vmx.length > 1) {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: the folder holds several .vmx files: ${vmx.join(', ')}`, { details: { vmx_files: vmx } })
  }
  return path.join(inputPath, vmx[0])
}

/**
 * Inspects a VMX folder or file. Disks: each `fileName` resolved with `resolveInRoot` relative
 * to the VMX folder (`E_MIG_HOST_PATH_REJECTED` outside the root); a missing file is
 * `E_MIG_MALFORMED_ARCHIVE` naming the VMX key and the file; the rest per {@link inspectVmdk}.
 * Labels are the disk file names without `.vmdk`, sanitized.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  const vmxPath = await findVmx(resolveInRoot(ctx.importRoot, inputPath, { allowUploads: ctx.allowUploads }))
  const st = await stat(vmxPath)
  if (st.size > MAX_VMX_BYTES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${vmxPath}: VMX larger than 4 MiB (${st.size} bytes)`)
  let bytes: Buffer
  try {
    bytes = await readFile(vmxPath)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${vmxPath}: cannot read: ${(e as Error).message}`)
  }
  const vmx = parseVmx(bytes, path.basename(vmxPath))
  const folder = path.dirname(vmxPath)
  return vmxToManifest(vmx, {
    fallbackName: path.basename(vmxPath).replace(/\.vmx$/i, ''),
    resolveDisk: async (fileName, bus, address, key) => {
      const abs = resolveInRoot(ctx.importRoot, fileName, { base: folder, allowUploads: ctx.allowUploads })
      const s = await stat(abs).catch(() => null)
      if (!s) {
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${path.basename(vmxPath)}: ${key} = ${JSON.stringify(fileName)}: disk file does not exist`, { details: { key, file: fileName } })
      }
      const info = await inspectVmdk(abs, ctx)
      const label = sanitizeLabel(path.basename(fileName.replace(/\\/g, '/')).replace(/\.vmdk$/i, ''))
      return { disk: manifestDiskOf(info, label, bus, address), warnings: info.warnings }
    },
  })
}

/** The `vmx_folder` importer. */
export const importer: Importer = { kind: 'vmx_folder', inspect }
