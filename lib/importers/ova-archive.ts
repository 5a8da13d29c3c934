/**
 * `ova_archive` importer: an OVF package in one tar file (DMTF DSP0243 5.3 "Distribution as a
 * single file": the descriptor first, then the `.mf` manifest and `.cert`, then the files in
 * References order). Inspect lists the tar headers, reads the descriptor (4 MiB cap) and the
 * manifest, verifies the manifest, and maps every disk's File to its member's byte range, so the
 * copy reads the disk in place (DESIGN.md section 5: never extract).
 */
import * as path from 'node:path'
import * as posix from 'node:path/posix'
import { createHash } from 'node:crypto'
import { MigError } from '../errors.ts'
import { readFileRange } from '../formats/io.ts'
import { checkMemberHeader } from '../formats/member-header.ts'
import type { DiskSource, VmManifest } from '../manifest.ts'
import { assertSafeMemberNames, hashRange, listTarMembers, readTarMember, sniffCompression, type TarMember } from '../formats/tar.ts'
import { MAX_DESCRIPTOR_BYTES, checkHref, chooseDiskFormat, decodeDescriptor, parseOvfEnvelope, pickHardwareSection, type OvfFile } from '../formats/ovf.ts'
import { capacityFromHeader } from '../formats/sniff.ts'
import { attachManifestDigests, ovfDiskRefs, ovfToManifest, type ResolvedOvfFile } from '../formats/ovf-to-vm-manifest.ts'
import { inflateHead } from '../formats/gzip-head.ts'
import { MAX_MANIFEST_BYTES, normalizeManifestName, parseOvfManifest, verifyOvfManifest, type ManifestTarget } from '../formats/ovf-manifest.ts'
import type { Importer, InspectContext } from './types.ts'

const HEAD_BYTES = 64 * 1024

/** Normalized archive path of a member name (`./a//b` -> `a/b`); a disk source's `member` is one. */
export function memberKey(name: string): string {
  return normalizeManifestName(name).replace(/\/+$/, '')
}

/**
 * Inspects an OVA.
 *
 * Steps: refuse compressed archives (`E_MIG_UNSUPPORTED_FORMAT` "gzip-compressed archive:
 * decompress it first"); list members ({@link listTarMembers}); refuse the archive when a member
 * is named outside it (absolute, `..`: `E_MIG_HOST_PATH_REJECTED`, {@link assertSafeMemberNames});
 * exactly one `.ovf` (first member
 * per DSP0243, accepted elsewhere with a warning); parse it; check each used File href
 * ({@link checkHref}: `..`, absolute, URL scheme -> `E_MIG_HOST_PATH_REJECTED`), resolved relative to
 * the descriptor's folder in the archive; the member must exist and hold at least `ovf:size`
 * bytes; chunked files (`ovf:chunkSize`) need every `<href>.NNNNNNNNN` member; verify the `.mf`
 * ({@link verifyOvfManifest}: files up to 64 MiB now, larger ones' digests go to
 * `DiskSource.digest`); choose the disk format from the DiskSection URI and the member's magic.
 *
 * Disk source: `{ path: <archive>, offset, length, member, compression?, digest? }`, or for a
 * chunked file `{ path: <archive>, member: <href path>, length: <total bytes>, layout: 'ovf_chunks' }`.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  void ctx
  const archive = inputPath
  const arcName = path.basename(archive)
  const warnings: string[] = []

  const head = await readFileRange(archive, 0, 512)
  const comp = sniffCompression(head)
  if (comp) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${arcName}: ${comp}-compressed archive: decompress it first`)

  const members = await listTarMembers(archive)
  assertSafeMemberNames(members, arcName)
  const byName = new Map<string, TarMember>()
  for (const m of members) if (m.type === 'file') byName.set(memberKey(m.name), m) // later members win, as on extraction
  const ovfs = members.filter((m) => m.type === 'file' && /\.ovf$/i.test(m.name))
  if (ovfs.length === 0)
    throw new MigError(
      'E_MIG_MALFORMED_ARCHIVE',
      `${arcName}: no .ovf descriptor in the archive (members: ${
        members
          .slice(0, 8)
          .map((m) => m.name)
          .join(', ') || 'none'
      })`,
    )
  if (ovfs.length > 1)
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${arcName}: several .ovf descriptors: ${ovfs.map((m) => m.name).join(', ')}`, {
      details: { descriptors: ovfs.map((m) => m.name) },
    })
  const ovfMember = ovfs[0]!
  const firstFile = members.find((m) => m.type === 'file')
  if (firstFile !== ovfMember) warnings.push(`${arcName}: the descriptor ${ovfMember.name} is not the first member (DSP0243 5.3 wants it first)`)

  const label = `${arcName}:${ovfMember.name}`
  if (ovfMember.size > MAX_DESCRIPTOR_BYTES)
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: descriptor is ${ovfMember.size} bytes, larger than the ${MAX_DESCRIPTOR_BYTES}-byte limit`)
  const ovfBytes = await readTarMember(archive, ovfMember, MAX_DESCRIPTOR_BYTES)
  const env = parseOvfEnvelope(decodeDescriptor(ovfBytes), label)
  const baseDir = posix.dirname(memberKey(ovfMember.name))
  const inArchive = (rel: string) => (baseDir === '.' ? rel : posix.join(baseDir, rel))

  // Disks of the chosen hardware section -> members.
  const section = pickHardwareSection(env)
  const { refs } = ovfDiskRefs(env, section, label)
  const sources = new Map<string, ResolvedOvfFile>()
  for (const { file, disk } of refs) {
    if (sources.has(file.id)) continue
    sources.set(file.id, await resolveFile(archive, arcName, label, file, disk?.format ?? null, byName, inArchive, warnings))
  }

  // Manifest (.mf): same base name as the descriptor, else the only .mf beside it.
  const base = memberKey(ovfMember.name).replace(/\.ovf$/i, '')
  const mfs = members.filter((m) => m.type === 'file' && /\.mf$/i.test(m.name) && posix.dirname(memberKey(m.name)) === baseDir)
  const mf = mfs.find((m) => memberKey(m.name).replace(/\.mf$/i, '') === base) ?? (mfs.length === 1 ? mfs[0] : undefined)
  if (mf) {
    const mfLabel = `${arcName}:${mf.name}`
    const entries = parseOvfManifest((await readTarMember(archive, mf, MAX_MANIFEST_BYTES)).toString('utf8'), mfLabel)
    const descriptorKey = memberKey(ovfMember.name)
    const lookup = (name: string): ManifestTarget | null => {
      const key = inArchive(checkHref(name, mfLabel))
      if (key === descriptorKey) return { size: ovfBytes.length, digest: async (alg) => createHash(alg).update(ovfBytes).digest('hex') }
      const m = byName.get(key)
      if (!m) return null
      return { size: m.size, digest: (alg) => hashRange(archive, m.offset, m.size, alg) }
    }
    const res = await verifyOvfManifest(entries, lookup, { label: mfLabel, descriptor: posix.basename(descriptorKey) })
    const listed = new Set(entries.map((e) => normalizeManifestName(e.name)))
    attachManifestDigests(refs, sources, listed, res.deferred, mf.name, label, warnings)
  } else warnings.push(`${arcName}: no .mf manifest; file digests not verified`)
  if (members.some((m) => m.type === 'file' && /\.cert$/i.test(m.name))) warnings.push(`${arcName}: the .cert signature is not verified`)

  return ovfToManifest(env, { sourceFormat: 'ova_archive', section, sources, warnings, fallbackName: base, label })
}

async function resolveFile(
  archive: string,
  arcName: string,
  label: string,
  file: OvfFile,
  formatUri: string | null,
  byName: Map<string, TarMember>,
  inArchive: (rel: string) => string,
  warnings: string[],
): Promise<ResolvedOvfFile> {
  const key = inArchive(checkHref(file.href, label))
  if (file.chunkSize !== null) {
    // DSP0243 5.3: chunks are <href>.000000000, <href>.000000001, ... each chunkSize bytes but the last.
    const chunks: TarMember[] = []
    const expected = file.size !== null ? Math.ceil(file.size / file.chunkSize) : null
    for (let i = 0; expected === null ? true : i < expected; i++) {
      if (i > 1_000_000) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: File ${file.href}: too many chunks`)
      const name = `${key}.${String(i).padStart(9, '0')}`
      const m = byName.get(name)
      if (!m) {
        if (expected === null && i > 0) break
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${arcName}: chunk member ${name} of File ${file.href} (ovf:id ${file.id}) is missing`, {
          details: { member: name },
        })
      }
      chunks.push(m)
    }
    let total = 0
    chunks.forEach((c, i) => {
      const last = i === chunks.length - 1
      if ((!last && c.size !== file.chunkSize) || (last && (c.size > file.chunkSize! || c.size === 0))) {
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${arcName}: chunk member ${c.name} is ${c.size} bytes; ovf:chunkSize is ${file.chunkSize}`, {
          details: { member: c.name },
        })
      }
      total += c.size
    })
    if (file.size !== null && total !== file.size)
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${arcName}: chunks of ${file.href} hold ${total} bytes, ovf:size declares ${file.size}`, {
        details: { member: key },
      })
    const first = chunks[0]!
    let headBytes = await readFileRange(archive, first.offset, Math.min(HEAD_BYTES, first.size))
    if (file.compression === 'gzip') headBytes = inflateHead(headBytes)
    const source: DiskSource = { path: archive, member: key, length: total, layout: 'ovf_chunks' }
    if (file.compression) source.compression = file.compression
    const disk_format = chooseDiskFormat({ uri: formatUri, head: headBytes, name: key, warnings })
    return {
      source,
      disk_format,
      capacity_bytes: capacityFromHeader(disk_format, headBytes) ?? (disk_format === 'raw' && !file.compression ? total : undefined),
    }
  }
  const m = byName.get(key)
  if (!m)
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${arcName}: member ${key} (File ${file.href}, ovf:id ${file.id}) is not in the archive`, {
      details: { member: key },
    })
  if (file.size !== null && m.size < file.size) {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${arcName}: truncated member ${m.name}: ovf:size declares ${file.size} bytes, archive holds ${m.size}`, {
      details: { member: m.name, declared: file.size, held: m.size },
    })
  }
  if (file.size !== null && m.size > file.size) warnings.push(`${m.name}: member is ${m.size} bytes, ovf:size says ${file.size}`)
  let headBytes = await readFileRange(archive, m.offset, Math.min(HEAD_BYTES, m.size))
  let tail: Buffer | undefined
  if (file.compression === 'gzip') headBytes = inflateHead(headBytes)
  else if (m.size >= 1024) tail = await readFileRange(archive, m.offset + m.size - 512, 512)
  const source: DiskSource = { path: archive, offset: m.offset, length: m.size, member: m.name }
  if (file.compression) source.compression = file.compression
  const disk_format = chooseDiskFormat({ uri: formatUri, head: headBytes, tail, name: m.name, warnings })
  if (!file.compression) await checkMemberHeader(disk_format, archive, m.offset, m.size, headBytes, m.name)
  return {
    source,
    disk_format,
    capacity_bytes: capacityFromHeader(disk_format, headBytes) ?? (disk_format === 'raw' && !file.compression ? m.size : undefined),
  }
}

/** The `ova_archive` importer (spec 1.1). */
export const importer: Importer = { kind: 'ova_archive', inspect }
