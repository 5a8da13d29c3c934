/**
 * Offline inspection of a VMDK (the `vmdk` and `vmx_folder` importers, OVA/OVF member checks):
 * the descriptor, the headers of its extents and its parent chain, read from files inside the
 * import root, reading only headers and descriptors (the data is read at copy by qemu's vmdk
 * driver). Parsing is done by the format modules of this folder (`descriptor.ts`,
 * `hosted-sparse.ts`, `cowd.ts`, `sesparse.ts`) under the limits of `limits.ts`, the same ones
 * the snapshot-chain reader (`chain-reader.ts`) uses; faults as `faults.ts` says.
 *
 * Sources: "VMware Virtual Disk Format 5.0" (sections "Hosted Sparse Extent Header", "ESX Server
 * Sparse Extent Header", "The Descriptor File", "Stream-Optimized Compressed Sparse Extents"),
 * and qemu `block/vmdk.c`. All offsets and sizes named `*Sectors`/`sectors` are 512-byte sectors;
 * every `*_bytes`/`*Bytes` is bytes.
 */
import { stat } from 'node:fs/promises'
import type { Stats } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../errors.ts'
import { readFileRange, statPath } from '../io.ts'
import { currentInputScope, resolveInRoot } from '../../hostpath.ts'
import type { ControllerBus, ManifestDisk } from '../../manifest.ts'
import type { InspectContext } from '../../contracts/inspect.ts'
import { COWD_MAGIC, parseCowdHeader } from './cowd.ts'
import {
  DEVICE_CREATE_TYPES,
  looksLikeDescriptor,
  parseVmdkDescriptor,
  QEMU_DESCRIPTOR_CREATE_TYPES,
  type VmdkDescriptor,
  type VmdkExtentLine,
} from './descriptor.ts'
import { malformed, unsupported } from './faults.ts'
import { parseKdmvHeader, parseStreamFooter, VMDK_SPARSE_MAGIC, type VmdkSparseHeader } from './hosted-sparse.ts'
import { MAX_CAPACITY_SECTORS, MAX_CHAIN_DEPTH, MAX_DESCRIPTOR_BYTES, SECTOR } from './limits.ts'
import { isSeSparse, parseSeSparseHeader } from './sesparse.ts'

/**
 * One extent as found on disk by {@link inspectVmdk}.
 * - `path`: absolute, symlink-free path (null for ZERO extents).
 * - `fileBytes`: size of that file; `header`: its sparse header (SPARSE/VMFSSPARSE).
 */
export interface VmdkExtentInfo extends VmdkExtentLine {
  path: string | null
  fileBytes: number | null
  header: VmdkSparseHeader | null
}

/**
 * What {@link inspectVmdk} learns about one virtual disk.
 * - `path`: absolute path of the file inspected (descriptor or sparse extent).
 * - `kind`: `descriptor` (text descriptor file), `sparse` (KDMV extent, descriptor embedded or
 *   absent), `cowd` (standalone ESX sparse extent).
 * - `createType`: from the descriptor (or inferred: `monolithicSparse`/`streamOptimized`).
 * - `descriptor`: parsed descriptor, null when there is none; `header`: the sparse header of
 *   `path` when it is a sparse extent.
 * - `extents`: extents with their files; `capacity_bytes`: virtual size (sum of extents);
 *   `allocated_bytes`: bytes stored (sizes of the distinct files of this layer).
 * - `disk_format`/`source`: how to read it: `raw` at `source.offset` (bytes) for `source.length`
 *   bytes for a single flat extent, else `vmdk` on `path` (qemu's driver).
 * - `backing_chain`: absolute paths of the parents, nearest first.
 * - `adapterType`: `ddb.adapterType` (ide, buslogic, lsilogic, legacyESX, pvscsi) or null.
 * - `warnings`: oddities that do not stop the import.
 */
export interface VmdkInfo {
  path: string
  kind: 'descriptor' | 'sparse' | 'cowd'
  createType: string
  descriptor: VmdkDescriptor | null
  header: VmdkSparseHeader | null
  extents: VmdkExtentInfo[]
  capacity_bytes: number
  allocated_bytes: number
  disk_format: 'raw' | 'vmdk'
  source: { path: string; offset?: number; length?: number }
  backing_chain: string[]
  adapterType: string | null
  warnings: string[]
}

function readFailed(label: string, e: unknown): MigError {
  if (e instanceof MigError) return e
  const reason = e instanceof Error ? e.message : String(e)
  return new MigError('E_MIG_DISK_READ_FAILED', `${label}: cannot read: ${reason}`, { cause: e })
}

async function statOrNull(p: string): Promise<Stats | null> {
  try {
    return currentInputScope()?.remote(p) ? await statPath(p) : (currentInputScope()?.pin(p)?.stats ?? (await stat(p)))
  } catch (e) {
    if (e instanceof MigError && e.code === 'E_MIG_NOT_FOUND') return null
    if (e instanceof MigError) throw e
    const code = (e as NodeJS.ErrnoException).code
    if (code === 'ENOENT' || code === 'ENOTDIR') return null
    throw readFailed(p, e)
  }
}

/**
 * Reads the sparse extent header at byte `offset` of `file` (a tar member's data offset for an
 * OVA). `length` is the extent's length in bytes (default: the rest of the file); it locates the
 * stream-optimized footer (`parseStreamFooter`): when the header says `gdOffset == GD_AT_END`, a
 * complete footer takes precedence over the first header; its absence gives `truncated: true`,
 * as do an overhead or grain directory past the end.
 *
 * Throws `E_MIG_UNSUPPORTED_FORMAT` (no `KDMV`/`COWD` magic, version > 3, unknown compression),
 * `E_MIG_MALFORMED_ARCHIVE` (short header, zero/oversized capacity, grain size not a power of
 * two, bad newline check bytes, grain table size out of 1..512, descriptor past the end),
 * `E_MIG_DISK_READ_FAILED` (unreadable file).
 */
export async function readVmdkSparseHeader(file: string, offset = 0, length?: number): Promise<VmdkSparseHeader> {
  const label = offset ? `${file}@${offset}` : file
  if (!Number.isSafeInteger(offset) || offset < 0) throw malformed(label, 'bad extent offset')
  let extentBytes = length
  if (extentBytes === undefined) {
    const st = await statOrNull(file)
    if (!st) throw readFailed(file, new Error('no such file'))
    extentBytes = Math.max(0, st.size - offset)
  }
  const head = await readFileRange(file, offset, Math.min(2048, extentBytes))
  if (head.length < 4) throw unsupported(label, 'too short to be a VMDK sparse extent')
  const magic = head.toString('latin1', 0, 4)
  if (magic === COWD_MAGIC) return parseCowdHeader(head, label, extentBytes)
  if (magic !== VMDK_SPARSE_MAGIC) throw unsupported(label, 'no KDMV or COWD sparse extent magic')
  if (head.length < SECTOR) throw malformed(label, `sparse extent header truncated (${head.length} of 512 bytes)`)
  const first = parseKdmvHeader(head.subarray(0, SECTOR), label)
  let h = first
  let truncated = false
  let fromFooter = false
  if (first.gdAtEnd) {
    // Footer marker, footer header, end-of-stream marker: the last 3 sectors of the extent.
    const footer = extentBytes >= 4 * SECTOR ? parseStreamFooter(await readFileRange(file, offset + extentBytes - 3 * SECTOR, 3 * SECTOR), label) : null
    if (footer) {
      h = footer
      fromFooter = true
    } else truncated = true
  }
  const endSectors = Math.floor(extentBytes / SECTOR)
  if (!truncated) {
    if (h.overHead > endSectors) truncated = true
    if (h.gdOffset !== null && h.gdOffset > endSectors) truncated = true
  }
  if (h.descriptorOffset > 0 && h.descriptorOffset + Math.min(h.descriptorSize, 1) > endSectors) {
    throw malformed(label, `embedded descriptor at sector ${h.descriptorOffset} is past the end of the extent`)
  }
  return { ...h, gdAtEnd: first.gdAtEnd, fromFooter, truncated, extentBytes }
}

interface ChainState {
  seen: Set<string>
  depth: number
}

/**
 * Inspects the virtual disk whose descriptor or sparse extent is `file` (VMDK 5.0), inside
 * `ctx.importRoot`:
 * - a text descriptor: each extent file is resolved with `resolveInRoot` relative to the
 *   descriptor's folder, must exist, a FLAT/VMFS extent must hold `offset + sectors` sectors,
 *   a SPARSE/VMFSSPARSE extent's header capacity must equal its extent line, and a truncated
 *   sparse extent is refused;
 * - a `KDMV` sparse extent: its header (footer for stream-optimized) and embedded descriptor;
 * - a `COWD` extent: its header.
 * `parentFileNameHint` is followed into `backing_chain` (inside the root, depth cap
 * {@link MAX_CHAIN_DEPTH}, loops
 * refused). A single FLAT/VMFS extent without parent reads as `raw` at the extent's offset;
 * everything else as `vmdk` on `file`.
 *
 * Throws `E_MIG_MALFORMED_ARCHIVE` (missing or short extent: message names the descriptor and
 * the extent file; capacity mismatch; truncated stream; parent loop or chain deeper than {@link MAX_CHAIN_DEPTH};
 * descriptor over 4 MiB), `E_MIG_UNSUPPORTED_FORMAT` (not a VMDK, raw device mappings
 * VMFSRDM/VMFSRAW and device createTypes, unknown versions), `E_MIG_HOST_PATH_REJECTED` (an
 * extent or parent outside the import root), `E_MIG_DISK_READ_FAILED` (unreadable file).
 */
export async function inspectVmdk(file: string, ctx: InspectContext): Promise<VmdkInfo> {
  return inspectLayer(file, ctx, { seen: new Set(), depth: 0 })
}

async function inspectLayer(file: string, ctx: InspectContext, chain: ChainState): Promise<VmdkInfo> {
  const abs = resolveInRoot(ctx.importRoot, file, { allowUploads: ctx.allowUploads })
  if (chain.seen.has(abs)) throw malformed(abs, 'parent chain loops back to this disk')
  chain.seen.add(abs)
  const st = await statOrNull(abs)
  if (!st) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${abs}: disk file does not exist`, { details: { file: abs } })
  if (!st.isFile()) throw unsupported(abs, 'not a regular file')
  const head = await readFileRange(abs, 0, Math.min(st.size, 4096))
  const magic = head.toString('latin1', 0, 4)
  const warnings: string[] = []
  let info: VmdkInfo
  if (magic === VMDK_SPARSE_MAGIC) {
    info = await inspectSparseFile(abs, st, ctx, warnings)
  } else if (magic === COWD_MAGIC) {
    const header = await readVmdkSparseHeader(abs)
    if (header.truncated) throw malformed(abs, 'COWD extent is truncated')
    info = {
      path: abs,
      kind: 'cowd',
      createType: 'vmfsSparse',
      descriptor: null,
      header,
      extents: [
        { access: 'RW', sectors: header.capacity, type: 'VMFSSPARSE', file: path.basename(abs), offset: 0, line: 0, path: abs, fileBytes: st.size, header },
      ],
      capacity_bytes: header.capacity * SECTOR,
      allocated_bytes: st.size,
      disk_format: 'vmdk',
      source: { path: abs },
      backing_chain: [],
      adapterType: null,
      warnings,
    }
    if (header.parentFileName) warnings.push(`${abs}: COWD redo log names parent ${JSON.stringify(header.parentFileName)}, which is not followed`)
  } else {
    if (!looksLikeDescriptor(head)) throw unsupported(abs, 'not a VMDK (no KDMV/COWD magic and not a text descriptor)')
    if (st.size > MAX_DESCRIPTOR_BYTES) throw malformed(abs, `descriptor larger than 4 MiB (${st.size} bytes)`)
    const bytes = await readFileRange(abs, 0, st.size)
    const descriptor = parseVmdkDescriptor(bytes, abs)
    info = await inspectDescriptor(abs, descriptor, ctx, warnings, st.size)
  }
  await followParent(info, ctx, chain)
  return info
}

async function inspectSparseFile(abs: string, st: Stats, ctx: InspectContext, warnings: string[]): Promise<VmdkInfo> {
  const header = await readVmdkSparseHeader(abs)
  let descriptor: VmdkDescriptor | null = null
  if (header.descriptorOffset > 0 && header.descriptorSize > 0) {
    const raw = await readFileRange(abs, header.descriptorOffset * SECTOR, header.descriptorSize * SECTOR)
    const nul = raw.indexOf(0)
    descriptor = parseVmdkDescriptor(nul >= 0 ? raw.subarray(0, nul) : raw, `${abs} (embedded descriptor)`)
  }
  // qemu: a KDMV file with capacity 0 and an embedded descriptor is a descriptor in disguise.
  if (header.capacity === 0) {
    if (!descriptor) throw malformed(abs, 'sparse extent of capacity 0 without a descriptor')
    return inspectDescriptor(abs, descriptor, ctx, warnings, st.size)
  }
  if (header.truncated) {
    throw malformed(
      abs,
      header.gdAtEnd ? 'stream-optimized extent is truncated: no footer/end-of-stream marker' : 'sparse extent is truncated: metadata past the end of the file',
    )
  }
  if (descriptor) {
    const total = descriptor.extents.reduce((a, e) => a + e.sectors, 0)
    if (total !== header.capacity) {
      throw malformed(abs, `embedded descriptor declares ${total} sectors but the header capacity is ${header.capacity}`)
    }
  }
  if (header.uncleanShutdown) warnings.push(`${abs}: sparse extent was not closed cleanly (uncleanShutdown set)`)
  const createType = descriptor?.createType ?? (header.compressedGrains ? 'streamOptimized' : 'monolithicSparse')
  return {
    path: abs,
    kind: 'sparse',
    createType,
    descriptor,
    header,
    extents: [
      {
        access: descriptor?.extents[0]?.access ?? 'RW',
        sectors: header.capacity,
        type: 'SPARSE',
        file: path.basename(abs),
        offset: 0,
        line: descriptor?.extents[0]?.line ?? 0,
        path: abs,
        fileBytes: st.size,
        header,
      },
    ],
    capacity_bytes: header.capacity * SECTOR,
    allocated_bytes: st.size,
    disk_format: 'vmdk',
    source: { path: abs },
    backing_chain: [],
    adapterType: descriptor?.adapterType ?? null,
    warnings,
  }
}

async function inspectDescriptor(abs: string, d: VmdkDescriptor, ctx: InspectContext, warnings: string[], descriptorBytes: number): Promise<VmdkInfo> {
  if (DEVICE_CREATE_TYPES.has(d.createType))
    throw unsupported(abs, `createType ${d.createType} maps a host device (raw device mapping), which cannot be imported`)
  const base = path.dirname(abs)
  const extents: VmdkExtentInfo[] = []
  const sizes = new Map<string, number>()
  let capacity = 0
  for (const e of d.extents) {
    const where = `extent line ${e.line}`
    if (e.type === 'VMFSRDM' || e.type === 'VMFSRAW') {
      throw unsupported(abs, `${where}: ${e.type} extent ${JSON.stringify(e.file)} is a raw device mapping, which cannot be imported`)
    }
    if (e.access === 'NOACCESS') warnings.push(`${abs}: ${where} is NOACCESS; it reads as zeros`)
    capacity += e.sectors
    if (capacity > MAX_CAPACITY_SECTORS) throw malformed(abs, 'extents add up to more than 64 TiB')
    if (e.type === 'ZERO') {
      extents.push({ ...e, path: null, fileBytes: null, header: null })
      continue
    }
    const extPath = resolveInRoot(ctx.importRoot, e.file as string, { base, allowUploads: ctx.allowUploads })
    const st = await statOrNull(extPath)
    if (!st) {
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${abs}: extent file ${JSON.stringify(e.file)} does not exist`, {
        details: { descriptor: abs, extent: e.file },
      })
    }
    if (!st.isFile()) throw malformed(abs, `extent file ${JSON.stringify(e.file)} is not a regular file`, { descriptor: abs, extent: e.file })
    sizes.set(extPath, st.size)
    let header: VmdkSparseHeader | null = null
    if (e.type === 'FLAT' || e.type === 'VMFS') {
      const need = (e.offset + e.sectors) * SECTOR
      if (st.size < need) {
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${abs}: flat extent ${JSON.stringify(e.file)} holds ${st.size} bytes, the descriptor needs ${need}`, {
          details: { descriptor: abs, extent: e.file },
        })
      }
    } else if (e.type === 'SESPARSE') {
      const h = await readFileRange(extPath, 0, SECTOR)
      if (!isSeSparse(h)) throw malformed(abs, `extent ${JSON.stringify(e.file)} is not a seSparse extent`)
      const cap = parseSeSparseHeader(h, extPath).capacity
      if (cap !== e.sectors) throw malformed(abs, `seSparse extent ${JSON.stringify(e.file)} capacity ${cap} sectors, extent line says ${e.sectors}`)
    } else {
      header = await readVmdkSparseHeader(extPath)
      if (header.capacity !== e.sectors) {
        throw malformed(abs, `sparse extent ${JSON.stringify(e.file)} header capacity ${header.capacity} sectors, extent line says ${e.sectors}`, {
          descriptor: abs,
          extent: e.file,
        })
      }
      if (header.truncated) throw malformed(abs, `sparse extent ${JSON.stringify(e.file)} is truncated`, { descriptor: abs, extent: e.file })
    }
    extents.push({ ...e, path: extPath, fileBytes: st.size, header })
  }
  let allocated = descriptorBytes
  for (const [p, s] of sizes) if (p !== abs) allocated += s
  const single = extents.length === 1 ? extents[0] : null
  const flat = single && (single.type === 'FLAT' || single.type === 'VMFS') && !d.parentFileNameHint && single.path
  if (!flat && !QEMU_DESCRIPTOR_CREATE_TYPES.has(d.createType)) {
    warnings.push(
      `${abs}: createType ${d.createType} in a descriptor file is not opened by qemu's vmdk driver (it takes ${[...QEMU_DESCRIPTOR_CREATE_TYPES].join(', ')})`,
    )
  }
  if (!flat && extents.some((e) => e.access !== 'RW' && e.type !== 'ZERO')) {
    warnings.push(`${abs}: descriptor has non-RW extents; qemu's vmdk driver reads only RW extents of a descriptor file`)
  }
  return {
    path: abs,
    kind: 'descriptor',
    createType: d.createType,
    descriptor: d,
    header: null,
    extents,
    capacity_bytes: capacity * SECTOR,
    allocated_bytes: flat ? (single.fileBytes as number) : allocated,
    disk_format: flat ? 'raw' : 'vmdk',
    source: flat ? { path: single.path as string, offset: single.offset * SECTOR, length: single.sectors * SECTOR } : { path: abs },
    backing_chain: [],
    adapterType: d.adapterType,
    warnings,
  }
}

async function followParent(info: VmdkInfo, ctx: InspectContext, chain: ChainState): Promise<void> {
  const d = info.descriptor
  const hint = d?.parentFileNameHint
  if (!d || !hint) return
  if (chain.depth + 1 > MAX_CHAIN_DEPTH) throw malformed(info.path, `parent chain deeper than ${MAX_CHAIN_DEPTH}`)
  const parentPath = resolveInRoot(ctx.importRoot, hint, { base: path.dirname(info.path), allowUploads: ctx.allowUploads })
  if (!(await statOrNull(parentPath))) {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${info.path}: parent disk ${JSON.stringify(hint)} (parentFileNameHint) does not exist`, {
      details: { descriptor: info.path, parent: hint },
    })
  }
  const parent = await inspectLayer(parentPath, ctx, { seen: chain.seen, depth: chain.depth + 1 })
  if (parent.capacity_bytes !== info.capacity_bytes) {
    info.warnings.push(`${info.path}: parent ${JSON.stringify(hint)} is ${parent.capacity_bytes} bytes, this disk ${info.capacity_bytes}`)
  }
  const pcid = parent.descriptor?.CID
  if (d.parentCID && pcid && d.parentCID !== pcid) {
    info.warnings.push(`${info.path}: parentCID ${d.parentCID} does not match the parent's CID ${pcid} (parent modified after the snapshot?)`)
  }
  info.backing_chain = [parent.path, ...parent.backing_chain]
  info.warnings.push(...parent.warnings)
}

/**
 * Bus of `ddb.adapterType` (VMDK 5.0 "The Disk Database"): `ide` -> ide; `buslogic`,
 * `lsilogic`, `legacyESX`, `lsisas1068`, `pvscsi` -> scsi; anything else or null -> unknown.
 */
export function busOfAdapterType(adapterType: string | null | undefined): ControllerBus {
  const a = (adapterType ?? '').toLowerCase()
  if (a === 'ide') return 'ide'
  if (['buslogic', 'lsilogic', 'legacyesx', 'lsisas1068', 'pvscsi'].includes(a)) return 'scsi'
  return 'unknown'
}

/** The {@link ManifestDisk} of an inspected VMDK (`capacity_bytes`, format, source, chain). */
export function manifestDiskOf(info: VmdkInfo, label: string, controller: ControllerBus, address: string): ManifestDisk {
  return {
    label,
    capacity_bytes: info.capacity_bytes,
    allocated_bytes: info.allocated_bytes,
    disk_format: info.disk_format,
    source: { ...info.source },
    controller,
    address,
    ...(info.backing_chain.length ? { backing_chain: [...info.backing_chain] } : {}),
  }
}
