/**
 * The VMDK text descriptor (VMware "Virtual Disk Format 1.1"/5.0, "The Descriptor File"): header
 * `key=value` lines (`version`, `encoding`, `CID`, `parentCID`, `createType`,
 * `parentFileNameHint`), extent lines `RW|RDONLY|NOACCESS <sectors> <type> ["<file>" [<offset>]]`
 * and the `ddb.*` disk database. Pure: text or bytes in, a {@link VmdkDescriptor} out.
 */
import { MAX_CAPACITY_SECTORS, MAX_DESCRIPTOR_BYTES, MAX_EXTENTS } from './limits.ts'
import { malformed, unsupported } from './faults.ts'

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
export const QEMU_DESCRIPTOR_CREATE_TYPES = new Set(['monolithicFlat', 'vmfs', 'vmfsSparse', 'seSparse', 'twoGbMaxExtentSparse', 'twoGbMaxExtentFlat'])

/** createTypes that map a host device rather than files: refused. */
export const DEVICE_CREATE_TYPES = new Set(['vmfsRaw', 'vmfsRawDeviceMap', 'vmfsPassthroughRawDeviceMap', 'fullDevice', 'partitionedDevice'])

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
 * The text ends at its first NUL byte (qemu's reading; see the body). Throws
 * `E_MIG_MALFORMED_ARCHIVE` (larger than 4 MiB, a line that is neither
 * `key = value` nor an extent line, bad sector count/offset, missing `createType`, no extent,
 * a non-hex CID, more than {@link MAX_EXTENTS} extents) and `E_MIG_UNSUPPORTED_FORMAT` (version
 * outside 1..3, unknown `createType`, unknown extent type).
 */
export function parseVmdkDescriptor(input: string | Uint8Array, label: string): VmdkDescriptor {
  const size = typeof input === 'string' ? input.length : input.byteLength
  if (size > MAX_DESCRIPTOR_BYTES) throw malformed(label, `descriptor larger than 4 MiB (${size} bytes)`)
  // The text ends at its first NUL, as qemu reads it (a C string): embedded descriptors and some
  // stand-alone ones are NUL-padded to a sector, and when qemu rewrites the CID shorter
  // (`vmdk_write_cid` writes back its whole descriptor buffer) the old text's last bytes stay
  // behind the new NUL (`…"\n\0\n\0\0…`). What follows the NUL is not part of the descriptor.
  const decoded = typeof input === 'string' ? input : decodeText(input)
  const nul = decoded.indexOf('\0')
  const text = nul < 0 ? decoded : decoded.slice(0, nul)
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

/**
 * Whether the first bytes of a file look like a text descriptor: `# Disk DescriptorFile`, or (as
 * qemu probes) comment and blank lines followed by `version=N`.
 */
export function looksLikeDescriptor(head: Buffer): boolean {
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

/** The parent CID of a descriptor, or null when it has none (absent or `ffffffff`). */
export function parentCidOf(d: VmdkDescriptor): string | null {
  return d.parentCID && d.parentCID !== 'ffffffff' ? d.parentCID : null
}
