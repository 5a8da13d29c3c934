/**
 * VHDX header and metadata reader (Hyper-V disk images, generation 2).
 *
 * Follows Microsoft's [MS-VHDX] "Virtual Hard Disk v2 (VHDX) File Format" v1.0: section 2.2.1
 * file type identifier (`vhdxfile` + creator), 2.2.2 the two 4 KiB headers at 64 KiB and
 * 128 KiB (signature `head`, CRC-32C checksum, sequence number; the valid header with the higher
 * sequence number is current), 2.2.3 the region tables at 192 KiB and 256 KiB (signature `regi`,
 * CRC-32C over 64 KiB; BAT and metadata regions), 2.6 the metadata region (`metadata` table,
 * items File Parameters, Virtual Disk Size, Virtual Disk ID, Logical/Physical Sector Size,
 * Parent Locator with its UTF-16LE key/value entries). All integers are little-endian and GUIDs
 * use the Microsoft mixed-endian layout. Only the first 320 KiB and the metadata items are read.
 */
import { MigError } from '../errors.ts'
import type { FileHandle } from 'node:fs/promises'
import { type FileWindow, malformed, openRead, readInWindow } from './io.ts'

const KiB = 1024
const MiB = 1024 * 1024
/** The file type identifier's signature at offset 0 (MS-VHDX 2.2.1). */
export const VHDX_FILE_SIGNATURE = 'vhdxfile'

/**
 * Where the VHDX structures sit and their fields (MS-VHDX 2.2; qemu `block/vhdx.h`), byte offsets,
 * little-endian: the file type identifier (signature, UTF-16 creator), the two headers and the
 * two region tables in the first 320 KiB.
 */
export const VHDX_LAYOUT = {
  creator: 8,
  header1: 64 * KiB,
  header2: 128 * KiB,
  regionTable1: 192 * KiB,
  regionTable2: 256 * KiB,
  /** end of the header section */
  end: 320 * KiB,
} as const
/** The header (2.2.2, 4 KiB): signature `head`, CRC-32C, u64 sequence number, GUIDs, u16 version. */
export const VHDX_HEADER = { signature: 0, checksum: 4, sequence_number: 8, data_write_guid: 32, log_guid: 48, version: 66, bytes: 4 * KiB } as const
/** The region table (2.2.3, 64 KiB): signature `regi`, CRC-32C, u32 entry count, entries of 32 bytes from byte 16. */
export const VHDX_REGION_TABLE = { signature: 0, checksum: 4, entry_count: 8, entries: 16, bytes: 64 * KiB } as const
/** A region table entry: GUID, u64 file offset, u32 length, u32 flags (bit 0 required). */
export const VHDX_REGION_ENTRY = { guid: 0, file_offset: 16, length: 24, required: 28, bytes: 32 } as const
/** The metadata table (2.6.1, 64 KiB): signature `metadata`, u16 entry count at 10, entries of 32 bytes from byte 32. */
export const VHDX_METADATA_TABLE = { signature: 0, entry_count: 10, entries: 32, bytes: 64 * KiB } as const
/** A metadata table entry: item GUID, u32 offset in the region, u32 length, u32 flags (bit 2 required). */
export const VHDX_METADATA_ENTRY = { item_id: 0, offset: 16, length: 20, flags: 24, bytes: 32 } as const
/** The File Parameters item (2.6.2.1): u32 block size, u32 flags (bit 0 leave blocks allocated, bit 1 has parent). */
const FILE_PARAMETERS = { block_size: 0, flags: 4 } as const
/** The Parent Locator item (2.6.2.6): locator type GUID, u16 key/value count at 18, entries of 12 bytes from byte 20. */
const PARENT_LOCATOR = { type: 0, count: 18, entries: 20 } as const
/** A parent locator entry: u32 key offset, u32 value offset, u16 key length, u16 value length. */
const LOCATOR_ENTRY = { key_offset: 0, value_offset: 4, key_length: 8, value_length: 10, bytes: 12 } as const
const RH = VHDX_REGION_ENTRY
const MH = VHDX_METADATA_ENTRY

/** Largest virtual size of a VHDX, bytes (MS-VHDX 2.6.2.2: 64 TiB). */
export const VHDX_MAX_VIRTUAL_SIZE = 64 * 2 ** 40

/** Region GUIDs (MS-VHDX 2.2.3.1). */
export const VHDX_REGION_BAT = '2DC27766-F623-4200-9D64-115E9BFD4A08'
export const VHDX_REGION_METADATA = '8B7CA206-4790-4B9A-B8FE-575F050F886E'
/** Metadata item GUIDs (MS-VHDX 2.6.2). */
const ITEM_FILE_PARAMETERS = 'CAA16737-FA36-4D43-B3B6-33F0AA44E76B'
const ITEM_VIRTUAL_DISK_SIZE = '2FA54224-CD1B-4876-B211-5DBED83BF4B8'
const ITEM_VIRTUAL_DISK_ID = 'BECA12AB-B2E6-4523-93EF-C309E000C746'
const ITEM_LOGICAL_SECTOR_SIZE = '8141BF1D-A96F-4709-BA47-F233A8FAAB5F'
const ITEM_PHYSICAL_SECTOR_SIZE = 'CDA348C7-445D-4471-9CC9-E9885251C556'
const ITEM_PARENT_LOCATOR = 'A8D35F2D-B30B-454D-ABF7-D3D84834AB0C'
/** Locator type of a VHDX parent (MS-VHDX 2.6.2.6). */
const LOCATOR_TYPE_VHDX = 'B04AEFB7-D19E-4A81-B789-25B8E9445913'
const KNOWN_ITEMS = new Set([
  ITEM_FILE_PARAMETERS,
  ITEM_VIRTUAL_DISK_SIZE,
  ITEM_VIRTUAL_DISK_ID,
  ITEM_LOGICAL_SECTOR_SIZE,
  ITEM_PHYSICAL_SECTOR_SIZE,
  ITEM_PARENT_LOCATOR,
])

/**
 * What a VHDX says about itself. Sizes are bytes.
 * - `virtual_size`: Virtual Disk Size item. `block_size`: File Parameters BlockSize (the BAT's
 *   payload block, 1..256 MiB). `logical_sector_size`/`physical_sector_size`: 512 or 4096.
 * - `fixed`: File Parameters LeaveBlockAllocated (a fixed VHDX). `has_parent`: HasParent (a
 *   differencing VHDX); `parent_locator`: its key/value entries (`parent_linkage`,
 *   `parent_linkage2`, `relative_path`, `volume_path`, `absolute_win32_path`), else null.
 * - `creator`: the file type identifier's creator string. `virtual_disk_id`,
 *   `data_write_guid`: GUIDs as upper-case `XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX`.
 * - `needs_log_replay`: the current header's LogGuid is set (unreplayed log; qemu refuses such
 *   an image read-only). `header_sequence`: sequence number of the current header (decimal).
 * - `bat_offset`: byte offset of the BAT region in the file (relative to the window when one was
 *   given), `chunk_ratio`: payload blocks per sector bitmap block (2.5; the BAT holds one sector
 *   bitmap entry after every `chunk_ratio` payload entries). The region holds at least the
 *   entries the virtual size needs (checked).
 */
export interface VhdxInfo {
  virtual_size: number
  block_size: number
  logical_sector_size: number
  physical_sector_size: number
  fixed: boolean
  has_parent: boolean
  parent_locator: Record<string, string> | null
  creator: string
  virtual_disk_id: string | null
  data_write_guid: string
  needs_log_replay: boolean
  header_sequence: string
  bat_offset: number
  chunk_ratio: number
}

let CRC32C_TABLE: Uint32Array | null = null

/**
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final XOR 0xFFFFFFFF), the
 * checksum of VHDX headers, region tables and log entries (MS-VHDX 2.2.2, 2.2.3).
 */
export function crc32c(data: Uint8Array): number {
  if (!CRC32C_TABLE) {
    CRC32C_TABLE = new Uint32Array(256)
    for (let n = 0; n < 256; n++) {
      let c = n
      for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1
      CRC32C_TABLE[n] = c >>> 0
    }
  }
  const t = CRC32C_TABLE
  let crc = 0xffffffff
  for (let i = 0; i < data.length; i++) crc = t[(crc ^ data[i]!) & 0xff]! ^ (crc >>> 8)
  return (crc ^ 0xffffffff) >>> 0
}

/** True when the CRC-32C of `block`, with its 4-byte checksum field at `at` zeroed, matches it. */
function checksumOk(block: Buffer, at: number): boolean {
  const stored = block.readUInt32LE(at)
  const copy = Buffer.from(block)
  copy.writeUInt32LE(0, at)
  return crc32c(copy) === stored
}

/** A Microsoft GUID (mixed-endian: Data1-3 little-endian, Data4 bytes) as upper-case text. */
export function guidAt(buf: Buffer, at: number): string {
  const h = (a: number, b: number): string => buf.subarray(at + a, at + b).toString('hex')
  const le = (a: number, n: number): string =>
    Buffer.from(buf.subarray(at + a, at + a + n))
      .reverse()
      .toString('hex')
  return `${le(0, 4)}-${le(4, 2)}-${le(6, 2)}-${h(8, 10)}-${h(10, 16)}`.toUpperCase()
}

const ZERO_GUID = '00000000-0000-0000-0000-000000000000'

/** A UTF-16LE string up to its first NUL. */
function utf16z(buf: Buffer): string {
  const s = buf.subarray(0, buf.length - (buf.length % 2)).toString('utf16le')
  const nul = s.indexOf('\0')
  return nul < 0 ? s : s.slice(0, nul)
}

interface Header {
  seq: bigint
  dataWriteGuid: string
  logGuid: string
}

function parseHeader(block: Buffer): Header | null {
  const H = VHDX_HEADER
  if (block.length < H.bytes || block.toString('latin1', H.signature, H.signature + 4) !== 'head' || !checksumOk(block, H.checksum)) return null
  if (block.readUInt16LE(H.version) !== 1) return null // Version must be 1
  return { seq: block.readBigUInt64LE(H.sequence_number), dataWriteGuid: guidAt(block, H.data_write_guid), logGuid: guidAt(block, H.log_guid) }
}

interface Region {
  offset: number
  length: number
}

/**
 * Reads the VHDX headers, region table and metadata of `file`.
 *
 * @returns the {@link VhdxInfo}.
 * @throws E_MIG_UNSUPPORTED_FORMAT no `vhdxfile` identifier; an unknown region or metadata item
 *   marked required; a parent locator of a type other than VHDX.
 * @throws E_MIG_MALFORMED_ARCHIVE file cut short; no header or region table with a valid
 *   CRC-32C; regions unaligned, overlapping the headers or outside the file; a missing BAT,
 *   metadata region or required metadata item; block size not a power of two in 1..256 MiB;
 *   sector sizes other than 512/4096; virtual size 0, over 64 TiB or not a multiple of the
 *   logical sector size; a BAT region too small for the virtual size; bad parent locator entries.
 * `win`: only that byte range of `file` holds the image (a tar member read in place); sizes and
 * offsets are then relative to it.
 * @throws E_MIG_DISK_READ_FAILED the file cannot be opened or read.
 */
export async function readVhdxInfo(file: string, win?: FileWindow): Promise<VhdxInfo> {
  const fh = await openRead(file)
  try {
    return await readVhdxInfoFrom(fh, file, win)
  } finally {
    await fh.close()
  }
}

/**
 * {@link readVhdxInfo} of an open file: `fh` is read (never closed), `file` names it in messages.
 * Same result and errors.
 */
export async function readVhdxInfoFrom(fh: FileHandle, file: string, win?: FileWindow): Promise<VhdxInfo> {
  const fileSize = win ? win.length : (await fh.stat()).size
  const head = await readInWindow(fh, file, win, Math.min(fileSize, VHDX_LAYOUT.end), 0)
  if (head.length < 8 || head.toString('latin1', 0, 8) !== VHDX_FILE_SIGNATURE)
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: not a VHDX image (no vhdxfile identifier)`)
  if (head.length < VHDX_LAYOUT.end) throw malformed(file, `VHDX cut short: ${fileSize} bytes, the headers and region tables need ${VHDX_LAYOUT.end}`)
  const creator = utf16z(head.subarray(VHDX_LAYOUT.creator, VHDX_LAYOUT.creator + 512))

  // Headers (2.2.2): take the valid one with the higher sequence number.
  const h1 = parseHeader(head.subarray(VHDX_LAYOUT.header1, VHDX_LAYOUT.header1 + VHDX_HEADER.bytes))
  const h2 = parseHeader(head.subarray(VHDX_LAYOUT.header2, VHDX_LAYOUT.header2 + VHDX_HEADER.bytes))
  if (!h1 && !h2) throw malformed(file, 'neither VHDX header has a valid signature, version and CRC-32C')
  const cur = !h1 ? h2! : !h2 ? h1 : h2.seq > h1.seq ? h2 : h1

  // Region table (2.2.3): the first with a valid CRC-32C.
  let table: Buffer | null = null
  for (const off of [VHDX_LAYOUT.regionTable1, VHDX_LAYOUT.regionTable2]) {
    const t = head.subarray(off, off + VHDX_REGION_TABLE.bytes)
    if (t.toString('latin1', VHDX_REGION_TABLE.signature, VHDX_REGION_TABLE.signature + 4) === 'regi' && checksumOk(t, VHDX_REGION_TABLE.checksum)) {
      table = t
      break
    }
  }
  if (!table) throw malformed(file, 'neither VHDX region table has a valid signature and CRC-32C')
  const count = table.readUInt32LE(VHDX_REGION_TABLE.entry_count)
  if (count > 2047) throw malformed(file, `region table declares ${count} entries (limit 2047)`)
  const regions = new Map<string, Region>()
  for (let i = 0; i < count; i++) {
    const at = VHDX_REGION_TABLE.entries + i * RH.bytes
    const guid = guidAt(table, at + RH.guid)
    const offset = table.readBigUInt64LE(at + RH.file_offset)
    const length = table.readUInt32LE(at + RH.length)
    const required = (table.readUInt32LE(at + RH.required) & 1) === 1
    if (offset % BigInt(MiB) !== 0n || offset < BigInt(MiB) || length % MiB !== 0 || length === 0)
      throw malformed(file, `region ${guid} at ${offset} (+${length}) is not 1 MiB aligned`)
    if (offset + BigInt(length) > BigInt(fileSize)) throw malformed(file, `region ${guid} at ${offset} (+${length}) lies outside the file of ${fileSize} bytes`)
    if (regions.has(guid)) throw malformed(file, `region ${guid} listed twice`)
    if (guid !== VHDX_REGION_BAT && guid !== VHDX_REGION_METADATA && required)
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: unknown required VHDX region ${guid}`)
    regions.set(guid, { offset: Number(offset), length })
  }
  const bat = regions.get(VHDX_REGION_BAT)
  const meta = regions.get(VHDX_REGION_METADATA)
  if (!bat) throw malformed(file, 'no BAT region')
  if (!meta) throw malformed(file, 'no metadata region')
  if (meta.length < 64 * KiB) throw malformed(file, 'metadata region smaller than its 64 KiB table')

  // Metadata table (2.6.1).
  const mt = await readInWindow(fh, file, win, VHDX_METADATA_TABLE.bytes, meta.offset)
  if (mt.length < VHDX_METADATA_TABLE.bytes || mt.toString('latin1', VHDX_METADATA_TABLE.signature, VHDX_METADATA_TABLE.signature + 8) !== 'metadata')
    throw malformed(file, `no metadata table signature at offset ${meta.offset}`)
  const entries = mt.readUInt16LE(VHDX_METADATA_TABLE.entry_count)
  if (entries > 2047) throw malformed(file, `metadata table declares ${entries} entries (limit 2047)`)
  const items = new Map<string, { offset: number; length: number }>()
  for (let i = 0; i < entries; i++) {
    const at = VHDX_METADATA_TABLE.entries + i * MH.bytes
    const id = guidAt(mt, at + MH.item_id)
    const offset = mt.readUInt32LE(at + MH.offset)
    const length = mt.readUInt32LE(at + MH.length)
    const required = (mt.readUInt32LE(at + MH.flags) & 4) !== 0
    if (!KNOWN_ITEMS.has(id)) {
      if (required) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: unknown required VHDX metadata item ${id}`)
      continue
    }
    if (items.has(id)) throw malformed(file, `metadata item ${id} listed twice`)
    if (length === 0 || length > MiB || offset < 64 * KiB || offset + length > meta.length)
      throw malformed(file, `metadata item ${id} at ${offset} (+${length}) lies outside the metadata region`)
    items.set(id, { offset, length })
  }
  const readItem = async (id: string, name: string, min: number): Promise<Buffer> => {
    const it = items.get(id)
    if (!it) throw malformed(file, `missing required metadata item ${name}`)
    if (it.length < min) throw malformed(file, `metadata item ${name} is ${it.length} bytes, needs ${min}`)
    const b = await readInWindow(fh, file, win, it.length, meta.offset + it.offset)
    if (b.length < it.length) throw malformed(file, `metadata item ${name} cut short by the end of the file`)
    return b
  }

  const fp = await readItem(ITEM_FILE_PARAMETERS, 'File Parameters', 8)
  const block_size = fp.readUInt32LE(FILE_PARAMETERS.block_size)
  const flags = fp.readUInt32LE(FILE_PARAMETERS.flags)
  if (block_size < MiB || block_size > 256 * MiB || (block_size & (block_size - 1)) !== 0)
    throw malformed(file, `block size ${block_size} is not a power of two in 1..256 MiB`)
  const fixed = (flags & 1) !== 0
  const has_parent = (flags & 2) !== 0

  const vs = (await readItem(ITEM_VIRTUAL_DISK_SIZE, 'Virtual Disk Size', 8)).readBigUInt64LE(0)
  const logical_sector_size = (await readItem(ITEM_LOGICAL_SECTOR_SIZE, 'Logical Sector Size', 4)).readUInt32LE(0)
  const physical_sector_size = (await readItem(ITEM_PHYSICAL_SECTOR_SIZE, 'Physical Sector Size', 4)).readUInt32LE(0)
  if (logical_sector_size !== 512 && logical_sector_size !== 4096) throw malformed(file, `logical sector size ${logical_sector_size} (512 or 4096)`)
  if (physical_sector_size !== 512 && physical_sector_size !== 4096) throw malformed(file, `physical sector size ${physical_sector_size} (512 or 4096)`)
  if (vs === 0n || vs > BigInt(VHDX_MAX_VIRTUAL_SIZE)) throw malformed(file, `virtual disk size ${vs} outside 1 byte..64 TiB`)
  const virtual_size = Number(vs)
  if (virtual_size % logical_sector_size !== 0)
    throw malformed(file, `virtual disk size ${virtual_size} is not a multiple of the ${logical_sector_size}-byte logical sector`)
  const virtual_disk_id = items.has(ITEM_VIRTUAL_DISK_ID) ? guidAt(await readItem(ITEM_VIRTUAL_DISK_ID, 'Virtual Disk ID', 16), 0) : null

  // BAT size (2.5): payload blocks plus interleaved sector bitmap blocks, one per chunk.
  const chunkRatio = (2 ** 23 * logical_sector_size) / block_size
  const dataBlocks = Math.ceil(virtual_size / block_size)
  const batEntries = has_parent ? Math.ceil(dataBlocks / chunkRatio) * (chunkRatio + 1) : dataBlocks + Math.floor((dataBlocks - 1) / chunkRatio)
  if (batEntries * 8 > bat.length) throw malformed(file, `BAT region of ${bat.length} bytes cannot hold the ${batEntries} entries the virtual size needs`)

  let parent_locator: Record<string, string> | null = null
  if (has_parent) parent_locator = parseParentLocator(await readItem(ITEM_PARENT_LOCATOR, 'Parent Locator', 20), file)

  return {
    virtual_size,
    block_size,
    logical_sector_size,
    physical_sector_size,
    fixed,
    has_parent,
    parent_locator,
    creator,
    virtual_disk_id,
    data_write_guid: cur.dataWriteGuid,
    needs_log_replay: cur.logGuid !== ZERO_GUID,
    header_sequence: cur.seq.toString(),
    bat_offset: bat.offset,
    chunk_ratio: chunkRatio,
  }
}

/**
 * Payload block states of a BAT entry (MS-VHDX 2.5.1.1). In a VHDX without a parent,
 * NOT_PRESENT, UNDEFINED, ZERO and UNMAPPED read as zeros and FULLY_PRESENT from the file;
 * PARTIALLY_PRESENT exists only in differencing images (its sector bitmap says which sectors come
 * from the parent); states 4 and 5 are not defined.
 */
export const VHDX_BLOCK = { NOT_PRESENT: 0, UNDEFINED: 1, ZERO: 2, UNMAPPED: 3, FULLY_PRESENT: 6, PARTIALLY_PRESENT: 7 } as const

/**
 * One BAT entry (MS-VHDX 2.5.1: State in bits 0-2, FileOffsetMB in bits 20-63), read little-endian
 * at `at` of `bat`: the payload block's state ({@link VHDX_BLOCK}) and file offset, bytes (the
 * entry's megabyte count times 1 MiB; meaningful for FULLY_PRESENT and PARTIALLY_PRESENT only).
 */
export function batEntryAt(bat: Buffer, at: number): { state: number; fileOffset: number } {
  const lo = bat.readUInt32LE(at)
  const hi = bat.readUInt32LE(at + 4)
  // FileOffsetMB = bits 20..63: the low word's top 12 bits, then the high word (44 bits in all).
  return { state: lo & 7, fileOffset: (hi * 4096 + (lo >>> 20)) * MiB }
}

/** Index in the BAT of payload block `block` (2.5: a sector bitmap entry follows every `chunkRatio` payload entries). */
export function batIndexOfBlock(block: number, chunkRatio: number): number {
  return block + Math.floor(block / chunkRatio)
}

const FORBIDDEN_KEYS = new Set(['__proto__', 'constructor', 'prototype'])

/**
 * Parses a Parent Locator metadata item (MS-VHDX 2.6.2.6): locator type GUID, key/value count,
 * then 12-byte entries (key offset, value offset, key length, value length; offsets relative to
 * the item) pointing at UTF-16LE strings. Returns a null-prototype map; `__proto__`,
 * `constructor` and `prototype` keys are ignored.
 * @throws E_MIG_UNSUPPORTED_FORMAT locator type is not the VHDX one.
 * @throws E_MIG_MALFORMED_ARCHIVE entries or strings outside the item, odd lengths, duplicates.
 */
export function parseParentLocator(item: Buffer, file: string): Record<string, string> {
  const type = guidAt(item, PARENT_LOCATOR.type)
  if (type !== LOCATOR_TYPE_VHDX) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: parent locator type ${type} is not the VHDX locator`)
  const n = item.readUInt16LE(PARENT_LOCATOR.count)
  const entriesEnd = PARENT_LOCATOR.entries + n * LOCATOR_ENTRY.bytes
  if (entriesEnd > item.length)
    throw malformed(file, `parent locator declares ${n} entries, its item holds ${Math.floor((item.length - PARENT_LOCATOR.entries) / LOCATOR_ENTRY.bytes)}`)
  const out: Record<string, string> = Object.create(null)
  const str = (off: number, len: number, what: string): string => {
    if (len === 0 || len % 2 !== 0 || off + len > item.length || off < entriesEnd)
      throw malformed(file, `parent locator ${what} at ${off} (+${len}) is invalid`)
    return item.subarray(off, off + len).toString('utf16le')
  }
  for (let i = 0; i < n; i++) {
    const at = PARENT_LOCATOR.entries + i * LOCATOR_ENTRY.bytes
    const key = str(item.readUInt32LE(at + LOCATOR_ENTRY.key_offset), item.readUInt16LE(at + LOCATOR_ENTRY.key_length), `key ${i}`)
    const value = str(item.readUInt32LE(at + LOCATOR_ENTRY.value_offset), item.readUInt16LE(at + LOCATOR_ENTRY.value_length), `value of ${JSON.stringify(key)}`)
    if (FORBIDDEN_KEYS.has(key)) continue
    if (key in out) throw malformed(file, `parent locator key ${JSON.stringify(key)} listed twice`)
    out[key] = value
  }
  return out
}
