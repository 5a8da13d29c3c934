/**
 * `ovf_folder` importer: an OVF package as a folder of files (DMTF DSP0243 5.1: a descriptor
 * `.ovf`, an optional `.mf` manifest and `.cert`, and the files its References name, relative to
 * the descriptor). Every reference is confined to the import root with {@link resolveInRoot}.
 */
import { readdir, stat } from 'node:fs/promises'
import * as path from 'node:path'
import { createHash } from 'node:crypto'
import { statSync } from 'node:fs'
import { MigError } from '../errors.ts'
import { readFileRange } from '../formats/io.ts'
import { checkMemberHeader } from '../formats/member-header.ts'
import { currentInputScope, remoteInput, remoteSibling, resolveInRoot } from '../hostpath.ts'
import type { DiskSource, VmManifest } from '../manifest.ts'
import { hashRange } from '../formats/tar.ts'
import { MAX_DESCRIPTOR_BYTES, checkHref, chooseDiskFormat, decodeDescriptor, parseOvfEnvelope, pickHardwareSection, type OvfFile } from '../formats/ovf.ts'
import { capacityFromHeader } from '../formats/sniff.ts'
import { attachManifestDigests, ovfDiskRefs, ovfToManifest, type ResolvedOvfFile } from '../formats/ovf-to-vm-manifest.ts'
import { inflateHead } from '../formats/gzip-head.ts'
import { MAX_MANIFEST_BYTES, normalizeManifestName, parseOvfManifest, verifyOvfManifest, type ManifestTarget } from '../formats/ovf-manifest.ts'
import type { Importer, InspectContext } from './types.ts'

const HEAD_BYTES = 64 * 1024
const MAX_DIR_ENTRIES = 10_000

/** A URL (a remote folder export's file), not a host path. */
const isUrl = (p: string) => /^[a-z][a-z0-9+.-]*:\/\//i.test(p)

/** Size of a regular file, or null when it does not exist (other errors: `E_MIG_DISK_READ_FAILED`). */
function fileSize(abs: string): number | null {
  // a remote export's companion exists when the opener found it (lib/remote/folder.ts)
  if (isUrl(abs)) return remoteInput(abs)?.size ?? null
  try {
    const st = currentInputScope()?.pin(abs)?.stats ?? statSync(abs)
    if (!st.isFile()) return null
    return st.size
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT' || (e as NodeJS.ErrnoException).code === 'ENOTDIR') return null
    if (e instanceof MigError) {
      if (e.code === 'E_MIG_NOT_FOUND') return null
      throw e
    }
    throw new MigError('E_MIG_DISK_READ_FAILED', `${abs}: ${(e as Error).message}`, { cause: e })
  }
}

/** Finds the descriptor: the input itself when it is a file, else the one `.ovf` in the folder. */
async function findDescriptor(inputPath: string): Promise<string> {
  if (remoteInput(inputPath)) {
    if (!/\.ovf$/i.test(new URL(inputPath).pathname))
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: a remote OVF folder input is the URL of its .ovf descriptor`)
    return inputPath
  }
  let st
  try {
    st = await stat(inputPath)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${inputPath}: ${(e as Error).message}`, { cause: e })
  }
  if (st.isFile()) {
    if (!/\.ovf$/i.test(inputPath))
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${path.basename(inputPath)}: an OVF folder input is a folder or its .ovf descriptor`)
    return inputPath
  }
  if (!st.isDirectory()) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: neither a folder nor an .ovf file`)
  const names: string[] = []
  let n = 0
  try {
    for (const e of await readdir(inputPath, { withFileTypes: true })) {
      if (++n > MAX_DIR_ENTRIES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: more than ${MAX_DIR_ENTRIES} entries`)
      if ((e.isFile() || e.isSymbolicLink()) && /\.ovf$/i.test(e.name)) names.push(e.name)
    }
  } catch (e) {
    if (e instanceof MigError) throw e
    throw new MigError('E_MIG_DISK_READ_FAILED', `${inputPath}: ${(e as Error).message}`, { cause: e })
  }
  names.sort()
  if (names.length === 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${path.basename(inputPath)}: no .ovf descriptor in the folder`)
  if (names.length > 1)
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${path.basename(inputPath)}: several .ovf descriptors: ${names.join(', ')}`, {
      details: { descriptors: names },
    })
  return path.join(inputPath, names[0]!)
}

/**
 * Inspects an OVF folder (input: the folder, or its `.ovf` file).
 *
 * The folder must hold exactly one `.ovf` (several: `E_MIG_MALFORMED_ARCHIVE` listing them). Each
 * used File href is checked ({@link checkHref}) and resolved with
 * `resolveInRoot(ctx.importRoot, href, { base: folder })` (escapes: `E_MIG_HOST_PATH_REJECTED`);
 * a missing file or one shorter than `ovf:size` is `E_MIG_MALFORMED_ARCHIVE`. The `.mf` with the
 * descriptor's base name is verified like the OVA's. Disk source: `{ path: <absolute file> }`
 * (plus `compression`, `digest`); chunked files give `{ path: <absolute href path>,
 * layout: 'ovf_chunks', member: <href>, length }`, the chunks being `<path>.NNNNNNNNN`.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  const warnings: string[] = []
  const rootOpts = { allowUploads: ctx.allowUploads }
  const descriptor = resolveInRoot(ctx.importRoot, await findDescriptor(inputPath), rootOpts)
  const folder = path.dirname(descriptor)
  const remote = remoteInput(descriptor) !== undefined
  const label = remote ? decodeURIComponent(path.basename(descriptor)) : path.basename(descriptor)
  // a companion beside the descriptor: a sibling URL of a remote export, else a host path
  const sibling = (name: string) => (remote ? remoteSibling(folder, name) : path.join(folder, name))
  const size = fileSize(descriptor)
  if (size === null) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: descriptor is not a regular file`)
  if (size > MAX_DESCRIPTOR_BYTES)
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: descriptor is ${size} bytes, larger than the ${MAX_DESCRIPTOR_BYTES}-byte limit`)
  const ovfBytes = await readFileRange(descriptor, 0, size)
  const env = parseOvfEnvelope(decodeDescriptor(ovfBytes), label)

  const resolve = (ref: string, what: string) => resolveInRoot(ctx.importRoot, checkHref(ref, what), { ...rootOpts, base: folder })
  const section = pickHardwareSection(env)
  const { refs } = ovfDiskRefs(env, section, label)
  const sources = new Map<string, ResolvedOvfFile>()
  for (const { file, disk } of refs) {
    if (sources.has(file.id)) continue
    sources.set(file.id, await resolveFile(resolve(file.href, label), label, file, disk?.format ?? null, warnings))
  }

  const base = label.replace(/\.ovf$/i, '')
  const mfPath = sibling(`${base}.mf`)
  const mfSize = fileSize(mfPath)
  if (mfSize !== null) {
    const mfLabel = path.basename(mfPath)
    if (mfSize > MAX_MANIFEST_BYTES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${mfLabel}: manifest larger than ${MAX_MANIFEST_BYTES} bytes`)
    const entries = parseOvfManifest((await readFileRange(resolveInRoot(ctx.importRoot, mfPath, rootOpts), 0, mfSize)).toString('utf8'), mfLabel)
    const lookup = (name: string): ManifestTarget | null => {
      const abs = resolve(name, mfLabel)
      if (abs === descriptor) return { size: ovfBytes.length, digest: async (alg) => createHash(alg).update(ovfBytes).digest('hex') }
      const sz = fileSize(abs)
      if (sz === null) return null
      return { size: sz, digest: (alg) => hashRange(abs, 0, sz, alg) }
    }
    const res = await verifyOvfManifest(entries, lookup, { label: mfLabel, descriptor: label })
    const listed = new Set(entries.map((e) => normalizeManifestName(e.name)))
    attachManifestDigests(refs, sources, listed, res.deferred, mfLabel, label, warnings)
  } else warnings.push(`${label}: no ${base}.mf manifest; file digests not verified`)
  if (fileSize(sibling(`${base}.cert`)) !== null) warnings.push(`${base}.cert: the signature is not verified`)

  return ovfToManifest(env, { sourceFormat: 'ovf_folder', section, sources, warnings, fallbackName: base, label })
}

async function resolveFile(abs: string, label: string, file: OvfFile, formatUri: string | null, warnings: string[]): Promise<ResolvedOvfFile> {
  if (file.chunkSize !== null) {
    const expected = file.size !== null ? Math.ceil(file.size / file.chunkSize) : null
    let total = 0
    let first: string | null = null
    for (let i = 0; expected === null ? true : i < expected; i++) {
      if (i > 1_000_000) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: File ${file.href}: too many chunks`)
      const chunk = `${abs}.${String(i).padStart(9, '0')}`
      const sz = fileSize(chunk)
      if (sz === null) {
        if (expected === null && i > 0) break
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: chunk ${path.basename(chunk)} of File ${file.href} is missing`, {
          details: { file: path.basename(chunk) },
        })
      }
      if (sz > file.chunkSize || sz === 0)
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: chunk ${path.basename(chunk)} is ${sz} bytes; ovf:chunkSize is ${file.chunkSize}`)
      if (sz < file.chunkSize && (expected === null ? false : i < expected - 1))
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: chunk ${path.basename(chunk)} is ${sz} bytes; ovf:chunkSize is ${file.chunkSize}`)
      first ??= chunk
      total += sz
      if (expected === null && sz < file.chunkSize) break
    }
    if (file.size !== null && total !== file.size)
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: chunks of ${file.href} hold ${total} bytes, ovf:size declares ${file.size}`)
    let head = await readFileRange(first!, 0, HEAD_BYTES)
    if (file.compression === 'gzip') head = inflateHead(head)
    const source: DiskSource = { path: abs, member: file.href, length: total, layout: 'ovf_chunks' }
    if (file.compression) source.compression = file.compression
    const disk_format = chooseDiskFormat({ uri: formatUri, head, name: file.href, warnings })
    return { source, disk_format, capacity_bytes: capacityFromHeader(disk_format, head) ?? (disk_format === 'raw' && !file.compression ? total : undefined) }
  }
  const sz = fileSize(abs)
  if (sz === null)
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: File ${file.href} (ovf:id ${file.id}) is not in the folder`, { details: { file: file.href } })
  if (file.size !== null && sz < file.size)
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: truncated file ${file.href}: ovf:size declares ${file.size} bytes, file holds ${sz}`, {
      details: { file: file.href },
    })
  if (file.size !== null && sz > file.size) warnings.push(`${file.href}: file is ${sz} bytes, ovf:size says ${file.size}`)
  let head = await readFileRange(abs, 0, Math.min(HEAD_BYTES, sz))
  let tail: Buffer | undefined
  if (file.compression === 'gzip') head = inflateHead(head)
  else if (sz >= 1024) tail = await readFileRange(abs, sz - 512, 512)
  const source: DiskSource = { path: abs }
  if (file.compression) source.compression = file.compression
  const disk_format = chooseDiskFormat({ uri: formatUri, head, tail, name: file.href, warnings })
  if (!file.compression) await checkMemberHeader(disk_format, abs, 0, sz, head, file.href)
  return { source, disk_format, capacity_bytes: capacityFromHeader(disk_format, head) ?? (disk_format === 'raw' && !file.compression ? sz : undefined) }
}

/** The `ovf_folder` importer (spec 1.1). */
export const importer: Importer = { kind: 'ovf_folder', inspect }
