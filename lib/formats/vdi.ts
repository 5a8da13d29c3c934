/**
 * VirtualBox VDI header reader.
 *
 * Follows VirtualBox's `src/VBox/Storage/VDICore.h` (the layout qemu's `block/vdi.c` also reads):
 * a 64-byte text pre-header, the little-endian signature `0xbeda107f` at 0x40 and the version at
 * 0x44 (major << 16 | minor; 1.1 is the one in use), then the version 1.1 header: header size,
 * image type (1 normal/dynamic, 2 fixed, 3 undo, 4 differencing), flags, 256-byte comment, block
 * map and data offsets, legacy CHS geometry, disk size (bytes), block size, extra block bytes,
 * blocks in image, blocks allocated, and four UUIDs (image, last modification, parent link,
 * parent modification; RTUUID, i.e. Microsoft mixed-endian layout).
 */
import { MigError } from '../errors.ts'
import { malformed, openRead } from './io.ts'

/** The VDI signature at offset 0x40. */
export const VDI_SIGNATURE = 0xbeda107f
/**
 * Byte offsets of the VDI 1.1 header fields (VirtualBox `VDICore.h` `VDIPREHEADER` and
 * `VDIHEADER1PLUS`; qemu `block/vdi.c` `VdiHeader`), little-endian: u32 unless marked.
 */
export const VDI_HEADER = {
  signature: 0x40,
  version: 0x44,
  /** `cbHeader`: bytes of the header from here on */
  header_size: 0x48,
  image_type: 0x4c,
  /** `offBlocks`: the block map */
  offset_bmap: 0x154,
  /** `offData`: the first block */
  offset_data: 0x158,
  /** the legacy geometry's `cbSector` */
  sector_size: 0x168,
  /** u64 `cbDisk`, bytes */
  disk_size: 0x170,
  block_size: 0x178,
  /** `cbBlockExtra`: bytes stored before each block's data */
  block_extra: 0x17c,
  blocks: 0x180,
  blocks_allocated: 0x184,
  /** RTUUIDs of 16 bytes: the image, and its parent's (link) */
  uuid_image: 0x188,
  uuid_link: 0x1a8,
} as const
const V = VDI_HEADER

/** Largest disk size accepted, bytes (64 TiB). */
export const VDI_MAX_DISK_SIZE = 64 * 2 ** 40
const HEADER_END = 0x1c8 // end of the v1.1 header's parent-modification UUID

/**
 * What a VDI says about itself. Sizes are bytes.
 * - `image_type`: `dynamic` (type 1 "normal"), `fixed` (2), `undo` (3), `differencing` (4).
 * - `virtual_size`: `cbDisk`; `block_size`: `cbBlock` (1 MiB in practice).
 * - `uuid`: the image UUID; `parent_uuid`: the link UUID of a differencing image, else null.
 * - `blocks`: entries of the block map; `blocks_allocated`: allocated blocks.
 * - `bmap_offset`, `data_offset`: file offsets of the block map (`offBlocks`, little-endian 32-bit
 *   entries) and of the first block (`offData`); `block_extra`: `cbBlockExtra`, bytes stored
 *   before each block's data; `sector_size`: the legacy geometry's `cbSector` (512 in practice).
 */
export interface VdiInfo {
  image_type: 'dynamic' | 'fixed' | 'undo' | 'differencing'
  virtual_size: number
  block_size: number
  uuid: string
  parent_uuid: string | null
  blocks: number
  blocks_allocated: number
  bmap_offset: number
  data_offset: number
  block_extra: number
  sector_size: number
}

/** An RTUUID (little-endian first three fields) as lower-case text. */
function uuidAt(buf: Buffer, at: number): string {
  const le = (a: number, n: number): string =>
    Buffer.from(buf.subarray(at + a, at + a + n))
      .reverse()
      .toString('hex')
  const h = (a: number, b: number): string => buf.subarray(at + a, at + b).toString('hex')
  return `${le(0, 4)}-${le(4, 2)}-${le(6, 2)}-${h(8, 10)}-${h(10, 16)}`
}

const NIL = '00000000-0000-0000-0000-000000000000'

/**
 * Parses a VDI header from `buf` (the first bytes of the file) for a file of `fileSize` bytes.
 * @throws E_MIG_UNSUPPORTED_FORMAT no VDI signature; a version other than 1.1.
 * @throws E_MIG_MALFORMED_ARCHIVE header cut short; unknown image type; disk size over 64 TiB;
 *   block size not a power of two in 512 B..256 MiB; a block map too small for the disk or
 *   outside the file; more allocated blocks than blocks; a differencing image without parent.
 */
export function parseVdiHeader(buf: Buffer, fileSize: number, file: string): VdiInfo {
  if (buf.length < V.header_size || buf.readUInt32LE(V.signature) !== VDI_SIGNATURE)
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: not a VDI image (no 0xbeda107f signature)`)
  const version = buf.readUInt32LE(V.version)
  if (version !== 0x00010001)
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: VDI version ${version >>> 16}.${version & 0xffff} is not supported (1.1)`)
  if (buf.length < HEADER_END) throw malformed(file, `VDI header cut short (${buf.length} of ${HEADER_END} bytes)`)
  const cbHeader = buf.readUInt32LE(V.header_size)
  if (cbHeader < HEADER_END - V.header_size) throw malformed(file, `VDI header size ${cbHeader} too small`)
  const type = buf.readUInt32LE(V.image_type)
  const image_type = type === 1 ? 'dynamic' : type === 2 ? 'fixed' : type === 3 ? 'undo' : type === 4 ? 'differencing' : null
  if (!image_type) throw malformed(file, `unknown VDI image type ${type}`)
  const offBlocks = buf.readUInt32LE(V.offset_bmap)
  const offData = buf.readUInt32LE(V.offset_data)
  const sizeBig = buf.readBigUInt64LE(V.disk_size)
  if (sizeBig > BigInt(VDI_MAX_DISK_SIZE)) throw malformed(file, `disk size ${sizeBig} bytes exceeds 64 TiB`)
  const virtual_size = Number(sizeBig)
  const block_size = buf.readUInt32LE(V.block_size)
  if (block_size < 512 || block_size > 256 * 1024 * 1024 || (block_size & (block_size - 1)) !== 0)
    throw malformed(file, `block size ${block_size} is not a power of two in 512 B..256 MiB`)
  const blocks = buf.readUInt32LE(V.blocks)
  const blocks_allocated = buf.readUInt32LE(V.blocks_allocated)
  if (blocks * block_size < virtual_size) throw malformed(file, `${blocks} blocks of ${block_size} bytes cannot hold ${virtual_size} bytes`)
  if (blocks_allocated > blocks) throw malformed(file, `${blocks_allocated} allocated blocks of ${blocks}`)
  if (offBlocks < HEADER_END || offBlocks + blocks * 4 > fileSize)
    throw malformed(file, `block map at offset ${offBlocks} (${blocks} entries) lies outside the file of ${fileSize} bytes`)
  if (offData < offBlocks || offData > fileSize) throw malformed(file, `data offset ${offData} invalid`)
  // Allocated blocks are stored back to back from the data offset (each with its extra bytes,
  // `block_extra`); a shorter file is truncated, and qemu would read the missing blocks as zeros.
  const extra = buf.readUInt32LE(V.block_extra)
  const needed = offData + blocks_allocated * (block_size + extra)
  if (needed > fileSize) throw malformed(file, `truncated: ${blocks_allocated} allocated blocks need ${needed} bytes, the file has ${fileSize}`)
  const uuid = uuidAt(buf, V.uuid_image)
  const link = uuidAt(buf, V.uuid_link)
  const parent_uuid = link === NIL ? null : link
  if (image_type === 'differencing' && parent_uuid === null) throw malformed(file, 'differencing VDI without a parent UUID')
  const sector_size = buf.readUInt32LE(V.sector_size)
  return {
    image_type,
    virtual_size,
    block_size,
    uuid,
    parent_uuid,
    blocks,
    blocks_allocated,
    bmap_offset: offBlocks,
    data_offset: offData,
    block_extra: extra,
    sector_size,
  }
}

/**
 * Reads the VDI header of `file` (first 512 bytes).
 * @throws as {@link parseVdiHeader}; E_MIG_DISK_READ_FAILED when unreadable.
 */
export async function readVdiInfo(file: string): Promise<VdiInfo> {
  const fh = await openRead(file)
  try {
    const fileSize = (await fh.stat()).size
    const buf = Buffer.alloc(Math.min(512, fileSize))
    try {
      await fh.read(buf, 0, buf.length, 0)
    } catch (e) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${file}: read failed: ${(e as Error).message}`, { cause: e })
    }
    return parseVdiHeader(buf, fileSize, file)
  } finally {
    await fh.close()
  }
}
