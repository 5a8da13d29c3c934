/**
 * The ESXi seSparse extent (space-efficient sparse, `createType=seSparse`). The format is not
 * published; this follows qemu's reader (`block/vmdk.c`, `vmdk_open_se_sparse` and
 * `get_cluster_offset`) and refuses what it refuses:
 * - const header (sector 0): magic `0xcafebabe` as a 64-bit word, version `0x200000001`, then
 *   64-bit fields (index: 2 capacity, 3 grain size = 8 sectors, 4 grain table size = 64 sectors,
 *   5 flags = 0, 6..9 reserved = 0, 10 volatile header offset, 16/17 grain directory offset and
 *   size, 18 grain tables offset, 24 grains offset; all in sectors), zero padding from byte 208;
 * - volatile header: magic `0xcafecafe` as a 64-bit word, `replayJournal` at byte 24 (a dirty
 *   file whose journal needs replaying is refused);
 * - grain directory entries: 64-bit, 0 = no table, else `0x1000_0000_<table index>`;
 * - grain table entries: 64-bit (4096 per table), by top nibble: 0 unallocated (the parent's
 *   data), 1 unmapped and 2 zero (read as zeros), 3 allocated, the grain number split as qemu's
 *   `get_cluster_offset` decodes it.
 * Pure: buffers in, values out. Sector fields are 512-byte sectors.
 */
import { malformed, unsupported } from './faults.ts'
import { MAX_CAPACITY_SECTORS, SECTOR } from './limits.ts'
import type { SparseCodec } from './sparse-codec.ts'

/** The magic of the seSparse const header and of its volatile header (64-bit words). */
export const SESPARSE_CONST_MAGIC = 0xcafebaben
export const SESPARSE_VOLATILE_MAGIC = 0xcafecafen

/**
 * Byte offsets of the seSparse const header's 64-bit little-endian fields (qemu `block/vmdk.c`
 * `VMDKSESparseConstHeader`), sectors unless marked; zero padding from `pad` to the sector's end.
 */
export const SESPARSE_CONST_HEADER = {
  magic: 0,
  /** `0x200000001`: low word 1, high word 2 */
  version: 8,
  capacity: 16,
  grain_size: 24,
  grain_table_size: 32,
  flags: 40,
  /** four reserved words, 0 */
  reserved: 48,
  volatile_header_offset: 80,
  grain_dir_offset: 128,
  grain_dir_size: 136,
  grain_tables_offset: 144,
  grains_offset: 192,
  pad: 208,
} as const
const H = SESPARSE_CONST_HEADER
/** Byte offsets of the seSparse volatile header's 64-bit fields (qemu `VMDKSESparseVolatileHeader`). */
export const SESPARSE_VOLATILE_HEADER = { magic: 0, replay_journal: 24 } as const

/** Entries per seSparse grain table (64 sectors of 64-bit entries). */
export const SESPARSE_GT_ENTRIES = 4096
/** seSparse grain, sectors (4 KiB). */
export const SESPARSE_GRAIN_SECTORS = 8

/** The fields of an seSparse const header that locate its metadata, sectors. */
export interface SeSparseHeader {
  capacity: number
  volatileOffset: number
  gdOffset: number
  gdSize: number
  tablesOffset: number
  grainsOffset: number
}

/** Whether `b` starts with the seSparse const header magic. */
export function isSeSparse(b: Buffer): boolean {
  return b.length >= 8 && b.readBigUInt64LE(H.magic) === SESPARSE_CONST_MAGIC
}

/**
 * Parses the seSparse const header in `b` (512 bytes). Throws `E_MIG_UNSUPPORTED_FORMAT` (another
 * version, grain or table size, flags or reserved fields set: only the layout ESXi writes) and
 * `E_MIG_MALFORMED_ARCHIVE` (no magic, short header, offsets or capacity out of range).
 */
export function parseSeSparseHeader(b: Buffer, label: string): SeSparseHeader {
  if (b.length < SECTOR || !isSeSparse(b)) throw malformed(label, 'not a complete seSparse const header')
  const f = (at: number) => {
    const v = b.readBigUInt64LE(at)
    return v > BigInt(Number.MAX_SAFE_INTEGER) ? -1 : Number(v)
  }
  const [versionLo, versionHi] = [b.readUInt32LE(H.version), b.readUInt32LE(H.version + 4)]
  if (versionLo !== 1 || versionHi !== 2)
    throw unsupported(label, `unsupported seSparse version 0x${versionHi.toString(16)}${versionLo.toString(16).padStart(8, '0')}`)
  const [capacity, grainSize, gtSize, flags] = [f(H.capacity), f(H.grain_size), f(H.grain_table_size), f(H.flags)]
  if (
    grainSize !== SESPARSE_GRAIN_SECTORS ||
    gtSize !== 64 ||
    flags !== 0 ||
    [0, 1, 2, 3].some((i) => f(H.reserved + i * 8) !== 0) ||
    !b.subarray(H.pad, SECTOR).every((x) => x === 0)
  ) {
    throw unsupported(
      label,
      `seSparse with grain size ${grainSize}, table size ${gtSize}, flags ${flags} or reserved fields set is not read (only the layout ESXi writes)`,
    )
  }
  const [volatileOffset, gdOffset, gdSize, tablesOffset, grainsOffset] = [
    f(H.volatile_header_offset),
    f(H.grain_dir_offset),
    f(H.grain_dir_size),
    f(H.grain_tables_offset),
    f(H.grains_offset),
  ]
  if ([capacity, volatileOffset, gdOffset, gdSize, tablesOffset, grainsOffset].some((v) => v < 0 || v > 2 ** 40))
    throw malformed(label, 'implausible seSparse header offsets')
  if (capacity > MAX_CAPACITY_SECTORS) throw malformed(label, `implausible capacity ${capacity} sectors`)
  return { capacity, volatileOffset, gdOffset, gdSize, tablesOffset, grainsOffset }
}

/**
 * Checks the seSparse volatile header in `v` (one sector at `volatileOffset`). Throws
 * `E_MIG_MALFORMED_ARCHIVE` (bad magic) and `E_MIG_UNSUPPORTED_FORMAT` (a journal to replay).
 */
export function checkSeSparseVolatile(v: Buffer, label: string): void {
  if (v.length < 32 || v.readBigUInt64LE(SESPARSE_VOLATILE_HEADER.magic) !== SESPARSE_VOLATILE_MAGIC)
    throw malformed(label, 'bad seSparse volatile header magic')
  if (v.readBigUInt64LE(SESPARSE_VOLATILE_HEADER.replay_journal) !== 0n)
    throw unsupported(label, 'the seSparse file is dirty (its journal needs replaying); consolidate the VM on ESXi first')
}

/**
 * The grain table codec of an seSparse extent whose header is `h`. Throws
 * `E_MIG_MALFORMED_ARCHIVE` when the grain directory does not cover the capacity, a directory
 * entry is not an allocated table, or a table entry has an invalid state.
 */
export function seSparseCodec(h: SeSparseHeader, label: string): SparseCodec {
  const gdEntries = (h.gdSize * SECTOR) / 8
  if (gdEntries * SESPARSE_GT_ENTRIES * SESPARSE_GRAIN_SECTORS < h.capacity)
    throw malformed(label, `seSparse grain directory of ${gdEntries} entries does not cover ${h.capacity} sectors`)
  const tableBytes = SESPARSE_GT_ENTRIES * 8
  const grainBytes = SESPARSE_GRAIN_SECTORS * SECTOR
  return {
    format: 'sesparse',
    capacityBytes: h.capacity * SECTOR,
    grainBytes,
    gtEntries: SESPARSE_GT_ENTRIES,
    gdOffset: h.gdOffset * SECTOR,
    gdEntries,
    entryBytes: 8,
    tableAt(gd, i) {
      const lo = gd.readUInt32LE(i * 8)
      const hi = gd.readUInt32LE(i * 8 + 4)
      if (hi === 0 && lo === 0) return -1
      if (hi !== 0x10000000)
        throw malformed(label, `grain directory entry ${i} is not an allocated table (0x${hi.toString(16)}${lo.toString(16).padStart(8, '0')})`)
      return h.tablesOffset * SECTOR + lo * tableBytes
    },
    grainOf(words, k, g) {
      const lo = words[2 * k]
      const hi = words[2 * k + 1]
      const state = hi >>> 28
      if (state === 0) {
        if (hi !== 0 || lo !== 0) throw malformed(label, `grain ${g}: invalid unallocated entry`)
        return 'absent'
      }
      if (state === 1 || state === 2) return 'zero'
      if (state !== 3) throw malformed(label, `grain ${g}: invalid grain table entry state ${state}`)
      const cluster = ((hi >>> 16) & 0xfff) + ((hi & 0xffff) * 2 ** 32 + lo) * 4096
      return h.grainsOffset * SECTOR + cluster * grainBytes
    },
  }
}
