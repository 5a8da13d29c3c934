/**
 * qcow2 header reader and backing-chain resolver.
 *
 * Follows qemu's `docs/interop/qcow2.txt` ("QCOW2 Image Format"): the big-endian header (magic
 * `QFI\xfb`, version 2 or 3, backing file offset/size, cluster_bits, size, crypt_method, L1 table
 * size/offset, refcount table, snapshots; version 3 adds the feature bitmaps, refcount_order and
 * header_length), then the header extensions (type/length/data padded to 8 bytes) up to the
 * backing file name or the end of the first cluster. Only the header cluster is read, with
 * positioned reads; every declared offset and size is checked against the file before use.
 */
import { realpath } from 'node:fs/promises'
import * as nodePath from 'node:path'
import { u64be } from '../bytes.ts'
import { MigError } from '../errors.ts'
import type { FileHandle } from 'node:fs/promises'
import { type FileWindow, malformed, openRead, readAt, readInWindow, statPath } from './io.ts'
import { remoteInput, resolveInRoot } from '../hostpath.ts'
import type { InspectContext } from '../contracts/inspect.ts'

/** The qcow magic, `QFI\xfb`, shared by legacy qcow (v1) and qcow2 (v2, v3). */
export const QCOW_MAGIC = 0x514649fb
/**
 * Byte offsets of the qcow2 header fields (qcow2.txt "Header"; qemu `block/qcow2.h` `QCowHeader`),
 * all big-endian: u32 unless marked u64. Bytes 0-71 are the version 2 header; version 3 adds
 * 72-103 and, with the compression type feature, the one-byte `compression_type` at 104.
 */
export const QCOW2_HEADER = {
  magic: 0,
  version: 4,
  /** u64 */
  backing_file_offset: 8,
  backing_file_size: 16,
  cluster_bits: 20,
  /** u64, the virtual size in bytes */
  size: 24,
  crypt_method: 32,
  l1_size: 36,
  /** u64 */
  l1_table_offset: 40,
  /** u64 */
  refcount_table_offset: 48,
  refcount_table_clusters: 56,
  nb_snapshots: 60,
  /** u64 */
  snapshots_offset: 64,
  /** u64 */
  incompatible_features: 72,
  /** u64 */
  compatible_features: 80,
  /** u64 */
  autoclear_features: 88,
  refcount_order: 96,
  header_length: 100,
  /** u8 */
  compression_type: 104,
} as const
/** Length of the fixed header: version 2 and version 3 (qcow2.txt "Header"). */
const V2_HEADER_LENGTH = 72
const V3_HEADER_LENGTH = 104
const H = QCOW2_HEADER

/** Largest virtual size accepted, bytes (64 TiB; larger declared sizes are treated as hostile). */
export const QCOW2_MAX_VIRTUAL_SIZE = 64 * 2 ** 40
/** Longest backing file name, bytes (qemu's limit, qcow2.txt "backing_file_size"). */
export const QCOW2_MAX_BACKING_NAME = 1023
/** Deepest backing chain followed by {@link resolveQcow2BackingChain}. */
export const QCOW2_MAX_CHAIN_DEPTH = 16
/** Largest L1 table accepted, entries (qemu QCOW_MAX_L1_SIZE: 32 MiB of 8-byte entries). */
export const QCOW2_MAX_L1_ENTRIES = (32 * 1024 * 1024) / 8

/** A header extension (qcow2.txt "Header extensions"): u32 type, u32 length, then its data padded to 8 bytes. */
const EXT = { type: 0, length: 4, data: 8 } as const
/** Header extension types. */
const EXT_END = 0x00000000
const EXT_BACKING_FORMAT = 0xe2792aca
const EXT_DATA_FILE = 0x44415441

/** Incompatible feature bits (qcow2.txt bytes 72-79). */
const INCOMPAT_DIRTY = 1n << 0n
const INCOMPAT_CORRUPT = 1n << 1n
const INCOMPAT_DATA_FILE = 1n << 2n
const INCOMPAT_COMPRESSION = 1n << 3n
const INCOMPAT_EXTL2 = 1n << 4n
const INCOMPAT_KNOWN = INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTL2

/**
 * A parsed qcow2 header. Sizes and offsets are bytes unless named otherwise.
 * - `virtual_size`: guest-visible size (header `size`).
 * - `cluster_bits` (9..21) / `cluster_size` (`1 << cluster_bits`).
 * - `backing_file`: the backing file name as stored (not resolved), or null; `backing_format`
 *   from the backing format header extension (`0xe2792aca`), or null.
 * - `l1_size`: entries of the L1 table; `l1_table_offset`: its byte offset (cluster aligned).
 * - `incompatible_features`/`compatible_features`/`autoclear_features`: the raw v3 bitmaps as
 *   hex strings (`0x...`; zero for v2). `dirty`: incompatible bit 0 (lazy refcounts);
 *   `extended_l2`: bit 4 (128-bit L2 entries with subclusters); `compression_type` from bit 3.
 * - `file_size`: size of the image file.
 */
export interface Qcow2Header {
  version: 2 | 3
  virtual_size: number
  cluster_bits: number
  cluster_size: number
  backing_file: string | null
  backing_format: string | null
  crypt_method: number
  l1_size: number
  l1_table_offset: number
  refcount_table_offset: number
  refcount_table_clusters: number
  nb_snapshots: number
  snapshots_offset: number
  incompatible_features: string
  compatible_features: string
  autoclear_features: string
  refcount_order: number
  header_length: number
  dirty: boolean
  extended_l2: boolean
  compression_type: 'zlib' | 'zstd'
  file_size: number
}

const hex = (v: bigint): string => `0x${v.toString(16)}`

/**
 * Parses the qcow2 header of `buf` (the first bytes of `file`; at least the header cluster or the
 * whole file when shorter) for a file of `fileSize` bytes. Pure: no I/O.
 *
 * @throws E_MIG_UNSUPPORTED_FORMAT no `QFI\xfb` magic; legacy qcow version 1; a version other than
 *   2/3; encryption (`crypt_method` != 0); an external data file; unknown incompatible features.
 * @throws E_MIG_MALFORMED_ARCHIVE header cut short, cluster_bits outside 9..21, virtual size over
 *   64 TiB, L1 table too small for the virtual size or outside the file, bad header_length,
 *   refcount_order over 6, backing file name over 1023 bytes or outside the header cluster,
 *   header extensions overrunning their area, image marked corrupt.
 */
export function parseQcow2Header(buf: Buffer, fileSize: number, file: string): Qcow2Header {
  if (buf.length < 8) throw malformed(file, `qcow2 header cut short (${buf.length} bytes)`)
  if (buf.readUInt32BE(H.magic) !== QCOW_MAGIC) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: not a qcow2 image (no QFI\\xfb magic)`)
  const version = buf.readUInt32BE(H.version)
  if (version === 1) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: legacy qcow (version 1) image is not supported; convert it to qcow2 first`)
  if (version !== 2 && version !== 3) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: qcow2 version ${version} is not supported (2 or 3)`)
  const fixedLen = version === 2 ? V2_HEADER_LENGTH : V3_HEADER_LENGTH
  if (buf.length < fixedLen) throw malformed(file, `qcow2 v${version} header cut short (${buf.length} of ${fixedLen} bytes)`)

  const cluster_bits = buf.readUInt32BE(H.cluster_bits)
  if (cluster_bits < 9 || cluster_bits > 21) throw malformed(file, `cluster_bits ${cluster_bits} outside 9..21`)
  const cluster_size = 2 ** cluster_bits

  const sizeBig = buf.readBigUInt64BE(H.size)
  if (sizeBig > BigInt(QCOW2_MAX_VIRTUAL_SIZE)) throw malformed(file, `virtual size ${sizeBig} bytes exceeds the 64 TiB limit`)
  const virtual_size = Number(sizeBig)

  const crypt_method = buf.readUInt32BE(H.crypt_method)
  if (crypt_method > 2) throw malformed(file, `unknown crypt_method ${crypt_method}`)
  if (crypt_method !== 0) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: encrypted qcow2 (${crypt_method === 1 ? 'AES' : 'LUKS'}) is not supported`)

  let incompat = 0n
  let compat = 0n
  let autoclear = 0n
  let refcount_order = 4
  let header_length = V2_HEADER_LENGTH
  if (version === 3) {
    incompat = buf.readBigUInt64BE(H.incompatible_features)
    compat = buf.readBigUInt64BE(H.compatible_features)
    autoclear = buf.readBigUInt64BE(H.autoclear_features)
    refcount_order = buf.readUInt32BE(H.refcount_order)
    header_length = buf.readUInt32BE(H.header_length)
    if (header_length < V3_HEADER_LENGTH || header_length % 8 !== 0 || header_length > cluster_size) throw malformed(file, `bad header_length ${header_length}`)
    if (refcount_order > 6) throw malformed(file, `refcount_order ${refcount_order} over 6`)
    const unknown = incompat & ~INCOMPAT_KNOWN
    if (unknown !== 0n) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: unknown incompatible qcow2 features ${hex(unknown)}`)
    if (incompat & INCOMPAT_CORRUPT) throw malformed(file, 'image is marked corrupt (incompatible feature bit 1); repair it with qemu-img check -r all')
    if (incompat & INCOMPAT_DATA_FILE) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: qcow2 with an external data file is not supported`)
  }
  const extended_l2 = (incompat & INCOMPAT_EXTL2) !== 0n
  let compression_type: 'zlib' | 'zstd' = 'zlib'
  if (incompat & INCOMPAT_COMPRESSION) {
    if (header_length <= H.compression_type) throw malformed(file, 'compression type feature set but header has no compression_type field')
    const ct = buf[H.compression_type]!
    if (ct === 1) compression_type = 'zstd'
    else if (ct !== 0) throw malformed(file, `unknown compression_type ${ct}`)
  }

  // L1 table: enough entries to map the virtual size, inside the file, cluster aligned.
  const l1_size = buf.readUInt32BE(H.l1_size)
  const l1Off = u64be(buf, H.l1_table_offset)
  if (l1Off === null) throw malformed(file, 'L1 table offset beyond 2^53')
  const l2Entries = cluster_size / (extended_l2 ? 16 : 8)
  const bytesPerL1 = cluster_size * l2Entries
  const needL1 = Math.ceil(virtual_size / bytesPerL1)
  if (l1_size > QCOW2_MAX_L1_ENTRIES) throw malformed(file, `L1 table of ${l1_size} entries is too large`)
  if (l1_size < needL1) throw malformed(file, `L1 table of ${l1_size} entries cannot map ${virtual_size} bytes (needs ${needL1})`)
  if (l1_size > 0) {
    if (l1Off % cluster_size !== 0) throw malformed(file, `L1 table offset ${l1Off} is not cluster aligned`)
    if (l1Off < cluster_size || l1Off + l1_size * 8 > fileSize)
      throw malformed(file, `L1 table (${l1_size} entries at offset ${l1Off}) lies outside the file of ${fileSize} bytes`)
  }

  // Refcount table: aligned, bounded (qemu: 8 MiB), inside the file.
  const rtOff = u64be(buf, H.refcount_table_offset)
  const refcount_table_clusters = buf.readUInt32BE(H.refcount_table_clusters)
  if (rtOff === null || rtOff % cluster_size !== 0 || rtOff === 0) throw malformed(file, `bad refcount table offset ${rtOff ?? 'over 2^53'}`)
  if (refcount_table_clusters === 0 || refcount_table_clusters * cluster_size > 8 * 1024 * 1024)
    throw malformed(file, `bad refcount table size ${refcount_table_clusters} clusters`)
  if (rtOff + refcount_table_clusters * cluster_size > fileSize)
    throw malformed(file, `refcount table at offset ${rtOff} lies outside the file of ${fileSize} bytes`)

  // Snapshot table: bounded count (qemu QCOW_MAX_SNAPSHOTS), aligned, inside the file.
  const nb_snapshots = buf.readUInt32BE(H.nb_snapshots)
  const snOff = u64be(buf, H.snapshots_offset)
  if (nb_snapshots > 65536) throw malformed(file, `${nb_snapshots} snapshots exceeds 65536`)
  if (snOff === null) throw malformed(file, 'snapshot table offset beyond 2^53')
  if (nb_snapshots > 0 && (snOff % cluster_size !== 0 || snOff === 0 || snOff >= fileSize)) throw malformed(file, `snapshot table offset ${snOff} invalid`)

  // Backing file name: inside the header cluster, at most 1023 bytes.
  const bfOff = u64be(buf, H.backing_file_offset)
  const bfSize = buf.readUInt32BE(H.backing_file_size)
  let backing_file: string | null = null
  if (bfOff === null) throw malformed(file, 'backing file offset beyond 2^53')
  if (bfOff !== 0) {
    if (bfSize === 0) throw malformed(file, 'backing file offset set with an empty name')
    if (bfSize > QCOW2_MAX_BACKING_NAME) throw malformed(file, `backing file name of ${bfSize} bytes exceeds ${QCOW2_MAX_BACKING_NAME}`)
    if (bfOff < header_length || bfOff + bfSize > cluster_size)
      throw malformed(file, `backing file name at offset ${bfOff} (+${bfSize}) lies outside the header cluster`)
    if (bfOff + bfSize > buf.length) throw malformed(file, `backing file name at offset ${bfOff} (+${bfSize}) is cut short by the end of the file`)
    const raw = buf.subarray(bfOff, bfOff + bfSize)
    if (raw.includes(0)) throw malformed(file, 'backing file name contains a NUL byte')
    backing_file = raw.toString('utf8')
  }

  // Header extensions: from header_length to the backing file name or the end of the cluster.
  let backing_format: string | null = null
  const extEnd = Math.min(bfOff !== 0 ? bfOff : cluster_size, buf.length)
  let at = header_length
  while (at + EXT.data <= extEnd) {
    const type = buf.readUInt32BE(at + EXT.type)
    const len = buf.readUInt32BE(at + EXT.length)
    if (type === EXT_END) break
    const dataEnd = at + EXT.data + len
    if (dataEnd > extEnd) throw malformed(file, `header extension 0x${type.toString(16)} at offset ${at} (${len} bytes) overruns the header area`)
    if (type === EXT_BACKING_FORMAT) {
      if (len === 0 || len > 16) throw malformed(file, `backing format extension of ${len} bytes`)
      const f = buf
        .subarray(at + EXT.data, dataEnd)
        .toString('latin1')
        .replace(/\0+$/, '')
      if (!/^[a-z0-9_+.-]+$/i.test(f)) throw malformed(file, `backing format ${JSON.stringify(f)} is not a driver name`)
      backing_format = f
    } else if (type === EXT_DATA_FILE) {
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: qcow2 with an external data file is not supported`)
    }
    at = dataEnd + ((8 - (len % 8)) % 8)
  }

  return {
    version: version as 2 | 3,
    virtual_size,
    cluster_bits,
    cluster_size,
    backing_file,
    backing_format,
    crypt_method,
    l1_size,
    l1_table_offset: l1Off,
    refcount_table_offset: rtOff,
    refcount_table_clusters,
    nb_snapshots,
    snapshots_offset: snOff,
    incompatible_features: hex(incompat),
    compatible_features: hex(compat),
    autoclear_features: hex(autoclear),
    refcount_order,
    header_length,
    dirty: (incompat & INCOMPAT_DIRTY) !== 0n,
    extended_l2,
    compression_type,
    file_size: fileSize,
  }
}

/**
 * Reads and checks the qcow2 header of `file` (reads at most the first cluster, 2 MiB at most).
 * @returns the {@link Qcow2Header}.
 * @throws E_MIG_UNSUPPORTED_FORMAT / E_MIG_MALFORMED_ARCHIVE as {@link parseQcow2Header}.
 * @throws E_MIG_DISK_READ_FAILED the file cannot be opened or read.
 */
export async function readQcow2Header(file: string): Promise<Qcow2Header> {
  const fh = await openRead(file)
  try {
    return await readQcow2HeaderFrom(fh, file)
  } finally {
    await fh.close()
  }
}

/**
 * {@link readQcow2Header} of an open file: `fh` is read (never closed), inside `win` when given
 * (an image stored as a tar member: offsets relative to the window, `file_size` its length);
 * `file` names it in messages. Same result and errors.
 */
export async function readQcow2HeaderFrom(fh: FileHandle, file: string, win?: FileWindow): Promise<Qcow2Header> {
  const fileSize = win ? win.length : (await fh.stat()).size
  const head = await readInWindow(fh, file, win, Math.min(fileSize, 4096), 0)
  let buf = head
  if (head.length >= H.size && head.readUInt32BE(H.magic) === QCOW_MAGIC) {
    const bits = head.readUInt32BE(H.cluster_bits)
    if (bits >= 9 && bits <= 21 && 2 ** bits > head.length && fileSize > head.length) {
      buf = await readInWindow(fh, file, win, Math.min(fileSize, 2 ** bits), 0)
    }
  }
  return parseQcow2Header(buf, fileSize, file)
}

/** Bits 9-55 of an L1 or L2 entry given as its two big-endian halves (qcow2.txt "Cluster mapping"): the host offset, bytes. */
const hostOffset = (hi: number, lo: number): number => (hi & 0x00ffffff) * 2 ** 32 + ((lo & 0xfffffe00) >>> 0)

/**
 * One decoded L1 entry (qcow2.txt "Cluster mapping", L1 table entry): `l2Offset` the byte
 * offset of the L2 table (0: unallocated, every cluster it maps reads as zeros without a backing
 * file); `reserved` true when bits 1-8 or 56-62 are set (they must be 0). `at` is the entry's
 * byte offset in `buf` (8-byte big-endian entries).
 */
export function qcow2L1EntryAt(buf: Buffer, at: number): { l2Offset: number; reserved: boolean } {
  const hi = buf.readUInt32BE(at)
  const lo = buf.readUInt32BE(at + 4)
  return { l2Offset: hostOffset(hi, lo), reserved: (hi & 0x7f000000) !== 0 || (lo & 0x1ff) !== 0 }
}

/**
 * One decoded standard L2 entry (qcow2.txt "Cluster mapping", 64-bit entries, no extended L2):
 * - `compressed`: bit 62 (a compressed cluster descriptor; the other fields are then not set);
 * - `zero`: bit 0, the cluster reads as zeros (version 3; in version 2 the bit is reserved and
 *   reported in `reserved`);
 * - `offset`: bits 9-55, the host cluster's byte offset (0 with `zero` false: unallocated, reads
 *   as zeros without a backing file);
 * - `reserved`: bits 1-8 or 56-61 set (they must be 0).
 * `at` is the entry's byte offset in `buf`.
 */
export function qcow2L2EntryAt(buf: Buffer, at: number, version: 2 | 3): { compressed: boolean; zero: boolean; offset: number; reserved: boolean } {
  const hi = buf.readUInt32BE(at)
  const lo = buf.readUInt32BE(at + 4)
  if (hi & 0x40000000) return { compressed: true, zero: false, offset: 0, reserved: false }
  const zeroBit = (lo & 1) !== 0
  return {
    compressed: false,
    zero: version === 3 && zeroBit,
    offset: hostOffset(hi, lo),
    reserved: (hi & 0x3f000000) !== 0 || (lo & 0x1fe) !== 0 || (version === 2 && zeroBit),
  }
}

/**
 * One parent image of a qcow2 backing chain.
 * - `path`: absolute, symlink-free path inside the import root.
 * - `format`: qemu driver name (from the child's backing format extension, else sniffed: `qcow2`
 *   when the parent has the qcow2 magic), or null when unknown (qemu will probe it).
 * - `name`: the backing file name as the child recorded it.
 */
export interface Qcow2ChainLink {
  path: string
  format: string | null
  name: string
}

/** True when `name` is a qemu protocol or `json:` pseudo-filename rather than a plain path. */
function isProtocolName(name: string): boolean {
  const colon = name.indexOf(':')
  if (colon < 0) return false
  const slash = name.indexOf('/')
  return slash < 0 || colon < slash
}

async function sniffQcow(file: string): Promise<boolean> {
  const fh = await openRead(file)
  try {
    const b = await readAt(fh, file, 4, 0)
    return b.length === 4 && b.readUInt32BE(H.magic) === QCOW_MAGIC
  } finally {
    await fh.close()
  }
}

/**
 * Follows the backing files of the qcow2 image `file`, nearest parent first. Each backing name is
 * taken relative to the folder of the image that names it (as qemu does) and confined to
 * `ctx.importRoot` with `resolveInRoot`. The chain is followed through qcow2 parents; a parent of
 * another format ends it (it is listed, not opened).
 *
 * @returns the parents, nearest first (empty when `file` has no backing file).
 * @throws E_MIG_HOST_PATH_REJECTED a backing name escapes the import root, or is a qemu protocol /
 *   `json:` pseudo-filename.
 * @throws E_MIG_MALFORMED_ARCHIVE a backing file that does not exist, a loop, a chain deeper than
 *   16, or a malformed parent header.
 * @throws E_MIG_UNSUPPORTED_FORMAT / E_MIG_DISK_READ_FAILED as {@link readQcow2Header}.
 */
export async function resolveQcow2BackingChain(file: string, ctx: InspectContext): Promise<Qcow2ChainLink[]> {
  let cur: string
  try {
    cur = remoteInput(file) ? file : await realpath(file)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${file}: cannot open: ${(e as Error).message}`, { cause: e })
  }
  const seen = new Set<string>([cur])
  const chain: Qcow2ChainLink[] = []
  let header = await readQcow2Header(cur)
  while (header.backing_file !== null) {
    const name = header.backing_file
    if (remoteInput(cur))
      throw new MigError(
        'E_MIG_UNSUPPORTED_FORMAT',
        `${cur}: a remote qcow2 image with a backing file (${JSON.stringify(name)}) is not read; flatten it at the source (qemu-img convert)`,
      )
    if (chain.length >= QCOW2_MAX_CHAIN_DEPTH) throw malformed(file, `backing chain deeper than ${QCOW2_MAX_CHAIN_DEPTH}`)
    let plain = name
    if (plain.startsWith('file:')) plain = plain.slice(5)
    if (isProtocolName(plain)) {
      throw new MigError(
        'E_MIG_HOST_PATH_REJECTED',
        `${cur}: backing file ${JSON.stringify(name)} is a qemu protocol or json: name, not a file in the import root`,
        { details: { path: name } },
      )
    }
    const abs = resolveInRoot(ctx.importRoot, plain, { base: nodePath.dirname(cur), allowUploads: ctx.allowUploads })
    if (seen.has(abs)) throw malformed(cur, `backing chain loops back to ${abs}`)
    try {
      const st = await statPath(abs)
      if (!st.isFile()) throw new Error('not a regular file')
    } catch (e) {
      throw malformed(cur, `backing file ${JSON.stringify(name)} not found (${(e as Error).message})`)
    }
    seen.add(abs)
    let format = header.backing_format
    if (format === null && (await sniffQcow(abs))) format = 'qcow2'
    chain.push({ path: abs, format, name })
    if (format !== 'qcow2') break
    header = await readQcow2Header(abs)
    cur = abs
  }
  return chain
}
