/**
 * The hosted sparse extent (magic `KDMV`; VMware "Virtual Disk Format 5.0", "Hosted Sparse Extent
 * Header" and "Stream-Optimized Compressed Sparse Extents"; qemu `block/vmdk.c` for the footer of
 * `gdOffset == GD_AT_END` and the accepted header bounds): the 512-byte header, the
 * stream-optimized footer, and the grain directory / grain table codec (32-bit entries in
 * sectors; entry 1 is a zeroed grain when flag bit 2 is set). Pure: buffers in, values out.
 * All `*Sectors`/sector fields are 512-byte sectors.
 */
import { u64le } from '../../bytes.ts'
import { malformed, unsupported } from './faults.ts'
import { MAX_CAPACITY_SECTORS, MAX_DESCRIPTOR_BYTES, MAX_GRAIN_SECTORS, MAX_GTES_PER_GT, SECTOR } from './limits.ts'
import type { SparseCodec } from './sparse-codec.ts'

/** The hosted sparse extent's magic, the first four bytes of the extent (`SPARSE_MAGICNUMBER` 0x564d444b read as text). */
export const VMDK_SPARSE_MAGIC = 'KDMV'

/**
 * Byte offsets of the 512-byte hosted sparse extent header (VMDK 5.0 "SparseExtentHeader"; qemu
 * `block/vmdk.c` `VMDK4Header`, which starts after the magic), little-endian: u64 in sectors
 * unless marked.
 */
export const KDMV_HEADER = {
  /** 4 bytes, `KDMV` */
  magic: 0,
  /** u32 */
  version: 4,
  /** u32 */
  flags: 8,
  capacity: 12,
  grain_size: 20,
  descriptor_offset: 28,
  descriptor_size: 36,
  /** u32 */
  num_gtes_per_gt: 44,
  rgd_offset: 48,
  gd_offset: 56,
  overhead: 64,
  /** u8 */
  unclean_shutdown: 72,
  /** 4 bytes: `\n`, ` `, `\r`, `\n` */
  newline_check: 73,
  /** u16 */
  compress_algorithm: 77,
} as const
const K = KDMV_HEADER
/** The newline check bytes a header written in binary mode holds. */
const NEWLINE_CHECK = [0x0a, 0x20, 0x0d, 0x0a]

/**
 * Byte offsets of a stream-optimized extent's marker (VMDK 5.0 "Stream-Optimized Compressed
 * Sparse Extents"; qemu `block/vmdk.c` `VmdkGrainMarker`), little-endian: the sector (`lba`, u64),
 * the compressed size (u32; 0 for a metadata marker, which then has a u32 `type`), then the data.
 */
export const VMDK_MARKER = { lba: 0, size: 8, type: 12 } as const

/** `gdOffset` value of a stream-optimized header whose real value is in the footer. */
export const GD_AT_END = 0xffffffffffffffffn
const FLAG_NL_DETECT = 1 << 0
const FLAG_RGD = 1 << 1
const FLAG_ZERO_GRAIN = 1 << 2
const FLAG_COMPRESSED = 1 << 16
const FLAG_MARKERS = 1 << 17
const MARKER_EOS = 0
const MARKER_FOOTER = 3

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

/**
 * Parses the 512-byte hosted sparse header in `b` (`label` names it in errors). Fields come as
 * written (`gdOffset` null and `gdAtEnd` true for `GD_AT_END`); `truncated`, `extentBytes` and
 * `fromFooter` are left for the caller that knows the extent's length.
 *
 * Throws `E_MIG_MALFORMED_ARCHIVE` (version 0, capacity over 64 TiB, grain size not a power of
 * two up to 1 GiB, descriptor over 4 MiB, `numGTEsPerGT` out of 1..512, offsets out of range,
 * corrupted newline check bytes) and `E_MIG_UNSUPPORTED_FORMAT` (version > 3, compression other
 * than none/deflate).
 */
export function parseKdmvHeader(b: Buffer, label: string): VmdkSparseHeader {
  if (b.length < SECTOR || b.toString('latin1', K.magic, K.magic + 4) !== VMDK_SPARSE_MAGIC)
    throw malformed(label, `not a complete ${VMDK_SPARSE_MAGIC} sparse extent header (${b.length} bytes)`)
  const version = b.readUInt32LE(K.version)
  if (version === 0) throw malformed(label, 'sparse header version 0')
  if (version > 3) throw unsupported(label, `sparse header version ${version} (1..3 supported)`)
  const flags = b.readUInt32LE(K.flags)
  const capacity = u64le(b, K.capacity)
  const grainSize = u64le(b, K.grain_size)
  const descriptorOffset = u64le(b, K.descriptor_offset)
  const descriptorSize = u64le(b, K.descriptor_size)
  const numGTEsPerGT = b.readUInt32LE(K.num_gtes_per_gt)
  const rgdOffset = u64le(b, K.rgd_offset)
  const gdRaw = b.readBigUInt64LE(K.gd_offset)
  const overHead = u64le(b, K.overhead)
  const uncleanShutdown = b[K.unclean_shutdown] !== 0
  const compressAlgorithm = b.readUInt16LE(K.compress_algorithm)
  if (capacity === null || capacity > MAX_CAPACITY_SECTORS) throw malformed(label, 'capacity larger than 64 TiB')
  if (grainSize === null || grainSize < 1 || grainSize > MAX_GRAIN_SECTORS || (grainSize & (grainSize - 1)) !== 0) {
    throw malformed(label, `grain size ${b.readBigUInt64LE(K.grain_size)} sectors is not a power of two up to 1 GiB`)
  }
  if (descriptorOffset === null || descriptorSize === null) throw malformed(label, 'descriptor offset/size out of range')
  if (descriptorSize * SECTOR > MAX_DESCRIPTOR_BYTES) throw malformed(label, `embedded descriptor of ${descriptorSize} sectors exceeds 4 MiB`)
  if (numGTEsPerGT < 1 || numGTEsPerGT > MAX_GTES_PER_GT) throw malformed(label, `numGTEsPerGT ${numGTEsPerGT} out of 1..${MAX_GTES_PER_GT}`)
  if (rgdOffset === null || overHead === null) throw malformed(label, 'grain directory or overhead offset out of range')
  const gdAtEnd = gdRaw === GD_AT_END
  if (!gdAtEnd && gdRaw > BigInt(Number.MAX_SAFE_INTEGER)) throw malformed(label, 'grain directory offset out of range')
  if (flags & FLAG_NL_DETECT) {
    if (NEWLINE_CHECK.some((byte, i) => b[K.newline_check + i] !== byte)) {
      throw malformed(label, 'newline check bytes corrupted (file transferred in text mode?)')
    }
  }
  if (compressAlgorithm > 1) throw unsupported(label, `compression algorithm ${compressAlgorithm} (0 none, 1 deflate)`)
  return {
    magic: VMDK_SPARSE_MAGIC,
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
 * The footer of a stream-optimized extent from `tail`, the extent's last three sectors (footer
 * marker, footer header, end-of-stream marker; the footer sits 1024 bytes before the end, as
 * qemu reads it), or null when they are not there (the extent is truncated).
 * Throws as {@link parseKdmvHeader}, and `E_MIG_MALFORMED_ARCHIVE` when the footer says
 * `GD_AT_END` too.
 */
export function parseStreamFooter(tail: Buffer, label: string): VmdkSparseHeader | null {
  const ok =
    tail.length === 3 * SECTOR &&
    tail.readUInt32LE(VMDK_MARKER.size) === 0 &&
    tail.readUInt32LE(VMDK_MARKER.type) === MARKER_FOOTER &&
    tail.toString('latin1', SECTOR + K.magic, SECTOR + K.magic + 4) === VMDK_SPARSE_MAGIC &&
    tail.readBigUInt64LE(2 * SECTOR + VMDK_MARKER.lba) === 0n &&
    tail.readUInt32LE(2 * SECTOR + VMDK_MARKER.size) === 0 &&
    tail.readUInt32LE(2 * SECTOR + VMDK_MARKER.type) === MARKER_EOS
  if (!ok) return null
  const footer = parseKdmvHeader(tail.subarray(SECTOR, 2 * SECTOR), `${label} footer`)
  if (footer.gdAtEnd) throw malformed(label, 'footer grain directory offset is GD_AT_END too')
  return footer
}

/**
 * Whether the grain table codec ({@link hostedSparseCodec}) reads the extent of header `h`:
 * grains not compressed, no grain markers, the grain directory in place (not `GD_AT_END`).
 */
export function isPlainHostedSparse(h: VmdkSparseHeader): h is VmdkSparseHeader & { gdOffset: number } {
  return !h.gdAtEnd && h.gdOffset !== null && !h.compressedGrains && !h.markers && h.compressAlgorithm === 0
}

/**
 * The grain table codec of a hosted sparse extent whose header is `h` (not compressed, grain
 * directory in place): 32-bit directory and table entries in sectors, 0 = absent (the parent's
 * data), 1 = a zeroed grain when `zeroedGrainTableEntries` is set. `fileBytes`: the extent's
 * length, for bounds. Throws `E_MIG_UNSUPPORTED_FORMAT` for compressed or stream-optimized
 * grains (read by qemu's driver only, not by the grain table reader).
 */
export function hostedSparseCodec(h: VmdkSparseHeader, label: string): SparseCodec {
  if (!isPlainHostedSparse(h)) throw unsupported(label, 'compressed or stream-optimized grains are not read by the grain table reader')
  return sectorCodec('hosted', h.capacity, h.grainSize, h.numGTEsPerGT, h.gdOffset, h.gdEntries, h.zeroedGrainTableEntries)
}

/**
 * The grain table codec of a stream-optimized extent (VMDK 5.0 "Stream-Optimized Compressed
 * Sparse Extents"; qemu `block/vmdk.c` reads the same): `h` the header with the grain directory
 * in place (the footer's, when the first header says `GD_AT_END`), grains compressed with
 * deflate (`compressAlgorithm` 1) and preceded by a grain marker (flag bit 17). A table entry is
 * the sector of the grain's marker (0: absent; 1: zero when `zeroedGrainTableEntries` is set).
 * Throws `E_MIG_UNSUPPORTED_FORMAT` for any other hosted sparse extent (the
 * {@link hostedSparseCodec} reads the uncompressed ones), `E_MIG_MALFORMED_ARCHIVE` when the
 * grain directory is still `GD_AT_END`.
 */
export function streamOptimizedCodec(h: VmdkSparseHeader, label: string): SparseCodec {
  if (!h.compressedGrains || !h.markers || h.compressAlgorithm !== 1)
    throw unsupported(label, 'not a stream-optimized extent (deflate-compressed grains with markers)')
  if (h.gdOffset === null) throw malformed(label, 'stream-optimized extent without a footer: its grain directory is not known (truncated?)')
  return { ...sectorCodec('hosted', h.capacity, h.grainSize, h.numGTEsPerGT, h.gdOffset, h.gdEntries, h.zeroedGrainTableEntries), compressed: true }
}

/**
 * The codec shared by the two formats with 32-bit sector entries (hosted sparse and COWD): a
 * directory entry is the sector of a grain table (0: none), a table entry the sector of a grain
 * (0: absent; 1: zero when `zeroGrain`).
 */
export function sectorCodec(
  format: 'hosted' | 'cowd',
  capacity: number,
  grainSectors: number,
  gtEntries: number,
  gdSector: number,
  gdEntries: number,
  zeroGrain: boolean,
): SparseCodec {
  return {
    format,
    capacityBytes: capacity * SECTOR,
    grainBytes: grainSectors * SECTOR,
    gtEntries,
    gdOffset: gdSector * SECTOR,
    gdEntries,
    entryBytes: 4,
    tableAt(gd, i) {
      const e = gd.readUInt32LE(i * 4)
      return e === 0 ? -1 : e * SECTOR
    },
    grainOf(words, k) {
      const e = words[k]
      if (e === 0) return 'absent'
      if (e === 1 && zeroGrain) return 'zero'
      return e * SECTOR
    },
  }
}
