/**
 * `vbox_folder` importer (spec 1.1 `VboxFolder`): a VirtualBox VM folder holding one `.vbox`
 * settings file (plus its images and `Snapshots/`), or the `.vbox` file itself. The settings are
 * parsed with {@link parseVbox}; each attached image (possibly a differencing child) is resolved
 * relative to the `.vbox` folder inside the import root and read through `qemu-img info`
 * ({@link vboxToManifest}). Backups VirtualBox leaves beside it (`.vbox-prev`, `.vbox-tmp`) are
 * not settings files.
 */
import { readdir, readFile, stat } from 'node:fs/promises'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { resolveInRoot } from '../hostpath.ts'
import type { VmManifest } from '../manifest.ts'
import { MAX_VBOX_BYTES, parseVbox, vboxToManifest } from '../formats/vbox.ts'
import type { Importer, InspectContext } from './types.ts'

/** Most directory entries scanned for the `.vbox` of a folder. */
const MAX_DIR_ENTRIES = 10000

/**
 * Finds the `.vbox` of `inputPath`: the file itself, or the single `*.vbox` regular file of the
 * folder. Throws `E_MIG_MALFORMED_ARCHIVE` (no `.vbox`, or several: they are listed),
 * `E_MIG_UNSUPPORTED_FORMAT` (a file not named `.vbox`), `E_MIG_DISK_READ_FAILED`.
 */
export async function findVbox(inputPath: string): Promise<string> {
  let st
  try {
    st = await stat(inputPath)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${inputPath}: cannot stat: ${(e as Error).message}`)
  }
  if (st.isFile()) {
    if (!/\.vbox$/i.test(inputPath)) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: not a .vbox file`)
    return inputPath
  }
  if (!st.isDirectory()) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: neither a folder nor a .vbox file`)
  let names: string[]
  try {
    names = await readdir(inputPath)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${inputPath}: cannot list: ${(e as Error).message}`)
  }
  if (names.length > MAX_DIR_ENTRIES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: more than ${MAX_DIR_ENTRIES} entries`)
  const found: string[] = []
  for (const n of names.sort()) {
    if (!/\.vbox$/i.test(n)) continue
    const s = await stat(path.join(inputPath, n)).catch(() => null)
    if (s?.isFile()) found.push(n)
  }
  if (found.length === 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: the folder holds no .vbox file`)
  if (found.length > 1) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: the folder holds several .vbox files: ${found.join(', ')}`, { details: { vbox_files: found } })
  return path.join(inputPath, found[0]!)
}

/**
 * Inspects a VirtualBox folder or `.vbox` file (spec 1.2 step 3). Throws what
 * {@link findVbox}, {@link parseVbox} and {@link vboxToManifest} throw: `E_MIG_MALFORMED_ARCHIVE`
 * (bad XML, a missing image naming file and uuid), `E_MIG_HOST_PATH_REJECTED` (an image outside
 * the root), `E_MIG_UNSUPPORTED_FORMAT`, `E_MIG_DISK_READ_FAILED`.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  const vboxPath = await findVbox(resolveInRoot(ctx.importRoot, inputPath, { allowUploads: ctx.allowUploads }))
  const st = await stat(vboxPath)
  if (st.size > MAX_VBOX_BYTES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${vboxPath}: settings file larger than 4 MiB (${st.size} bytes)`)
  let bytes: Buffer
  try {
    bytes = await readFile(vboxPath)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${vboxPath}: cannot read: ${(e as Error).message}`)
  }
  const machine = parseVbox(bytes, path.basename(vboxPath))
  return vboxToManifest(machine, { vboxPath, importRoot: ctx.importRoot, allowUploads: ctx.allowUploads, qemuImg: ctx.qemuImg })
}

/** The `vbox_folder` importer. */
export const importer: Importer = { kind: 'vbox_folder', inspect }
