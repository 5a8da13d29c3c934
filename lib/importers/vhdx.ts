/**
 * The `vhdx` importer (spec 1.1 "Vhdx"): one Hyper-V disk image of either generation, VHDX
 * (MS-VHDX) or VHD (qemu `vpc`), becomes a one-disk VM manifest with default CPU, memory,
 * firmware and guest OS (see `singleDiskManifest`).
 *
 * Differencing disks: the parent is found from the VHDX parent locator (`relative_path`, then
 * the file name of `absolute_win32_path`, MS-VHDX 2.6.2.6) or the VHD parent locators (`W2ru`
 * relative path, then the file names of `W2ku` and of the parent unicode name), each taken
 * relative to the child's folder and confined to the import root; the chain is followed to its
 * base (depth 16, loops rejected). qemu 7.2's `vhdx` driver refuses images with a parent and its
 * `vpc` driver reads a differencing VHD as if it had none, so such a manifest carries a warning
 * to merge the chain at the source first.
 */
import { realpath } from 'node:fs/promises'
import * as nodePath from 'node:path'
import { MigError } from '../errors.ts'
import { remoteInput, resolveInRoot } from '../hostpath.ts'
import { qemuImgInfo } from '../formats/qemu-info.ts'
import { readVhdInfo, type VhdInfo } from '../formats/vhd.ts'
import { readVhdxInfo, type VhdxInfo } from '../formats/vhdx.ts'
import type { VmManifest } from '../manifest.ts'
import { singleDiskManifest } from './qcow2.ts'
import type { Importer, InspectContext } from './types.ts'
import { openRead, statPath } from '../formats/io.ts'

/** Deepest differencing chain followed. */
export const MAX_PARENT_DEPTH = 16

type Image = { kind: 'vhdx'; info: VhdxInfo } | { kind: 'vhd'; info: VhdInfo }

/** Reads `file` as VHDX when it starts with `vhdxfile`, else as VHD. */
async function readImage(file: string): Promise<Image> {
  let magic = ''
  const fh = await openRead(file)
  try {
    const b = Buffer.alloc(8)
    const { bytesRead } = await fh.read(b, 0, 8, 0)
    magic = b.toString('latin1', 0, bytesRead)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${file}: read failed: ${(e as Error).message}`, { cause: e })
  } finally {
    await fh.close()
  }
  if (magic === 'vhdxfile') return { kind: 'vhdx', info: await readVhdxInfo(file) }
  try {
    return { kind: 'vhd', info: await readVhdInfo(file) }
  } catch (e) {
    if (e instanceof MigError && e.code === 'E_MIG_UNSUPPORTED_FORMAT' && /no conectix footer/.test(e.message)) {
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: neither a VHDX (no vhdxfile identifier) nor a VHD (no conectix footer) image`)
    }
    throw e
  }
}

/** Last component of a Windows or POSIX path. */
function winBasename(p: string): string {
  const parts = p.split(/[\\/]/).filter((s) => s.length > 0)
  return parts[parts.length - 1] ?? ''
}

/** Candidate parent references of an image, best first, as POSIX-style relative paths. */
function parentCandidates(img: Image): string[] {
  const out: string[] = []
  if (img.kind === 'vhdx') {
    const loc = img.info.parent_locator ?? {}
    if (loc['relative_path']) out.push(loc['relative_path'].replace(/\\/g, '/'))
    if (loc['absolute_win32_path']) out.push(winBasename(loc['absolute_win32_path']))
  } else {
    for (const l of img.info.parent_locators) if (l.platform === 'W2ru') out.push(l.path.replace(/\\/g, '/'))
    for (const l of img.info.parent_locators) if (l.platform === 'W2ku') out.push(winBasename(l.path))
    if (img.info.parent_name) out.push(winBasename(img.info.parent_name))
  }
  return out.filter((c) => c.length > 0)
}

const hasParent = (img: Image): boolean => (img.kind === 'vhdx' ? img.info.has_parent : img.info.disk_type === 'differencing')

const normGuid = (g: string): string => g.replace(/[{}]/g, '').toUpperCase()

/**
 * Follows the differencing chain of `file` (already read as `top`) to its base.
 * @returns absolute parent paths, nearest first.
 * @throws E_MIG_HOST_PATH_REJECTED a locator escapes the import root.
 * @throws E_MIG_MALFORMED_ARCHIVE no locator resolves to an existing file, a loop, depth over 16,
 *   a parent of the other generation, a VHDX parent whose DataWriteGuid does not match
 *   `parent_linkage`/`parent_linkage2`, a VHD parent whose unique id is not the child's
 *   parent unique id.
 * @throws E_MIG_DISK_READ_FAILED an image cannot be read.
 */
export async function resolveDifferencingChain(file: string, top: Image, ctx: InspectContext): Promise<string[]> {
  let cur: string
  if (remoteInput(file) && hasParent(top))
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: a remote differencing disk is not read; merge it into its parent at the source`)
  try {
    cur = remoteInput(file) ? file : await realpath(file)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${file}: cannot open: ${(e as Error).message}`, { cause: e })
  }
  let img = top
  const seen = new Set([cur])
  const chain: string[] = []
  while (hasParent(img)) {
    if (chain.length >= MAX_PARENT_DEPTH) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${file}: differencing chain deeper than ${MAX_PARENT_DEPTH}`)
    const candidates = parentCandidates(img)
    let found: string | null = null
    for (const c of candidates) {
      const abs = resolveInRoot(ctx.importRoot, c, { base: nodePath.dirname(cur), allowUploads: ctx.allowUploads })
      const st = await statPath(abs).catch(() => null)
      if (st?.isFile()) {
        found = abs
        break
      }
    }
    if (!found)
      throw new MigError(
        'E_MIG_MALFORMED_ARCHIVE',
        `${cur}: parent disk not found (tried ${candidates.map((c) => JSON.stringify(c)).join(', ') || 'no locator'})`,
      )
    if (seen.has(found)) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${cur}: differencing chain loops back to ${found}`)
    seen.add(found)
    const parent = await readImage(found)
    if (parent.kind !== img.kind)
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${cur}: parent ${found} is not a ${img.kind === 'vhdx' ? 'VHDX' : 'VHD'} image`)
    if (img.kind === 'vhd' && parent.kind === 'vhd' && img.info.parent_unique_id !== parent.info.unique_id) {
      throw new MigError(
        'E_MIG_MALFORMED_ARCHIVE',
        `${cur}: parent ${found} has unique id ${parent.info.unique_id}, the child expects ${img.info.parent_unique_id} (not its parent)`,
      )
    }
    if (img.kind === 'vhdx' && parent.kind === 'vhdx') {
      const loc = img.info.parent_locator ?? {}
      const links = [loc['parent_linkage'], loc['parent_linkage2']].filter((x): x is string => !!x).map(normGuid)
      if (links.length === 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${cur}: parent locator has no parent_linkage`)
      if (!links.includes(parent.info.data_write_guid)) {
        throw new MigError(
          'E_MIG_MALFORMED_ARCHIVE',
          `${cur}: parent ${found} has DataWriteGuid ${parent.info.data_write_guid}, the child expects ${links.join(' or ')} (parent modified after the child was created)`,
        )
      }
    }
    chain.push(found)
    cur = found
    img = parent
  }
  return chain
}

/**
 * Inspects a VHDX or VHD image.
 * @throws E_MIG_UNSUPPORTED_FORMAT neither VHDX nor VHD; unsupported VHDX/VHD features.
 * @throws E_MIG_MALFORMED_ARCHIVE bad headers, an unreplayed VHDX log, broken parent chain,
 *   qemu-img failing on the image.
 * @throws E_MIG_HOST_PATH_REJECTED a parent locator outside the import root.
 * @throws E_MIG_DISK_READ_FAILED unreadable file. E_MIG_INTERNAL qemu-img is not installed.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  // a remote input (its URL) is read by the header and block readers only, never by qemu-img
  const remote = remoteInput(inputPath) !== undefined
  const file = remote ? inputPath : nodePath.resolve(inputPath)
  const img = await readImage(file)
  const format = img.kind === 'vhdx' ? 'vhdx' : 'vpc'
  const warnings: string[] = []
  if (img.kind === 'vhdx' && img.info.needs_log_replay) {
    throw new MigError(
      'E_MIG_MALFORMED_ARCHIVE',
      `${file}: VHDX log was not replayed (unclean shutdown); attach it once in Hyper-V or run qemu-img check -r all on a copy`,
    )
  }
  const chain = await resolveDifferencingChain(file, img, ctx)
  let allocated: number | null = null
  if (chain.length === 0 && !remote) {
    const info = await qemuImgInfo(file, { format, qemuImg: ctx.qemuImg })
    if (info.virtual_size !== img.info.virtual_size) {
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${file}: header says ${img.info.virtual_size} bytes, qemu-img says ${info.virtual_size}`)
    }
    allocated = info.actual_size
  } else if (chain.length > 0) {
    const why =
      format === 'vhdx'
        ? "qemu's vhdx driver refuses images with a parent"
        : "qemu's vpc driver ignores a differencing VHD's parent (its unallocated blocks would read as zeros)"
    warnings.push(
      `${nodePath.basename(file)} is a differencing disk and ${why}: merge it into its parent at the source (Hyper-V Edit Disk / Merge-VHD) before copying`,
    )
  }
  return singleDiskManifest({ kind: 'vhdx', file, format, capacity: img.info.virtual_size, allocated, chain, warnings })
}

/** The `vhdx` importer (VHDX and VHD images). */
export const importer: Importer = { kind: 'vhdx', inspect }
