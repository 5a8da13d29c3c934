/**
 * HyperVStorage container parser: the binary object store of Hyper-V's virtual machine
 * configuration (`.vmcx`) and runtime state (`.vmrs`) files. Bytes in, key tree out (headers,
 * replay log, object tables, key tables, typed values); what the keys mean for a VM is
 * `vmcx.ts`'s job.
 *
 * Microsoft does not publish the format (it is written by `VmDataStore.dll`, "HyperVStorage").
 * The structure followed here is the one documented by fox-it's `dissect.hypervisor`
 * (`descriptor/hyperv.py`, `descriptor/c_hyperv.py`), cross-checked byte by byte against a real
 * file; the checksum algorithm (not named there) was established on that file: every checksum is
 * the standard CRC-32 (ISO-HDLC, as zlib's `crc32`) of the structure with its checksum field zeroed.
 * All integers are little-endian and structures are packed.
 *
 * Layout (offsets in bytes):
 * - Two **storage headers** at 0x0000 and 0x1000, 46 bytes each: signature `0x01282014`, CRC-32,
 *   u16 sequence number, u32 format version (only `0x400` is known), u64 unknown, u32 data
 *   alignment (<= 0x10000), u64 replay log offset, u64 replay log size, u32 header size. The valid
 *   header with the higher sequence number is current.
 * - A **replay log** at the header's offset: signature `0x01110003`, CRC-32 of its 34-byte
 *   header, u32 number of outstanding entries (a non-zero count means a journal not yet replayed).
 * - The **object table** at 0x2000: signature `0x01110001`, u32 entry count, then 18-byte entries
 *   (u8 type, CRC-32, u64 offset, u32 size, u8 allocated). Types: 1 object table, 2 key table,
 *   3 file object (large values), 4 free, 6 replay log, 7 change tracking buffer.
 * - **Key tables**: a 10-byte header (u16 signature `0x0002`, u16 table index, u16 sequence
 *   number, CRC-32), then entries until one of size 0. An entry is a 21-byte header (u16
 *   flags<<8|type, u32 entry size, u16 parent table index, u32 parent entry offset within that
 *   table, CRC-32, u32 insertion sequence, u8 data offset), the NUL-terminated UTF-8 key of
 *   `data offset` bytes, then the value: type 3 int64, 4 uint64, 5 double, 6 string (u32 byte
 *   length + UTF-16LE), 7 byte array (u32 length + bytes), 8 bool (u32), 9 node (12 bytes; its
 *   children point at it). Type 1 is a free entry. Flag 0x01 ("file object pointer"): the value is
 *   u32 size + u64 absolute offset of a file object holding a large string/array. The entry
 *   checksum covers the header, the key and the value (not the slack after it). A parent table
 *   index of 0 marks a root key. Of several tables with the same index, the highest sequence wins.
 *
 * Every count, offset, size, the recursion depth and the file size (4 MiB) are bounded; a value
 * that fails its checksum or points outside its table/file is `E_MIG_MALFORMED_ARCHIVE`.
 */
import { u64le } from '../bytes.ts'
import { MigError } from '../errors.ts'
import { malformed } from './io.ts'

/** Largest `.vmcx` accepted, bytes (4 MiB; real files are 30-200 KiB). */
export const MAX_VMCX_BYTES = 4 * 1024 * 1024
/** Storage header signature, the only known format version, and fixed offsets. */
export const VMCX_SIGNATURE = 0x01282014
export const VMCX_VERSION = 0x400
const HEADER_OFFSETS = [0x0000, 0x1000] as const
const HEADER_SIZE = 46
const OBJECT_TABLE_OFFSET = 0x2000
const OBJECT_TABLE_SIGNATURE = 0x01110001
const OBJECT_ENTRY_SIZE = 18
const REPLAY_LOG_SIGNATURE = 0x01110003
const REPLAY_LOG_HEADER_SIZE = 34
const KEY_TABLE_SIGNATURE = 0x0002
const KEY_TABLE_HEADER_SIZE = 10
const KEY_ENTRY_HEADER_SIZE = 21
/** Field offsets of the storage header (dissect `c_hyperv.py` `HyperVStorageHeader`), relative to the header. */
const STORAGE_HEADER = { signature: 0, checksum: 4, sequence: 8, version: 10, alignment: 22, replay_log_offset: 26, replay_log_size: 34 } as const
/** The object table: u32 signature, u32 entry count, then entries. */
const OBJECT_TABLE = { signature: 0, count: 4, entries: 8 } as const
/** An object table entry (dissect `HyperVStorageObjectTableEntry`): u8 type, CRC-32, u64 offset, u32 size, u8 allocated. */
const OBJECT_ENTRY = { type: 0, checksum: 1, offset: 5, size: 13, allocated: 17 } as const
/** The replay log header: u32 signature, CRC-32, u32 outstanding entries. */
const REPLAY_LOG = { signature: 0, checksum: 4, pending: 8 } as const
/** The key table header (dissect `HyperVStorageKeyTableHeader`): u16 signature, u16 index, u16 sequence, CRC-32. */
const KEY_TABLE = { signature: 0, index: 2, sequence: 4, checksum: 6 } as const
/**
 * A key table entry's header (dissect `HyperVStorageKeyTableEntry`): u16 flags<<8|type, u32 size,
 * u16 parent table index, u32 parent entry offset, CRC-32, u32 insertion sequence, u8 data offset.
 */
const KEY_ENTRY = { type_flags: 0, size: 2, parent_table: 6, parent_offset: 8, checksum: 12, insertion: 16, data_offset: 20 } as const
/** A value held in a file object: u32 size, u64 absolute offset of the file object. */
const FILE_OBJECT_POINTER = { size: 0, offset: 4, bytes: 12 } as const

/** Bounds: object table entries, object tables, key tables, key entries in all, tree depth. */
export const VMCX_LIMITS = { objectEntries: 65536, objectTables: 16, keyTables: 4096, keyEntries: 200_000, depth: 64, keyTableBytes: 1024 * 1024 } as const

/** Key value types (dissect's `KeyDataType`). */
export const VMCX_TYPE = { Free: 1, Unknown: 2, Int: 3, UInt: 4, Double: 5, String: 6, Array: 7, Bool: 8, Node: 9 } as const

/**
 * A value of the key tree: a nested node (`VmcxNode`), a string (type 6), a number (types 3, 4
 * and 5; a 64-bit integer outside the safe range is a `bigint`), a boolean (type 8) or a byte
 * array (type 7, a `Buffer`).
 */
export type VmcxValue = VmcxNode | string | number | bigint | boolean | Buffer

/** A node of the key tree: its children by key, in table order. */
export interface VmcxNode extends Map<string, VmcxValue> {}

/**
 * A parsed configuration file.
 * - `formatVersion`: storage header version (0x400). `sequence`: the current header's number.
 * - `alignment`: data alignment from the header, bytes.
 * - `dirty`: the replay log holds outstanding entries (the file was not closed cleanly; values
 *   may predate the last changes). `root`: the key tree (a `.vmcx` has one root key,
 *   `configuration`). `keyTables`: number of active key tables. `warnings`: recoverable oddities.
 */
export interface VmcxConfig {
  label: string
  formatVersion: number
  sequence: number
  alignment: number
  dirty: boolean
  keyTables: number
  root: VmcxNode
  warnings: string[]
}

// ---------------------------------------------------------------------------------------------
// CRC-32 (ISO-HDLC: reflected polynomial 0xEDB88320, init and final XOR 0xFFFFFFFF)

let CRC_TABLE: Uint32Array | null = null
/** Standard CRC-32 of `data` (as zlib's `crc32`), the checksum of every HyperVStorage structure. */
export function crc32(data: Uint8Array): number {
  if (!CRC_TABLE) {
    CRC_TABLE = new Uint32Array(256)
    for (let n = 0; n < 256; n++) {
      let c = n
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
      CRC_TABLE[n] = c >>> 0
    }
  }
  let crc = 0xffffffff
  for (let i = 0; i < data.length; i++) crc = CRC_TABLE[(crc ^ data[i]!) & 0xff]! ^ (crc >>> 8)
  return (crc ^ 0xffffffff) >>> 0
}

/** CRC-32 of `buf[start, start+len)` with the 4 bytes at `start+ckAt` taken as zero. */
function crcWithZeroedField(buf: Buffer, start: number, len: number, ckAt: number): number {
  const copy = Buffer.from(buf.subarray(start, start + len))
  copy.fill(0, ckAt, ckAt + 4)
  return crc32(copy)
}

function hex(n: number): string {
  return '0x' + n.toString(16)
}

interface StorageHeader {
  at: number
  sequence: number
  version: number
  alignment: number
  replayLogOffset: number | null
  replayLogSize: number | null
}

function readHeader(buf: Buffer, at: number): { header: StorageHeader | null; signature: boolean } {
  if (buf.length < at + HEADER_SIZE) return { header: null, signature: false }
  const H = STORAGE_HEADER
  if (buf.readUInt32LE(at + H.signature) !== VMCX_SIGNATURE) return { header: null, signature: false }
  if (crcWithZeroedField(buf, at, HEADER_SIZE, H.checksum) !== buf.readUInt32LE(at + H.checksum)) return { header: null, signature: true }
  return {
    signature: true,
    header: {
      at,
      sequence: buf.readUInt16LE(at + H.sequence),
      version: buf.readUInt32LE(at + H.version),
      alignment: buf.readUInt32LE(at + H.alignment),
      replayLogOffset: u64le(buf, at + H.replay_log_offset),
      replayLogSize: u64le(buf, at + H.replay_log_size),
    },
  }
}

interface ObjectEntry {
  type: number
  offset: number
  size: number
}

/** Reads one object table; returns its allocated entries. */
function readObjectTable(buf: Buffer, at: number, label: string): ObjectEntry[] {
  if (at + OBJECT_TABLE.entries > buf.length) throw malformed(label, `object table at ${hex(at)} lies past the end of the file`)
  if (buf.readUInt32LE(at + OBJECT_TABLE.signature) !== OBJECT_TABLE_SIGNATURE) throw malformed(label, `no object table signature at ${hex(at)}`)
  const n = buf.readUInt32LE(at + OBJECT_TABLE.count)
  if (n > VMCX_LIMITS.objectEntries) throw malformed(label, `object table at ${hex(at)} declares ${n} entries (limit ${VMCX_LIMITS.objectEntries})`)
  if (at + OBJECT_TABLE.entries + n * OBJECT_ENTRY_SIZE > buf.length)
    throw malformed(label, `object table at ${hex(at)} declares ${n} entries, past the end of the file`)
  const out: ObjectEntry[] = []
  for (let i = 0; i < n; i++) {
    const e = at + OBJECT_TABLE.entries + i * OBJECT_ENTRY_SIZE
    if (crcWithZeroedField(buf, e, OBJECT_ENTRY_SIZE, OBJECT_ENTRY.checksum) !== buf.readUInt32LE(e + OBJECT_ENTRY.checksum))
      throw malformed(label, `object table entry ${i} at ${hex(e)}: checksum mismatch`)
    if (buf[e + OBJECT_ENTRY.allocated] === 0) continue
    const type = buf[e + OBJECT_ENTRY.type]!
    const offset = u64le(buf, e + OBJECT_ENTRY.offset)
    const size = buf.readUInt32LE(e + OBJECT_ENTRY.size)
    if (offset === null || offset + size > buf.length)
      throw malformed(
        label,
        `object table entry ${i} (type ${type}) points at ${offset === null ? 'an offset over 2^53' : hex(offset)}+${hex(size)}, outside the file`,
      )
    if (offset < OBJECT_TABLE_OFFSET && type !== 4) throw malformed(label, `object table entry ${i} (type ${type}) points into the headers (${hex(offset)})`)
    out.push({ type, offset, size })
  }
  return out
}

/** One decoded key-table entry before the tree is linked. */
interface KeyEntry {
  table: number
  offset: number
  type: number
  parentTable: number
  parentOffset: number
  insertion: number
  key: string
  value: VmcxValue | null
}

interface KeyTable {
  index: number
  sequence: number
  at: number
  size: number
}

function decodeValue(
  buf: Buffer,
  type: number,
  flags: number,
  v: number,
  entryEnd: number,
  files: Map<number, ObjectEntry>,
  where: string,
  label: string,
): { value: VmcxValue | null; size: number } {
  const need = (n: number): void => {
    if (v + n > entryEnd) throw malformed(label, `${where}: value of ${n} bytes overruns the entry`)
  }
  if (flags & 0x01) {
    if (type !== VMCX_TYPE.String && type !== VMCX_TYPE.Array) throw malformed(label, `${where}: file object pointer on a value of type ${type}`)
    need(FILE_OBJECT_POINTER.bytes)
    const size = buf.readUInt32LE(v + FILE_OBJECT_POINTER.size)
    const off = u64le(buf, v + FILE_OBJECT_POINTER.offset)
    const fo = off === null ? undefined : files.get(off)
    if (!fo) throw malformed(label, `${where}: points at ${off === null ? '?' : hex(off)}, which is not a file object`)
    if (size > fo.size) throw malformed(label, `${where}: value of ${size} bytes is larger than its file object (${fo.size})`)
    const data = buf.subarray(fo.offset, fo.offset + size)
    if (type === VMCX_TYPE.String) {
      if (size % 2 !== 0) throw malformed(label, `${where}: UTF-16 string of odd length ${size}`)
      return { value: data.toString('utf16le'), size: 12 }
    }
    return { value: Buffer.from(data), size: 12 }
  }
  switch (type) {
    case VMCX_TYPE.Int: {
      need(8)
      const x = buf.readBigInt64LE(v)
      return { value: x >= BigInt(Number.MIN_SAFE_INTEGER) && x <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(x) : x, size: 8 }
    }
    case VMCX_TYPE.UInt: {
      need(8)
      const x = buf.readBigUInt64LE(v)
      return { value: x <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(x) : x, size: 8 }
    }
    case VMCX_TYPE.Double:
      need(8)
      return { value: buf.readDoubleLE(v), size: 8 }
    case VMCX_TYPE.String:
    case VMCX_TYPE.Array: {
      need(4)
      const len = buf.readUInt32LE(v)
      need(4 + len)
      const data = buf.subarray(v + 4, v + 4 + len)
      if (type === VMCX_TYPE.String) {
        if (len % 2 !== 0) throw malformed(label, `${where}: UTF-16 string of odd length ${len}`)
        return { value: data.toString('utf16le'), size: 4 + len }
      }
      return { value: Buffer.from(data), size: 4 + len }
    }
    case VMCX_TYPE.Bool:
      need(4)
      return { value: buf.readUInt32LE(v) !== 0, size: 4 }
    case VMCX_TYPE.Node:
      need(12)
      return { value: null, size: 12 }
    default:
      return { value: null, size: 0 }
  }
}

/** Decodes the entries of one key table. */
function readKeyEntries(buf: Buffer, t: KeyTable, files: Map<number, ObjectEntry>, label: string, budget: { left: number }, warnings: string[]): KeyEntry[] {
  const out: KeyEntry[] = []
  let p = KEY_TABLE_HEADER_SIZE
  let unknown = 0
  while (p + KEY_ENTRY_HEADER_SIZE <= t.size) {
    const e = t.at + p
    const typeFlags = buf.readUInt16LE(e + KEY_ENTRY.type_flags)
    const size = buf.readUInt32LE(e + KEY_ENTRY.size)
    if (size === 0) break
    const where = `key table ${t.index} entry at ${hex(p)}`
    if (size < KEY_ENTRY_HEADER_SIZE || p + size > t.size) throw malformed(label, `${where}: entry size ${size} does not fit the table`)
    if (--budget.left < 0) throw malformed(label, `more than ${VMCX_LIMITS.keyEntries} key entries`)
    const type = typeFlags & 0xff
    const flags = typeFlags >> 8
    if (type === VMCX_TYPE.Free) {
      p += size
      continue
    }
    if (type === VMCX_TYPE.Unknown || type > VMCX_TYPE.Node || type === 0) {
      unknown++
      p += size
      continue
    }
    const dataOffset = buf[e + KEY_ENTRY.data_offset]!
    if (dataOffset < 1 || KEY_ENTRY_HEADER_SIZE + dataOffset > size) throw malformed(label, `${where}: key length ${dataOffset} does not fit the entry`)
    const keyStart = e + KEY_ENTRY_HEADER_SIZE
    if (buf[keyStart + dataOffset - 1] !== 0) throw malformed(label, `${where}: key is not NUL-terminated`)
    const keyBytes = buf.subarray(keyStart, keyStart + dataOffset - 1)
    if (keyBytes.includes(0)) throw malformed(label, `${where}: key contains a NUL byte`)
    const key = keyBytes.toString('utf8')
    const { value, size: valueSize } = decodeValue(
      buf,
      type,
      flags,
      keyStart + dataOffset,
      e + size,
      files,
      `${where} (${JSON.stringify(key.slice(0, 64))})`,
      label,
    )
    const covered = KEY_ENTRY_HEADER_SIZE + dataOffset + valueSize
    if (crcWithZeroedField(buf, e, covered, KEY_ENTRY.checksum) !== buf.readUInt32LE(e + KEY_ENTRY.checksum))
      throw malformed(label, `${where} (${JSON.stringify(key.slice(0, 64))}): checksum mismatch`)
    out.push({
      table: t.index,
      offset: p,
      type,
      parentTable: buf.readUInt16LE(e + KEY_ENTRY.parent_table),
      parentOffset: buf.readUInt32LE(e + KEY_ENTRY.parent_offset),
      insertion: buf.readUInt32LE(e + KEY_ENTRY.insertion),
      key,
      value,
    })
    p += size
  }
  if (unknown > 0) warnings.push(`key table ${t.index}: ${unknown} entries of unknown type skipped`)
  return out
}

/**
 * Parses a `.vmcx`/`.vmrs` file held in `buf` into its key tree.
 *
 * Steps: both storage headers (signature, CRC-32; the valid one with the higher sequence
 * number), the format version, the replay log header (outstanding entries make the result
 * `dirty`, with a warning), the object table at 0x2000 and any object tables it lists (each entry
 * CRC-checked), the key tables (header CRC, highest sequence per index) and their entries (bounds,
 * NUL-terminated UTF-8 keys, typed values, CRC of header+key+value, file-object pointers into
 * allocated file objects), then the tree linked through parent (table index, offset) references.
 * Orphan entries (parent missing or not a node) are dropped with a warning; of duplicate keys
 * under one node the one with the higher insertion sequence wins.
 *
 * @param label file name for messages.
 * @throws E_MIG_UNSUPPORTED_FORMAT no HyperVStorage signature in either header (not a VMCX), or a
 *   format version other than 0x400.
 * @throws E_MIG_MALFORMED_ARCHIVE larger than 4 MiB or shorter than the fixed structures; both
 *   headers fail their checksum; bad alignment; an object table, key table or key entry that is
 *   malformed, fails its checksum or points outside its table or the file; bounds of
 *   {@link VMCX_LIMITS} exceeded; no key at all.
 */
export function parseVmcx(buf: Buffer, label: string): VmcxConfig {
  if (buf.length > MAX_VMCX_BYTES) throw malformed(label, `configuration file larger than ${MAX_VMCX_BYTES} bytes (${buf.length})`)
  const warnings: string[] = []
  const h = HEADER_OFFSETS.map((at) => readHeader(buf, at))
  if (!h.some((x) => x.signature))
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: not a Hyper-V configuration file (no HyperVStorage header signature)`)
  const valid = h.map((x) => x.header).filter((x): x is StorageHeader => x !== null)
  if (valid.length === 0) throw malformed(label, 'both storage headers fail their checksum')
  if (valid.length < 2) warnings.push('one of the two storage headers is damaged; the other one is used')
  const header = valid.reduce((a, b) => (b.sequence > a.sequence ? b : a))
  if (header.version !== VMCX_VERSION)
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: HyperVStorage format version ${hex(header.version)} is not supported (only ${hex(VMCX_VERSION)})`)
  if (header.alignment === 0 || header.alignment > 0x10000 || (header.alignment & (header.alignment - 1)) !== 0)
    throw malformed(label, `data alignment ${hex(header.alignment)} is not a power of two up to 0x10000`)
  if (buf.length < OBJECT_TABLE_OFFSET + 8) throw malformed(label, `file of ${buf.length} bytes is shorter than its fixed structures`)

  // Replay log: a journal of writes; outstanding entries mean the file was not closed cleanly.
  let dirty = false
  const rl = header.replayLogOffset
  if (rl === null || rl < OBJECT_TABLE_OFFSET || rl + REPLAY_LOG_HEADER_SIZE > buf.length) {
    warnings.push(`replay log offset ${rl === null ? '?' : hex(rl)} is outside the file: not checked`)
  } else if (
    buf.readUInt32LE(rl + REPLAY_LOG.signature) !== REPLAY_LOG_SIGNATURE ||
    crcWithZeroedField(buf, rl, REPLAY_LOG_HEADER_SIZE, REPLAY_LOG.checksum) !== buf.readUInt32LE(rl + REPLAY_LOG.checksum)
  ) {
    warnings.push(`replay log header at ${hex(rl)} is damaged: not checked`)
  } else {
    const pending = buf.readUInt32LE(rl + REPLAY_LOG.pending)
    if (pending > 0) {
      dirty = true
      warnings.push(`the replay log holds ${pending} outstanding entries (the file was not closed cleanly): values may predate the last changes`)
    }
  }

  // Object tables.
  const objects: ObjectEntry[] = []
  const tableQueue = [OBJECT_TABLE_OFFSET]
  const seenTables = new Set<number>()
  while (tableQueue.length > 0) {
    const at = tableQueue.shift()!
    if (seenTables.has(at)) continue
    seenTables.add(at)
    if (seenTables.size > VMCX_LIMITS.objectTables) throw malformed(label, `more than ${VMCX_LIMITS.objectTables} object tables`)
    for (const o of readObjectTable(buf, at, label)) {
      if (objects.length >= VMCX_LIMITS.objectEntries) throw malformed(label, `more than ${VMCX_LIMITS.objectEntries} objects`)
      objects.push(o)
      if (o.type === 1) tableQueue.push(o.offset)
    }
  }
  const files = new Map<number, ObjectEntry>()
  for (const o of objects) if (o.type === 3) files.set(o.offset, o)

  // Key tables: the highest sequence number of each index is active.
  const active = new Map<number, KeyTable>()
  let keyTableCount = 0
  for (const o of objects) {
    if (o.type !== 2) continue
    if (++keyTableCount > VMCX_LIMITS.keyTables) throw malformed(label, `more than ${VMCX_LIMITS.keyTables} key tables`)
    if (o.size < KEY_TABLE_HEADER_SIZE || o.size > VMCX_LIMITS.keyTableBytes) throw malformed(label, `key table at ${hex(o.offset)} has size ${o.size}`)
    if (buf.readUInt16LE(o.offset + KEY_TABLE.signature) !== KEY_TABLE_SIGNATURE)
      throw malformed(label, `key table at ${hex(o.offset)}: bad signature ${hex(buf.readUInt16LE(o.offset + KEY_TABLE.signature))}`)
    if (crcWithZeroedField(buf, o.offset, KEY_TABLE_HEADER_SIZE, KEY_TABLE.checksum) !== buf.readUInt32LE(o.offset + KEY_TABLE.checksum))
      throw malformed(label, `key table at ${hex(o.offset)}: header checksum mismatch`)
    const t: KeyTable = {
      index: buf.readUInt16LE(o.offset + KEY_TABLE.index),
      sequence: buf.readUInt16LE(o.offset + KEY_TABLE.sequence),
      at: o.offset,
      size: o.size,
    }
    if (t.index === 0) throw malformed(label, `key table at ${hex(o.offset)} has index 0`)
    const prev = active.get(t.index)
    if (!prev || t.sequence > prev.sequence) active.set(t.index, t)
  }
  if (active.size === 0) throw malformed(label, 'no key table')

  const budget = { left: VMCX_LIMITS.keyEntries }
  const byRef = new Map<string, KeyEntry>()
  const entries: KeyEntry[] = []
  for (const t of [...active.values()].sort((a, b) => a.index - b.index)) {
    for (const e of readKeyEntries(buf, t, files, label, budget, warnings)) {
      entries.push(e)
      byRef.set(`${e.table}:${e.offset}`, e)
    }
  }

  // Link children to parents.
  const kids = new Map<KeyEntry, KeyEntry[]>()
  const roots: KeyEntry[] = []
  let orphans = 0
  for (const e of entries) {
    if (e.parentTable === 0) {
      roots.push(e)
      continue
    }
    const parent = byRef.get(`${e.parentTable}:${e.parentOffset}`)
    if (!parent || parent.type !== VMCX_TYPE.Node || parent === e) {
      orphans++
      continue
    }
    let list = kids.get(parent)
    if (!list) kids.set(parent, (list = []))
    list.push(e)
  }
  if (orphans > 0) warnings.push(`${orphans} key entries whose parent is missing or not a node were dropped`)
  const visited = new Set<KeyEntry>()
  const build = (list: KeyEntry[], depth: number): VmcxNode => {
    if (depth > VMCX_LIMITS.depth) throw malformed(label, `key tree deeper than ${VMCX_LIMITS.depth}`)
    const node: VmcxNode = new Map()
    const ins = new Map<string, number>()
    for (const e of list) {
      if (visited.has(e)) continue
      visited.add(e)
      const prev = ins.get(e.key)
      if (prev !== undefined && prev > e.insertion) continue
      ins.set(e.key, e.insertion)
      node.set(e.key, e.type === VMCX_TYPE.Node ? build(kids.get(e) ?? [], depth + 1) : (e.value as VmcxValue))
    }
    return node
  }
  const root = build(roots, 0)
  if (root.size === 0) throw malformed(label, 'the key tree has no root key')
  return { label, formatVersion: header.version, sequence: header.sequence, alignment: header.alignment, dirty, keyTables: active.size, root, warnings }
}

/** True when `v` is a {@link VmcxNode}. */
export function isVmcxNode(v: VmcxValue | undefined): v is VmcxNode {
  return v instanceof Map
}

/** The value at a `/`-separated key path (`configuration/settings/memory/bank/size`), or undefined. */
export function vmcxGet(node: VmcxNode, keyPath: string): VmcxValue | undefined {
  let cur: VmcxValue | undefined = node
  for (const k of keyPath.split('/')) {
    if (!isVmcxNode(cur)) return undefined
    cur = cur.get(k)
  }
  return cur
}
