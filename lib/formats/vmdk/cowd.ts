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
  const version = b.readUInt32LE(4)
  const flags = b.readUInt32LE(8)
  const capacity = b.readUInt32LE(12)
  const grainSize = b.readUInt32LE(16)
  const gdOffset = b.readUInt32LE(20)
  const gdEntries = b.readUInt32LE(24)
  const freeSector = b.readUInt32LE(28)
  if (version !== 1) throw unsupported(label, `COWD header version ${version} (1 supported)`)
  if (grainSize < 1 || grainSize > MAX_GRAIN_SECTORS || (grainSize & (grainSize - 1)) !== 0)
    throw malformed(label, `COWD grain size ${grainSize} is not a power of two`)
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
    numGTEsPerGT: COWD_GT_ENTRIES,
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

/**
 * The grain table codec of a COWD extent whose header is `h`. Throws `E_MIG_MALFORMED_ARCHIVE`
 * when the grain directory does not cover the capacity.
 */
export function cowdCodec(h: VmdkSparseHeader, label: string): SparseCodec {
  if (h.gdEntries * COWD_GT_ENTRIES * h.grainSize < h.capacity)
    throw malformed(label, `grain directory of ${h.gdEntries} entries does not cover ${h.capacity} sectors`)
  return sectorCodec('cowd', h.capacity, h.grainSize, COWD_GT_ENTRIES, h.gdOffset ?? 0, h.gdEntries, false)
}
