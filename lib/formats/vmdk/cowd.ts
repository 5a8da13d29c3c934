/**
 * The ESX Server sparse extent, vmfsSparse (magic `COWD`; VMware "Virtual Disk Format 5.0", "ESX
 * Server Sparse Extent Header", and the VMDK3 header of qemu `block/vmdk.c`): a 2048-byte header,
 * a grain directory of 32-bit sector entries, grain tables of 4096 32-bit sector entries. Pure:
 * buffers in, values out.
 */
import { malformed, unsupported } from './faults.ts'
import { sectorCodec, type VmdkSparseHeader } from './hosted-sparse.ts'
import { MAX_GRAIN_SECTORS, SECTOR } from './limits.ts'
import type { SparseCodec } from './sparse-codec.ts'

/** The ESX Server sparse extent's magic, the first four bytes of the extent (`COWDISK_MAGIC` 0x44574f43 read as text). */
export const COWD_MAGIC = 'COWD'

/**
 * Byte offsets of the 2048-byte COWDisk_Header (VMDK 5.0 "ESX Server Sparse Extent Header"; qemu
 * `block/vmdk.c` `VMDK3Header`), little-endian u32 unless marked.
 */
export const COWD_HEADER = {
  /** 4 bytes, `COWD` */
  magic: 0,
  version: 4,
  flags: 8,
  num_sectors: 12,
  grain_size: 16,
  gd_offset: 20,
  num_gd_entries: 24,
  free_sector: 28,
  /** the root/child union: a child's NUL-terminated parent file name, 1024 bytes */
  parent_file_name: 32,
  unclean_shutdown: 1648,
} as const
const C = COWD_HEADER
const PARENT_NAME_BYTES = 1024

/** Bytes of a COWD header. */
export const COWD_HEADER_BYTES = 2048
/** Entries per COWD grain table. */
export const COWD_GT_ENTRIES = 4096

/**
 * Parses the COWDisk_Header in `b` (2048 bytes LE: magic, version, flags, numSectors, grainSize,
 * gdOffset, numGDEntries, freeSector at 0..28; the root/child union at 32 (1028 bytes),
 * generation 1060, name 1064, description 1124, savedGeneration 1636, reserved 1640,
 * uncleanShutdown 1648) onto the {@link VmdkSparseHeader} names (`numSectors` -> `capacity`,
 * `numGDEntries` -> `gdEntries`). `extentBytes`: the extent's length, for `truncated`.
 *
 * Throws `E_MIG_MALFORMED_ARCHIVE` (short header, grain size not a power of two up to 1 GiB) and
 * `E_MIG_UNSUPPORTED_FORMAT` (version other than 1).
 */
export function parseCowdHeader(b: Buffer, label: string, extentBytes: number): VmdkSparseHeader {
  if (b.length < COWD_HEADER_BYTES) throw malformed(label, `COWD header truncated (${b.length} of 2048 bytes)`)
  const version = b.readUInt32LE(C.version)
  const flags = b.readUInt32LE(C.flags)
  const capacity = b.readUInt32LE(C.num_sectors)
  const grainSize = b.readUInt32LE(C.grain_size)
  const gdOffset = b.readUInt32LE(C.gd_offset)
  const gdEntries = b.readUInt32LE(C.num_gd_entries)
  const freeSector = b.readUInt32LE(C.free_sector)
  if (version !== 1) throw unsupported(label, `COWD header version ${version} (1 supported)`)
  if (grainSize < 1 || grainSize > MAX_GRAIN_SECTORS || (grainSize & (grainSize - 1)) !== 0)
    throw malformed(label, `COWD grain size ${grainSize} is not a power of two`)
  // The union: root {cylinders, heads, sectors} or child {parentFileName[1024], parentGeneration}.
  // A child (redo log) has a NUL-terminated parent name there; a root starts with small numbers.
  let parentFileName: string | null = null
  const nameBytes = b.subarray(C.parent_file_name, C.parent_file_name + PARENT_NAME_BYTES)
  const nul = nameBytes.indexOf(0)
  if (nul > 4) {
    const s = nameBytes.toString('utf8', 0, nul)
    if (/^[\x20-\x7e\u00a0-\uffff]+$/.test(s)) parentFileName = s
  }
  const endSectors = Math.floor(extentBytes / SECTOR)
  const truncated = gdOffset > endSectors || freeSector > endSectors + 1
  return {
    magic: COWD_MAGIC,
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
    numGTEsPerGT: COWD_GT_ENTRIES,
    rgdOffset: 0,
    gdOffset,
    gdAtEnd: false,
    fromFooter: false,
    overHead: 4,
    uncleanShutdown: b.readUInt32LE(C.unclean_shutdown) !== 0,
    compressAlgorithm: 0,
    gdEntries,
    freeSector,
    truncated,
    extentBytes,
    parentFileName,
  }
}

/**
 * The grain table codec of a COWD extent whose header is `h`. Throws `E_MIG_MALFORMED_ARCHIVE`
 * when the grain directory does not cover the capacity.
 */
export function cowdCodec(h: VmdkSparseHeader, label: string): SparseCodec {
  if (h.gdEntries * COWD_GT_ENTRIES * h.grainSize < h.capacity)
    throw malformed(label, `grain directory of ${h.gdEntries} entries does not cover ${h.capacity} sectors`)
  return sectorCodec('cowd', h.capacity, h.grainSize, COWD_GT_ENTRIES, h.gdOffset ?? 0, h.gdEntries, false)
}
