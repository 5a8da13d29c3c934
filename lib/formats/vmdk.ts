/**
 * VMDK reader: sparse extent headers, text descriptors, and the inspection of a whole virtual
 * disk (descriptor + extents + parent chain), reading only headers and descriptors.
 *
 * Sources: "VMware Virtual Disk Format 5.0" (sections "Hosted Sparse Extent Header",
 * "ESX Server Sparse Extent Header", "The Descriptor File", "Stream-Optimized Compressed Sparse
 * Extents"), and qemu `block/vmdk.c` (footer handling of `gdOffset == GD_AT_END`, the accepted
 * header bounds). All offsets and sizes named `*Sectors`/`sectors` are 512-byte sectors;
 * every `*_bytes`/`*Bytes` is bytes.
 */
import { stat } from 'node:fs/promises'
import type { Stats } from 'node:fs'
import * as path from 'node:path'
import { u64le } from '../bytes.ts'
import { MigError } from '../errors.ts'
import { malformed, readFileRange } from './io.ts'
import { currentInputScope, resolveInRoot } from '../hostpath.ts'
import type { ControllerBus, ManifestDisk } from '../manifest.ts'
import type { InspectContext } from '../contracts/inspect.ts'

/** Bytes per VMDK sector. */
export const SECTOR = 512
/** Largest text descriptor (file or embedded) read: 4 MiB. */
export const MAX_DESCRIPTOR_BYTES = 4 * 1024 * 1024
/** Largest capacity accepted from a header or descriptor: 2^37 sectors (64 TiB). */
export const MAX_CAPACITY_SECTORS = 2 ** 37
/** Most extent lines accepted in one descriptor (a 62 TiB twoGbMaxExtent disk has ~32k). */
export const MAX_EXTENTS = 32768
/** Deepest parent chain followed (`parentFileNameHint`). */
export const MAX_CHAIN_DEPTH = 16

const GD_AT_END = 0xffffffffffffffffn
const FLAG_NL_DETECT = 1 << 0
const FLAG_RGD = 1 << 1
const FLAG_ZERO_GRAIN = 1 << 2
const FLAG_COMPRESSED = 1 << 16
const FLAG_MARKERS = 1 << 17
const MARKER_EOS = 0
const MARKER_FOOTER = 3
const SESPARSE_MAGIC = 0xcafebaben

/**
 * A sparse extent header.
 *
 * `magic: 'KDMV'` is the hosted sparse extent header (VMDK 5.0 "SparseExtentHeader", versions
 * 1..3, 512 bytes); `magic: 'COWD'` is the ESX Server sparse extent header ("COWDisk_Header",
 * 2048 bytes), whose fields are mapped onto the same names (`numSectors` -> `capacity`,
 * `numGDEntries` -> `gdEntries`, `freeSector` -> `freeSector`).
 *
 * Fields (sectors unless stated):
 * - `version`, `flags` (raw bit field) and the flag bits decoded: `newlineDetect` (bit 0),
 *   `redundantGrainTable` (bit 1), `zeroedGrainTableEntries` (bit 2), `compressedGrains` (bit 16),
 *   `markers` (bit 17).
 * - `capacity`: virtual size of the extent; `grainSize`: grain size.
 * - `descriptorOffset`/`descriptorSize`: embedded descriptor (0 when none).
 * - `numGTEsPerGT`: grain table entries per grain table (512 by the spec).
 * - `rgdOffset`, `gdOffset`: redundant and primary grain directory; `gdAtEnd` is true when the
 *   first header says `GD_AT_END` (0xffffffffffffffff): the values then come from the footer
 *   (`fromFooter`) when it is present.
 * - `overHead`: sectors of metadata before the first grain.
 * - `uncleanShutdown`; `compressAlgorithm`: 0 none, 1 deflate.
 * - `truncated`: the extent ends before metadata it declares (no footer/end-of-stream marker for
 *   `GD_AT_END`, grain directory or overhead past the end).
 * - `extentBytes`: length of the extent that was examined.
 * - `parentFileName`: COWD child (redo log) parent name, else null.
 */
export interface VmdkSparseHeader {
  magic: 'KDMV' | 'COWD'
  version: number
  flags: number
  newlineDetect: boolean
  redundantGrainTable: boolean
  zeroedGrainTableEntries: boolean
  compressedGrains: boolean
  markers: boolean
  capacity: number
  grainSize: number
  descriptorOffset: number
  descriptorSize: number
  numGTEsPerGT: number
  rgdOffset: number
  gdOffset: number | null
  gdAtEnd: boolean
  fromFooter: boolean
  overHead: number
  uncleanShutdown: boolean
  compressAlgorithm: number
  gdEntries: number
  freeSector: number
  truncated: boolean
  extentBytes: number
  parentFileName: string | null
}

/** Extent access of a descriptor extent line. */
export type VmdkAccess = 'RW' | 'RDONLY' | 'NOACCESS'
/** Extent types of VMDK 5.0 "Extent Descriptions". */
export const EXTENT_TYPES = ['FLAT', 'SPARSE', 'ZERO', 'VMFS', 'VMFSSPARSE', 'VMFSRDM', 'VMFSRAW', 'SESPARSE'] as const
export type VmdkExtentType = (typeof EXTENT_TYPES)[number]

/** `createType` values of VMDK 5.0 "Header" plus the later `seSparse`. */
export const CREATE_TYPES = [
  'monolithicSparse',
  'monolithicFlat',
  'twoGbMaxExtentSparse',
  'twoGbMaxExtentFlat',
  'vmfs',
  'vmfsSparse',
  'vmfsThin',
  'vmfsPreallocated',
  'vmfsEagerZeroedThick',
  'vmfsRaw',
  'vmfsRawDeviceMap',
  'vmfsPassthroughRawDeviceMap',
  'streamOptimized',
  'seSparse',
  'custom',
  'fullDevice',
  'partitionedDevice',
] as const

/** createTypes qemu's vmdk driver accepts in a descriptor file (`vmdk_open_desc_file`). */
const QEMU_DESCRIPTOR_CREATE_TYPES = new Set(['monolithicFlat', 'vmfs', 'vmfsSparse', 'seSparse', 'twoGbMaxExtentSparse', 'twoGbMaxExtentFlat'])

/** createTypes that map a host device rather than files: refused. */
const DEVICE_CREATE_TYPES = new Set(['vmfsRaw', 'vmfsRawDeviceMap', 'vmfsPassthroughRawDeviceMap', 'fullDevice', 'partitionedDevice'])

/**
 * One extent line: `access sectors type ["file" [offset]]`.
 * - `sectors`: extent size; `offset`: start of the extent inside a FLAT file, in sectors (0 when
 *   absent); `file`: the file name as written (null for ZERO); `line`: 1-based line number.
 */
export interface VmdkExtentLine {
  access: VmdkAccess
  sectors: number
  type: VmdkExtentType
  file: string | null
  offset: number
  line: number
}

/**
 * A parsed descriptor (VMDK 5.0 "The Descriptor File").
 * - `version` (1..3), `encoding`, `CID`/`parentCID` (lower-case 8-digit hex; parentCID
 *   `ffffffff` = no parent), `createType`, `parentFileNameHint` (null when absent).
 * - `extents`: extent lines in order.
 * - `ddb`: the disk database (`ddb.` keys without the prefix; null-prototype map), with the
 *   common ones decoded: `adapterType`, `virtualHWVersion`, `uuid`, `geometry` (C/H/S).
 */
export interface VmdkDescriptor {
  version: number
  encoding: string | null
  CID: string | null
  parentCID: string | null
  createType: string
  parentFileNameHint: string | null
  extents: VmdkExtentLine[]
  ddb: Record<string, string>
  adapterType: string | null
  virtualHWVersion: string | null
  uuid: string | null
  geometry: { cylinders: number; heads: number; sectors: number } | null
}

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

// ---------------------------------------------------------------------------------------------
// Low-level reads

function unsupported(label: string, reason: string): MigError {
  return new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: ${reason}`)
}

function readFailed(label: string, e: unknown): MigError {
  if (e instanceof MigError) return e
  const reason = e instanceof Error ? e.message : String(e)
  return new MigError('E_MIG_DISK_READ_FAILED', `${label}: cannot read: ${reason}`, { cause: e })
}

async function statOrNull(p: string): Promise<Stats | null> {
  try {
    return currentInputScope()?.pin(p)?.stats ?? (await stat(p))
  } catch (e) {
    if (e instanceof MigError && e.code === 'E_MIG_NOT_FOUND') return null
    if (e instanceof MigError) throw e
    const code = (e as NodeJS.ErrnoException).code
    if (code === 'ENOENT' || code === 'ENOTDIR') return null
    throw readFailed(p, e)
  }
}

// ---------------------------------------------------------------------------------------------
// Sparse headers

/**
 * Reads the sparse extent header at byte `offset` of `file` (a tar member's data offset for an
 * OVA). `length` is the extent's length in bytes (default: the rest of the file); it locates the
 * stream-optimized footer: when the header says `gdOffset == GD_AT_END`, the footer marker, the
 * footer (a copy of the header with the real `gdOffset`) and the end-of-stream marker are the
 * last three sectors of the extent (the footer sits 1024 bytes before the end, VMDK 5.0
 * "Stream-Optimized Compressed Sparse Extents"; qemu reads it the same way). A complete footer
 * takes precedence over the first header; its absence gives `truncated: true`.
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
  if (magic === 'COWD') return parseCowd(head, label, extentBytes)
  if (magic !== 'KDMV') throw unsupported(label, 'no KDMV or COWD sparse extent magic')
  if (head.length < SECTOR) throw malformed(label, `sparse extent header truncated (${head.length} of 512 bytes)`)
  const first = parseKdmv(head, label)
  let h = first
  let truncated = false
  let fromFooter = false
  if (first.gdAtEnd) {
    // Footer marker, footer header, end-of-stream marker: the last 3 sectors of the extent.
    if (extentBytes >= 4 * SECTOR) {
      const tail = await readFileRange(file, offset + extentBytes - 3 * SECTOR, 3 * SECTOR)
      const ok =
        tail.length === 3 * SECTOR &&
        tail.readUInt32LE(8) === 0 &&
        tail.readUInt32LE(12) === MARKER_FOOTER &&
        tail.toString('latin1', SECTOR, SECTOR + 4) === 'KDMV' &&
        tail.readBigUInt64LE(2 * SECTOR) === 0n &&
        tail.readUInt32LE(2 * SECTOR + 8) === 0 &&
        tail.readUInt32LE(2 * SECTOR + 12) === MARKER_EOS
      if (ok) {
        const footer = parseKdmv(tail.subarray(SECTOR, 2 * SECTOR), `${label} footer`)
        if (footer.gdAtEnd) throw malformed(label, 'footer grain directory offset is GD_AT_END too')
        h = footer
        fromFooter = true
      } else truncated = true
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

function parseKdmv(b: Buffer, label: string): VmdkSparseHeader {
  const version = b.readUInt32LE(4)
  if (version === 0) throw malformed(label, 'sparse header version 0')
  if (version > 3) throw unsupported(label, `sparse header version ${version} (1..3 supported)`)
  const flags = b.readUInt32LE(8)
  const capacity = u64le(b, 12)
  const grainSize = u64le(b, 20)
  const descriptorOffset = u64le(b, 28)
  const descriptorSize = u64le(b, 36)
  const numGTEsPerGT = b.readUInt32LE(44)
  const rgdOffset = u64le(b, 48)
  const gdRaw = b.readBigUInt64LE(56)
  const overHead = u64le(b, 64)
  const uncleanShutdown = b[72] !== 0
  const compressAlgorithm = b.readUInt16LE(77)
  if (capacity === null || capacity > MAX_CAPACITY_SECTORS) throw malformed(label, 'capacity larger than 64 TiB')
  if (grainSize === null || grainSize < 1 || grainSize > 0x200000 || (grainSize & (grainSize - 1)) !== 0) {
    throw malformed(label, `grain size ${b.readBigUInt64LE(20)} sectors is not a power of two up to 1 GiB`)
  }
  if (descriptorOffset === null || descriptorSize === null) throw malformed(label, 'descriptor offset/size out of range')
  if (descriptorSize * SECTOR > MAX_DESCRIPTOR_BYTES) throw malformed(label, `embedded descriptor of ${descriptorSize} sectors exceeds 4 MiB`)
  if (numGTEsPerGT < 1 || numGTEsPerGT > 512) throw malformed(label, `numGTEsPerGT ${numGTEsPerGT} out of 1..512`)
  if (rgdOffset === null || overHead === null) throw malformed(label, 'grain directory or overhead offset out of range')
  const gdAtEnd = gdRaw === GD_AT_END
  if (!gdAtEnd && gdRaw > BigInt(Number.MAX_SAFE_INTEGER)) throw malformed(label, 'grain directory offset out of range')
  if (flags & FLAG_NL_DETECT) {
    if (b[73] !== 0x0a || b[74] !== 0x20 || b[75] !== 0x0d || b[76] !== 0x0a) {
      throw malformed(label, 'newline check bytes corrupted (file transferred in text mode?)')
    }
  }
  if (compressAlgorithm > 1) throw unsupported(label, `compression algorithm ${compressAlgorithm} (0 none, 1 deflate)`)
  return {
    magic: 'KDMV',
    version,
    flags,
    newlineDetect: (flags & FLAG_NL_DETECT) !== 0,
    redundantGrainTable: (flags & FLAG_RGD) !== 0,
    zeroedGrainTableEntries: (flags & FLAG_ZERO_GRAIN) !== 0,
    compressedGrains: (flags & FLAG_COMPRESSED) !== 0,
    markers: (flags & FLAG_MARKERS) !== 0,
    capacity,
    grainSize,
    descriptorOffset,
    descriptorSize,
    numGTEsPerGT,
    rgdOffset,
    gdOffset: gdAtEnd ? null : Number(gdRaw),
    gdAtEnd,
    fromFooter: false,
    overHead,
    uncleanShutdown,
    compressAlgorithm,
    gdEntries: capacity === 0 ? 0 : Math.ceil(capacity / (grainSize * numGTEsPerGT)),
    freeSector: 0,
    truncated: false,
    extentBytes: 0,
    parentFileName: null,
  }
}

/**
 * COWDisk_Header (VMDK 5.0 "ESX Server Sparse Extent Header"), 2048 bytes LE: magic, version,
 * flags, numSectors, grainSize, gdOffset, numGDEntries, freeSector (offsets 0..28), the
 * root/child union at 32 (1028 bytes), generation 1060, name 1064, description 1124,
 * savedGeneration 1636, reserved 1640, uncleanShutdown 1648.
 */
function parseCowd(b: Buffer, label: string, extentBytes: number): VmdkSparseHeader {
  if (b.length < 2048) throw malformed(label, `COWD header truncated (${b.length} of 2048 bytes)`)
  const version = b.readUInt32LE(4)
  const flags = b.readUInt32LE(8)
  const capacity = b.readUInt32LE(12)
  const grainSize = b.readUInt32LE(16)
  const gdOffset = b.readUInt32LE(20)
  const gdEntries = b.readUInt32LE(24)
  const freeSector = b.readUInt32LE(28)
  if (version !== 1) throw unsupported(label, `COWD header version ${version} (1 supported)`)
  if (grainSize < 1 || grainSize > 0x200000 || (grainSize & (grainSize - 1)) !== 0) throw malformed(label, `COWD grain size ${grainSize} is not a power of two`)
  // The union: root {cylinders, heads, sectors} or child {parentFileName[1024], parentGeneration}.
  // A child (redo log) has a NUL-terminated parent name there; a root starts with small numbers.
  let parentFileName: string | null = null
  const nameBytes = b.subarray(32, 32 + 1024)
  const nul = nameBytes.indexOf(0)
  if (nul > 4) {
    const s = nameBytes.toString('utf8', 0, nul)
    if (/^[\x20-\x7e\u00a0-\uffff]+$/.test(s)) parentFileName = s
  }
  const endSectors = Math.floor(extentBytes / SECTOR)
  const truncated = gdOffset > endSectors || freeSector > endSectors + 1
  return {
    magic: 'COWD',
    version,
    flags,
    newlineDetect: false,
    redundantGrainTable: false,
    zeroedGrainTableEntries: false,
    compressedGrains: false,
    markers: false,
    capacity,
    grainSize,
    descriptorOffset: 0,
    descriptorSize: 0,
    numGTEsPerGT: 4096,
    rgdOffset: 0,
    gdOffset,
    gdAtEnd: false,
    fromFooter: false,
    overHead: 4,
    uncleanShutdown: b.readUInt32LE(1648) !== 0,
    compressAlgorithm: 0,
    gdEntries,
    freeSector,
    truncated,
    extentBytes,
    parentFileName,
  }
}

// ---------------------------------------------------------------------------------------------
// Descriptor text

/**
 * Decodes descriptor/config bytes: UTF-8 unless an `encoding="..."` line names another charset
 * the runtime's TextDecoder knows (windows-1252, Shift_JIS, GBK, ...); unknown charsets fall back
 * to latin1. A UTF-8 BOM is dropped.
 */
export function decodeText(bytes: Uint8Array, encodingKey = 'encoding'): string {
  let text = new TextDecoder('utf-8').decode(bytes)
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1)
  const re = new RegExp(`^\\s*${encodingKey.replace(/\./g, '\\.')}\\s*=\\s*"?([A-Za-z0-9_.:-]{1,40})"?\\s*$`, 'im')
  const m = re.exec(text.slice(0, 65536))
  if (m) {
    const enc = m[1].toLowerCase()
    if (enc !== 'utf-8' && enc !== 'utf8') {
      try {
        return new TextDecoder(enc).decode(bytes)
      } catch {
        return Buffer.from(bytes).toString('latin1')
      }
    }
  }
  return text
}

function positiveInt(s: string): number | null {
  if (!/^\d{1,15}$/.test(s)) return null
  return Number(s)
}

/**
 * Parses a VMDK text descriptor (VMDK 5.0 "The Descriptor File": header `key=value` lines,
 * extent lines `RW|RDONLY|NOACCESS <sectors> <type> ["<file>" [<offset>]]`, and the `ddb.*`
 * disk database). `input` is the text or its bytes (decoded per its `encoding` line); `label`
 * names it in errors. Comments (`#`) and blank lines are skipped; CRLF is accepted.
 *
 * Throws `E_MIG_MALFORMED_ARCHIVE` (larger than 4 MiB, NUL bytes before the trailing padding, a line that is neither
 * `key = value` nor an extent line, bad sector count/offset, missing `createType`, no extent,
 * a non-hex CID, more than {@link MAX_EXTENTS} extents) and `E_MIG_UNSUPPORTED_FORMAT` (version
 * outside 1..3, unknown `createType`, unknown extent type).
 */
export function parseVmdkDescriptor(input: string | Uint8Array, label: string): VmdkDescriptor {
  const size = typeof input === 'string' ? input.length : input.byteLength
  if (size > MAX_DESCRIPTOR_BYTES) throw malformed(label, `descriptor larger than 4 MiB (${size} bytes)`)
  // A descriptor may be NUL-padded to a sector boundary (as embedded descriptors are, and as
  // qemu-img writes some stand-alone ones): the padding ends the text; a NUL inside it is an error.
  const text = (typeof input === 'string' ? input : decodeText(input)).replace(/\0+$/, '')
  if (text.includes('\0')) throw malformed(label, 'descriptor contains NUL bytes')
  const fields: Map<string, string> = new Map()
  const ddb: Record<string, string> = Object.create(null)
  const extents: VmdkExtentLine[] = []
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].replace(/\r$/, '').trim()
    if (line === '' || line.startsWith('#')) continue
    const lineNo = i + 1
    const ext = /^(RW|RDONLY|NOACCESS)\s+(\S+)\s+(\S+)(.*)$/.exec(line)
    if (ext) {
      if (extents.length >= MAX_EXTENTS) throw malformed(label, `more than ${MAX_EXTENTS} extents`)
      extents.push(parseExtentLine(ext, label, lineNo))
      continue
    }
    const kv = /^([A-Za-z][A-Za-z0-9_.:-]*)\s*=\s*(.*)$/.exec(line)
    if (!kv) throw malformed(label, `line ${lineNo}: neither "key = value" nor an extent line`)
    let value = kv[2].trim()
    if (value.startsWith('"')) {
      const end = value.indexOf('"', 1)
      if (end < 0) throw malformed(label, `line ${lineNo}: unterminated quoted value`)
      value = value.slice(1, end)
    }
    const key = kv[1]
    if (/^ddb\./i.test(key)) ddb[key.slice(4)] = value
    else fields.set(key.toLowerCase(), value)
  }
  const versionText = fields.get('version')
  const version = versionText === undefined ? 1 : positiveInt(versionText)
  if (version === null || version < 1 || version > 3) throw unsupported(label, `descriptor version ${JSON.stringify(versionText)} (1..3 supported)`)
  const createType = fields.get('createtype')
  if (!createType) throw malformed(label, 'descriptor has no createType')
  const known = CREATE_TYPES.find((t) => t.toLowerCase() === createType.toLowerCase())
  if (!known) throw unsupported(label, `unknown createType ${JSON.stringify(createType)}`)
  if (extents.length === 0) throw malformed(label, 'descriptor lists no extent')
  const cid = (k: string): string | null => {
    const v = fields.get(k)
    if (v === undefined) return null
    if (!/^[0-9a-fA-F]{1,8}$/.test(v)) throw malformed(label, `${k === 'cid' ? 'CID' : 'parentCID'} ${JSON.stringify(v)} is not 32-bit hex`)
    return v.toLowerCase().padStart(8, '0')
  }
  const num = (k: string): number | null => {
    const v = ddb[k]
    return v === undefined ? null : positiveInt(v)
  }
  const cyl = num('geometry.cylinders')
  const heads = num('geometry.heads')
  const secs = num('geometry.sectors')
  const hint = fields.get('parentfilenamehint')
  return {
    version,
    encoding: fields.get('encoding') ?? null,
    CID: cid('cid'),
    parentCID: cid('parentcid'),
    createType: known,
    parentFileNameHint: hint === undefined || hint === '' ? null : hint,
    extents,
    ddb,
    adapterType: ddb['adapterType'] ?? null,
    virtualHWVersion: ddb['virtualHWVersion'] ?? null,
    uuid: ddb['uuid'] ?? null,
    geometry: cyl !== null && heads !== null && secs !== null ? { cylinders: cyl, heads, sectors: secs } : null,
  }
}

function parseExtentLine(m: RegExpExecArray, label: string, lineNo: number): VmdkExtentLine {
  const where = `line ${lineNo}`
  const access = m[1] as VmdkAccess
  const sectors = positiveInt(m[2])
  if (sectors === null || sectors === 0 || sectors > MAX_CAPACITY_SECTORS) throw malformed(label, `${where}: bad extent size ${JSON.stringify(m[2])} sectors`)
  const type = EXTENT_TYPES.find((t) => t === m[3].toUpperCase())
  if (!type) throw unsupported(label, `${where}: unknown extent type ${JSON.stringify(m[3])}`)
  let rest = m[4].trim()
  let file: string | null = null
  if (rest.startsWith('"')) {
    const end = rest.indexOf('"', 1)
    if (end < 0) throw malformed(label, `${where}: unterminated extent file name`)
    file = rest.slice(1, end)
    rest = rest.slice(end + 1).trim()
  }
  let offset = 0
  const device = type === 'VMFSRDM' || type === 'VMFSRAW'
  if (rest !== '' && !device) {
    const parts = rest.split(/\s+/)
    const o = positiveInt(parts[0])
    if (o === null || parts.length > 1) throw malformed(label, `${where}: bad extent offset ${JSON.stringify(rest)}`)
    if (type !== 'FLAT') throw malformed(label, `${where}: only FLAT extents take an offset`)
    offset = o
  }
  if (type === 'ZERO') {
    if (file !== null) throw malformed(label, `${where}: a ZERO extent names no file`)
  } else if (file === null || file === '') {
    throw malformed(label, `${where}: ${type} extent without a file name`)
  }
  return { access, sectors, type, file, offset, line: lineNo }
}

// ---------------------------------------------------------------------------------------------
// Inspection

/** Reads the first bytes of a file to tell a sparse extent from a text descriptor. */
function looksLikeDescriptor(head: Buffer): boolean {
  const s = head.toString('latin1', 0, Math.min(head.length, 4096))
  if (/^\s*#\s*Disk DescriptorFile/i.test(s)) return true
  // qemu's probe: comment and blank lines, then `version=N`.
  for (const raw of s.split('\n')) {
    const line = raw.replace(/\r$/, '').trim()
    if (line === '' || line.startsWith('#')) continue
    return /^version\s*=\s*\d/.test(line)
  }
  return false
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
 * `parentFileNameHint` is followed into `backing_chain` (inside the root, depth cap 16, loops
 * refused). A single FLAT/VMFS extent without parent reads as `raw` at the extent's offset;
 * everything else as `vmdk` on `file`.
 *
 * Throws `E_MIG_MALFORMED_ARCHIVE` (missing or short extent: message names the descriptor and
 * the extent file; capacity mismatch; truncated stream; parent loop or chain deeper than 16;
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
  if (magic === 'KDMV') {
    info = await inspectSparseFile(abs, st, ctx, warnings)
  } else if (magic === 'COWD') {
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
      const h = await readFileRange(extPath, 0, 24)
      if (h.length < 24 || h.readBigUInt64LE(0) !== SESPARSE_MAGIC) throw malformed(abs, `extent ${JSON.stringify(e.file)} is not a seSparse extent`)
      const cap = u64le(h, 16)
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
