/**
 * `vbox_folder` importer (spec 1.1 `VboxFolder`): a VirtualBox VM folder holding one `.vbox`
 * settings file (plus its images and `Snapshots/`), or the `.vbox` file itself. The settings are
 * parsed with {@link parseVbox}; each attached image (possibly a differencing child) is resolved
 * relative to the `.vbox` folder inside the import root and read through `qemu-img info`
 * ({@link vboxToManifest}). Backups VirtualBox leaves beside it (`.vbox-prev`, `.vbox-tmp`) are
 * not settings files.
 */
import { readFile } from 'node:fs/promises'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { pinnedPath, resolveInRoot } from '../hostpath.ts'
import { statPath } from '../formats/io.ts'
import type { VmManifest } from '../manifest.ts'
import { MAX_VBOX_BYTES, parseVbox, vboxToManifest } from '../formats/vbox.ts'
import { findDescriptor } from './find-descriptor.ts'
import type { Importer, InspectContext } from './types.ts'

/**
 * Finds the `.vbox` of `inputPath`: the file itself, or the single `*.vbox` regular file of the
 * folder ({@link findDescriptor}: `E_MIG_MALFORMED_ARCHIVE`, `E_MIG_UNSUPPORTED_FORMAT`,
 * `E_MIG_DISK_READ_FAILED`).
 */
export function findVbox(inputPath: string): Promise<string> {
  return findDescriptor(inputPath, '.vbox')
}

/**
 * Inspects a VirtualBox folder or `.vbox` file (spec 1.2 step 3). Throws what
 * {@link findVbox}, {@link parseVbox} and {@link vboxToManifest} throw: `E_MIG_MALFORMED_ARCHIVE`
 * (bad XML, a missing image naming file and uuid), `E_MIG_HOST_PATH_REJECTED` (an image outside
 * the root), `E_MIG_UNSUPPORTED_FORMAT`, `E_MIG_DISK_READ_FAILED`.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  const vboxPath = await findVbox(resolveInRoot(ctx.importRoot, inputPath, { allowUploads: ctx.allowUploads }))
  const st = await statPath(vboxPath)
  if (st.size > MAX_VBOX_BYTES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${vboxPath}: settings file larger than 4 MiB (${st.size} bytes)`)
  let bytes: Buffer
  try {
    bytes = await readFile(pinnedPath(vboxPath))
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${vboxPath}: cannot read: ${(e as Error).message}`)
  }
  const machine = parseVbox(bytes, path.basename(vboxPath))
  return vboxToManifest(machine, { vboxPath, importRoot: ctx.importRoot, allowUploads: ctx.allowUploads, qemuImg: ctx.qemuImg })
}

/** The `vbox_folder` importer. */
export const importer: Importer = { kind: 'vbox_folder', inspect }
