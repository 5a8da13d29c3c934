/**
 * Input probing (DESIGN.md section 5 "Probing"): what a file is, from its magic bytes first
 * (`lib/formats/sniff.ts`) and `qemu-img info` as the fallback, and which importer kind an
 * unlabelled file or folder needs.
 */
import { opendir, stat } from 'node:fs/promises'
import * as nodePath from 'node:path'
import { MigError, isMigError } from '../errors.ts'
import type { ImporterKind } from '../kinds.ts'
import type { DiskFormat } from '../manifest.ts'
import { qemuImgInfo } from '../formats/qemu-info.ts'
import { assertSafeMemberNames, listTarMembers, type TarMember } from '../formats/tar.ts'
import type { InspectContext } from './types.ts'
import { openRead, statPath } from '../formats/io.ts'

export type { ProbeFormat, ProbeResult }
import { probeMagic, readHeadTail, type ProbeFormat, type ProbeResult } from '../formats/sniff.ts'

/**
 * Probes `path`: magic bytes first, `qemu-img info` when none matched.
 *
 * @returns the {@link ProbeResult}; never throws for an unrecognised file (it is `unknown`, or
 *   `raw` when qemu-img opens it as raw; a non-raw qemu format is reported in `description`).
 * @throws E_MIG_DISK_READ_FAILED the file cannot be opened or read.
 */
export async function probeFile(path: string, opts: { qemuImg?: string } = {}): Promise<ProbeResult> {
  const { head, tail, size } = await readHeadTail(path)
  const hit = probeMagic(head, tail, size)
  if (hit) return hit
  try {
    const info = await qemuImgInfo(path, { qemuImg: opts.qemuImg, timeoutMs: 10_000 })
    const known: Record<string, [ProbeFormat, DiskFormat]> = {
      qcow2: ['qcow2', 'qcow2'],
      vhdx: ['vhdx', 'vhdx'],
      vpc: ['vhd', 'vpc'],
      vmdk: ['vmdk_sparse', 'vmdk'],
      vdi: ['vdi', 'vdi'],
      raw: ['raw', 'raw'],
    }
    const k = known[info.format]
    if (k)
      return {
        format: k[0],
        disk_format: k[1],
        description: info.format === 'raw' ? 'raw data (no known image format)' : `${info.format} image`,
        source: 'qemu-img',
        size,
      }
    return { format: 'unknown', disk_format: null, description: `${info.format} image (qemu-img)`, source: 'qemu-img', size }
  } catch (e) {
    if (!isMigError(e)) throw e
    return { format: 'unknown', disk_format: null, description: 'unrecognised data', source: 'magic', size }
  }
}

/** Entries read from a folder by {@link detectKind}. */
const MAX_DIR_ENTRIES = 10_000

async function listDir(dir: string): Promise<Array<{ name: string; isDir: boolean }>> {
  const out: Array<{ name: string; isDir: boolean }> = []
  let d
  try {
    d = await opendir(dir)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${dir}: cannot list: ${(e as Error).message}`, { cause: e })
  }
  try {
    for await (const ent of d) {
      out.push({ name: ent.name, isDir: ent.isDirectory() })
      if (out.length >= MAX_DIR_ENTRIES) break
    }
  } finally {
    await d.close().catch(() => undefined)
  }
  return out
}

const ext = (name: string): string => nodePath.extname(name).toLowerCase()

/** Folder kinds by descriptor extension, in precedence order. */
const FOLDER_KINDS: Array<[string, ImporterKind]> = [
  ['.ovf', 'ovf_folder'],
  ['.vmx', 'vmx_folder'],
  ['.vbox', 'vbox_folder'],
]

async function detectFolder(dir: string): Promise<ImporterKind> {
  const entries = await listDir(dir)
  for (const [e, kind] of FOLDER_KINDS) if (entries.some((x) => !x.isDir && ext(x.name) === e)) return kind
  const vmDir = entries.find((x) => x.isDir && x.name.toLowerCase() === 'virtual machines')
  if (vmDir && (await listDir(nodePath.join(dir, vmDir.name))).some((x) => !x.isDir && ext(x.name) === '.vmcx')) return 'vmcx_export'
  if (entries.some((x) => !x.isDir && ext(x.name) === '.vmcx')) return 'vmcx_export'
  throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${dir}: folder holds no .ovf, .vmx or .vbox descriptor nor a Virtual Machines/*.vmcx export`)
}

/** Tar members, the first 8 when the archive is small, else all (bounded by tar.ts). */
async function tarMembers(file: string): Promise<readonly TarMember[]> {
  try {
    return await listTarMembers(file, { maxMembers: 8 })
  } catch (e) {
    if (isMigError(e, 'E_MIG_MALFORMED_ARCHIVE') && /more than \d+ (members|headers)/.test(e.message)) return listTarMembers(file)
    throw e
  }
}

async function detectTar(file: string): Promise<ImporterKind> {
  const all = await tarMembers(file)
  assertSafeMemberNames(all, nodePath.basename(file))
  const members = all.filter((m) => m.type !== 'directory')
  const base = (n: string): string => n.replace(/^(\.\/)+/, '')
  if (members.length > 0 && base(members[0]!.name) === 'ova.xml') return 'xva_archive'
  if (members.some((m) => m.type === 'file' && ext(m.name) === '.ovf')) return 'ova_archive'
  const names = members
    .slice(0, 5)
    .map((m) => m.name)
    .join(', ')
  throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: tar archive holds neither an .ovf descriptor nor ova.xml (members: ${names || 'none'})`)
}

/**
 * Importer kind of `path` (a file or folder inside the import root) that the user did not label.
 *
 * Folder: `*.ovf` -> `ovf_folder`, `*.vmx` -> `vmx_folder`, `*.vbox` -> `vbox_folder`,
 * `Virtual Machines/*.vmcx` (a Hyper-V export) -> `vmcx_export` (in that precedence).
 * File: `.ovf`/`.vmx`/`.vbox` -> that folder kind, `.vmcx` -> `vmcx_export`; a tar whose first member is `ova.xml` ->
 * `xva_archive`, a tar with an `.ovf` member -> `ova_archive`; qcow2 -> `qcow2`; VHDX or VHD ->
 * `vhdx`; VMDK sparse, COWD or descriptor -> `vmdk`.
 *
 * @throws E_MIG_UNSUPPORTED_FORMAT gzip (or other) compressed archives ("gzip-compressed archive:
 *   decompress it first"), legacy qcow v1, lone VDI images, raw data, XML that is no descriptor,
 *   images, folders without a descriptor: the message names what was seen.
 * @throws E_MIG_MALFORMED_ARCHIVE a tar archive that cannot be walked.
 * @throws E_MIG_HOST_PATH_REJECTED a tar member named outside the archive (absolute, `..`).
 * @throws E_MIG_DISK_READ_FAILED / E_MIG_NOT_FOUND the path cannot be read / does not exist.
 */
export async function detectKind(path: string, ctx: InspectContext): Promise<ImporterKind> {
  let st
  try {
    st = await statPath(path)
  } catch (e) {
    if (e instanceof MigError && e.code === 'E_MIG_HOST_PATH_REJECTED') throw e
    throw new MigError('E_MIG_NOT_FOUND', `${path} does not exist`)
  }
  if (st.isDirectory()) return detectFolder(path)
  if (!st.isFile()) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${path}: not a regular file or folder`)
  const e = ext(path)
  for (const [x, kind] of FOLDER_KINDS) if (e === x) return kind
  // The Hyper-V configuration itself (the importer takes the .vmcx or its export folder).
  if (e === '.vmcx') return 'vmcx_export'
  const p = await probeFile(path, { qemuImg: ctx.qemuImg })
  switch (p.format) {
    case 'qcow2':
      return 'qcow2'
    case 'vhdx':
    case 'vhd':
      return 'vhdx'
    case 'vmdk_sparse':
    case 'vmdk_cowd':
    case 'vmdk_descriptor':
      return 'vmdk'
    case 'tar':
      return detectTar(path)
    case 'gzip':
    case 'bzip2':
    case 'xz':
    case 'zstd':
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${path}: ${p.format}-compressed archive: decompress it first`)
    case 'qcow':
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${path}: legacy qcow v1 image is not supported; convert it to qcow2 first`)
    case 'vdi':
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${path}: a lone VirtualBox VDI image is not importable; import its .vbox folder instead`)
    default:
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${path}: unsupported input: ${p.description}`)
  }
}
