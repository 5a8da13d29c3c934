/**
 * Input probing (DESIGN.md section 5 "Probing"): what a file is, from its magic bytes first and
 * `qemu-img info` as the fallback, and which importer kind an unlabelled file or folder needs.
 *
 * Magic bytes checked (sources: qemu `docs/interop/qcow2.txt`, MS-VHDX 2.2.1, VMware "Virtual
 * Disk Format 5.0" (sparse extent `KDMV`, ESX `COWD`, text descriptor), the VHD specification
 * (footer cookie `conectix`), VirtualBox `VDICore.h`, POSIX ustar, RFC 1952 gzip).
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

/**
 * What the magic bytes (or qemu-img) say a file is:
 * `qcow2`; `qcow` (legacy qcow v1, flagged: not importable); `vhdx`; `vhd` (qemu `vpc`);
 * `vmdk_sparse` (`KDMV` hosted sparse extent, incl. streamOptimized); `vmdk_cowd` (ESX `COWD`
 * sparse); `vmdk_descriptor` (text descriptor); `vdi`; `tar` (ustar or GNU tar); `gzip`,
 * `bzip2`, `xz`, `zstd`, `zip` (compressed streams); `xml`; `raw` (qemu-img found no format);
 * `unknown` (recognised non-disk files such as PNG, or nothing recognisable).
 */
export type ProbeFormat =
  | 'qcow2' | 'qcow' | 'vhdx' | 'vhd' | 'vmdk_sparse' | 'vmdk_cowd' | 'vmdk_descriptor' | 'vdi'
  | 'tar' | 'gzip' | 'bzip2' | 'xz' | 'zstd' | 'zip' | 'xml' | 'raw' | 'unknown'

/**
 * Result of {@link probeFile}.
 * - `format`: see {@link ProbeFormat}.
 * - `disk_format`: the qemu driver that reads it as a disk (`qcow2`, `vhdx`, `vpc`, `vmdk`,
 *   `vdi`, `raw`), or null for containers, descriptors of other kinds and unknown files.
 * - `version`: the format version where the magic carries one (qcow 1/2/3).
 * - `description`: human text of what was seen (`"qcow2 v3 image"`, `"PNG image"`).
 * - `source`: `magic` or `qemu-img` (the fallback). `size`: file size, bytes.
 */
export interface ProbeResult {
  format: ProbeFormat
  disk_format: DiskFormat | null
  version?: number
  description: string
  source: 'magic' | 'qemu-img'
  size: number
}

/** Bytes read from the start of a file for magic checks. */
const HEAD_BYTES = 4096

/** Well-known non-disk files, reported as `unknown` with their name. */
const OTHER_MAGIC: Array<[Buffer, string]> = [
  [Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), 'PNG image'],
  [Buffer.from([0xff, 0xd8, 0xff]), 'JPEG image'],
  [Buffer.from('GIF8', 'latin1'), 'GIF image'],
  [Buffer.from('%PDF-', 'latin1'), 'PDF document'],
  [Buffer.from([0x7f, 0x45, 0x4c, 0x46]), 'ELF executable'],
  [Buffer.from('MZ', 'latin1'), 'DOS/Windows executable'],
  [Buffer.from('Rar!', 'latin1'), 'RAR archive'],
  [Buffer.from('7z\xbc\xaf\x27\x1c', 'latin1'), '7-Zip archive'],
]

async function readHeadTail(file: string): Promise<{ head: Buffer; tail: Buffer; size: number }> {
  const fh = await openRead(file)
  try {
    const size = (await fh.stat()).size
    const head = Buffer.alloc(Math.min(HEAD_BYTES, size))
    const tail = Buffer.alloc(Math.min(512, size))
    try {
      if (head.length) await fh.read(head, 0, head.length, 0)
      if (tail.length) await fh.read(tail, 0, tail.length, size - tail.length)
    } catch (e) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${file}: read failed: ${(e as Error).message}`, { cause: e })
    }
    return { head, tail, size }
  } finally {
    await fh.close()
  }
}

/** Text start without a UTF-8 BOM and leading whitespace. */
function textStart(head: Buffer): string {
  let s = head.toString('latin1', 0, Math.min(head.length, 64))
  if (s.startsWith('\xef\xbb\xbf')) s = s.slice(3)
  return s.replace(/^[\s]+/, '')
}

/**
 * Classifies the bytes of a file: `head` (its first bytes, up to 4 KiB), `tail` (its last 512 or
 * fewer) and `size`. Pure; returns null when no magic matched (then qemu-img is asked).
 */
export function probeMagic(head: Buffer, tail: Buffer, size: number): ProbeResult | null {
  const r = (format: ProbeFormat, disk_format: DiskFormat | null, description: string, version?: number): ProbeResult =>
    ({ format, disk_format, description, source: 'magic', size, ...(version !== undefined ? { version } : {}) })
  if (size === 0) return r('unknown', null, 'empty file')
  const at = (off: number, s: string): boolean => head.length >= off + s.length && head.toString('latin1', off, off + s.length) === s
  if (at(0, 'QFI\xfb')) {
    const v = head.length >= 8 ? head.readUInt32BE(4) : -1
    if (v === 1) return r('qcow', null, 'legacy qcow v1 image', 1)
    return r('qcow2', 'qcow2', `qcow2 v${v} image`, v)
  }
  if (at(0, 'vhdxfile')) return r('vhdx', 'vhdx', 'VHDX image')
  if (at(0, 'KDMV')) return r('vmdk_sparse', 'vmdk', 'VMDK sparse extent')
  if (at(0, 'COWD')) return r('vmdk_cowd', 'vmdk', 'VMDK ESX sparse (COWD) extent')
  if (textStart(head).startsWith('# Disk DescriptorFile')) return r('vmdk_descriptor', 'vmdk', 'VMDK descriptor')
  if (head.length >= 0x44 && head.readUInt32LE(0x40) === 0xbeda107f) return r('vdi', 'vdi', 'VirtualBox VDI image')
  const vhdTail = (tail.length >= 512 && tail.toString('latin1', tail.length - 512, tail.length - 504) === 'conectix') ||
    (tail.length >= 511 && tail.toString('latin1', tail.length - 511, tail.length - 503) === 'conectix')
  if (vhdTail || at(0, 'conectix')) return r('vhd', 'vpc', 'VHD image')
  if (at(257, 'ustar')) return r('tar', null, 'tar archive')
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return r('gzip', null, 'gzip-compressed file')
  if (at(0, 'BZh')) return r('bzip2', null, 'bzip2-compressed file')
  if (at(0, '\xfd7zXZ\x00')) return r('xz', null, 'xz-compressed file')
  if (at(0, '\x28\xb5\x2f\xfd')) return r('zstd', null, 'zstd-compressed file')
  if (at(0, 'PK\x03\x04')) return r('zip', null, 'zip archive')
  for (const [magic, what] of OTHER_MAGIC) if (head.length >= magic.length && head.subarray(0, magic.length).equals(magic)) return r('unknown', null, what)
  const t = textStart(head)
  if (t.startsWith('<?xml') || /^<[A-Za-z!]/.test(t)) return r('xml', null, 'XML document')
  return null
}

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
    const known: Record<string, [ProbeFormat, DiskFormat]> = { qcow2: ['qcow2', 'qcow2'], vhdx: ['vhdx', 'vhdx'], vpc: ['vhd', 'vpc'], vmdk: ['vmdk_sparse', 'vmdk'], vdi: ['vdi', 'vdi'], raw: ['raw', 'raw'] }
    const k = known[info.format]
    if (k) return { format: k[0], disk_format: k[1], description: info.format === 'raw' ? 'raw data (no known image format)' : `${info.format} image`, source: 'qemu-img', size }
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
const FOLDER_KINDS: Array<[string, ImporterKind]> = [['.ovf', 'ovf_folder'], ['.vmx', 'vmx_folder'], ['.vbox', 'vbox_folder']]

async function detectFolder(dir: string): Promise<ImporterKind> {
  const entries = await listDir(dir)
  for (const [e, kind] of FOLDER_KINDS) if (entries.some((x) => !x.isDir && ext(x.name) === e)) return kind
  const vmDir = entries.find((x) => x.isDir && x.name.toLowerCase() === 'virtual machines')
  if (vmDir && (await listDir(nodePath.join(dir, vmDir.name))).some((x) => !x.isDir && ext(x.name) === '.vmcx')) return 'vmcx_export'
  if (entries.some((x) => !x.isDir && ext(x.name) === '.vmcx')) return 'vmcx_export'
  throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${dir}: folder holds no .ovf, .vmx or .vbox descriptor nor a Virtual Machines/*.vmcx export`)
}

/** Tar members, the first 8 when the archive is small, else all (bounded by tar.ts). */
async function tarMembers(file: string): Promise<TarMember[]> {
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
  const names = members.slice(0, 5).map((m) => m.name).join(', ')
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
