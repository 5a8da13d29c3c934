/**
 * VHD footer and dynamic header reader (Virtual PC / Hyper-V generation 1 disks; qemu's `vpc`
 * driver).
 *
 * Follows Microsoft's "Virtual Hard Disk Image Format Specification" v1.0 (2006): the 512-byte
 * big-endian hard disk footer at the end of the file (cookie `conectix`, features, format version
 * 0x00010000, data offset, creator application/host, original and current size, CHS geometry,
 * disk type 2 fixed / 3 dynamic / 4 differencing, one's-complement checksum, unique id) and, for
 * dynamic and differencing disks, the 1024-byte dynamic disk header at the footer's data offset
 * (cookie `cxsparse`, BAT offset, max table entries, block size, checksum, parent unique id,
 * parent unicode name, eight parent locator entries). Old Virtual PC versions wrote a 511-byte
 * footer; it is accepted at `size - 511`. Dynamic disks also keep a copy of the footer at offset
 * 0, used when the last sector is damaged. The guest-visible size follows qemu `block/vpc.c`:
 * CHS geometry for creators `vpc `, `qemu`, others the footer's current size.
 */
import type { FileHandle } from 'node:fs/promises'
import { MigError } from '../errors.ts'
import { type FileWindow, malformed, openRead, readInWindow } from './io.ts'

/** The footer's cookie (VHD spec "Hard Disk Footer Format"). */
export const VHD_FOOTER_COOKIE = 'conectix'
/** The dynamic disk header's cookie (VHD spec "Dynamic Disk Header Format"). */
export const VHD_DYNAMIC_COOKIE = 'cxsparse'

/**
 * Byte offsets of the 512-byte hard disk footer (VHD spec "Hard Disk Footer Format"; qemu
 * `block/vpc.c` `VHDFooter`), big-endian: u32 unless marked.
 */
export const VHD_FOOTER = {
  /** 8 bytes, `conectix` */
  cookie: 0,
  version: 12,
  /** u64, the dynamic header's byte offset (all ones for a fixed disk) */
  data_offset: 16,
  /** 4 characters */
  creator_app: 28,
  /** u64 */
  current_size: 48,
  /** u16 cylinders, u8 heads, u8 sectors per track */
  cylinders: 56,
  heads: 58,
  sectors: 59,
  disk_type: 60,
  checksum: 64,
  /** 16 bytes */
  unique_id: 68,
} as const
/** Bytes of the footer, and of the footer old Virtual PC versions wrote (one reserved byte short). */
const FOOTER_BYTES = 512
const OLD_FOOTER_BYTES = 511

/**
 * Byte offsets of the 1024-byte dynamic disk header (VHD spec "Dynamic Disk Header Format"; qemu
 * `block/vpc.c` `VHDDynDiskHeader`), big-endian: u32 unless marked.
 */
export const VHD_DYNAMIC_HEADER = {
  /** 8 bytes, `cxsparse` */
  cookie: 0,
  /** u64 */
  table_offset: 16,
  max_table_entries: 28,
  block_size: 32,
  checksum: 36,
  /** 16 bytes */
  parent_unique_id: 40,
  /** 512 bytes of UTF-16 big-endian */
  parent_name: 64,
  /** eight parent locator entries of 24 bytes */
  parent_locators: 576,
} as const
const DYNAMIC_HEADER_BYTES = 1024
const PARENT_NAME_BYTES = 512
const LOCATOR_COUNT = 8
/** One parent locator entry (VHD spec "Parent Locator Entries"): 4-character platform code, u32 data length, u64 data offset. */
const LOCATOR = { bytes: 24, platform_code: 0, data_length: 8, data_offset: 16 } as const
const F = VHD_FOOTER
const D = VHD_DYNAMIC_HEADER

/** A BAT entry of a block not allocated: it reads as zeros (VHD spec, "Block Allocation Table"). */
export const VHD_UNALLOCATED = 0xffffffff

/**
 * Bytes of the sector bitmap in front of each block of a dynamic VHD: one bit per 512-byte
 * sector, padded to a whole sector (VHD spec, "Block Format"; qemu `block/vpc.c` bitmap_size).
 */
export function vhdBitmapBytes(blockSize: number): number {
  return Math.ceil(blockSize / 512 / 8 / 512) * 512
}

/** Largest VHD virtual size accepted, bytes (the format's 2040 GiB limit, rounded up to 2 TiB). */
export const VHD_MAX_VIRTUAL_SIZE = 2 * 2 ** 40
const NO_OFFSET = 0xffffffffffffffffn

/** Parent locator platform codes (VHD spec "Parent Locator Entries"). */
const PLATFORMS: Record<string, 'utf16le' | 'utf8'> = { W2ru: 'utf16le', W2ku: 'utf16le', Wi2r: 'utf8', Wi2k: 'utf8', MacX: 'utf8' }

/** One parent locator of a differencing VHD: `platform` code (`W2ru` relative Windows path,
 * `W2ku` absolute Windows path, `MacX` file URL, ...) and the decoded `path`. */
export interface VhdParentLocator {
  platform: string
  path: string
}

/**
 * What a VHD says about itself. Sizes are bytes.
 * - `disk_type`: footer disk type. `virtual_size`: the size qemu's `vpc` driver presents (see the
 *   module note); `current_size`: the footer's current size; `geometry` its CHS.
 * - `parent_name`: dynamic header parent unicode name (differencing disks), else null;
 *   `parent_locators`: the decoded locators (differencing disks), else [].
 * - `block_size`: dynamic header block size (null for fixed disks). `creator_app`: 4 characters.
 * - `footer_offset`: where the footer used was found.
 * - `unique_id`: the footer's unique id (32 hex digits); `parent_unique_id`: the dynamic
 *   header's parent unique id of a differencing disk (must equal the parent's `unique_id`), else null.
 * - `bat_offset`: byte offset of the BAT (big-endian 32-bit sector numbers, one per block,
 *   `0xFFFFFFFF` unallocated; checked: inside the file, entries enough for the virtual size);
 *   null for a fixed disk.
 */
export interface VhdInfo {
  disk_type: 'fixed' | 'dynamic' | 'differencing'
  virtual_size: number
  current_size: number
  geometry: { cylinders: number; heads: number; sectors: number }
  parent_name: string | null
  parent_locators: VhdParentLocator[]
  block_size: number | null
  creator_app: string
  footer_offset: number
  unique_id: string
  parent_unique_id: string | null
  bat_offset: number | null
}

/** One's complement of the byte sum of `buf` with the 4-byte checksum at `at` skipped. */
function vhdChecksum(buf: Buffer, at: number): number {
  let sum = 0
  for (let i = 0; i < buf.length; i++) if (i < at || i >= at + 4) sum = (sum + buf[i]!) >>> 0
  return ~sum >>> 0
}

/** True when `buf` (at least 85 bytes) starts with the footer cookie and its checksum matches. */
function footerOk(buf: Buffer): boolean {
  if (buf.length < F.unique_id + 16 + 1 || buf.toString('latin1', F.cookie, F.cookie + 8) !== VHD_FOOTER_COOKIE) return false
  // The checksum covers the 512-byte footer; a 511-byte footer lacks a trailing reserved zero.
  const full = buf.length >= FOOTER_BYTES ? buf.subarray(0, FOOTER_BYTES) : Buffer.concat([buf, Buffer.alloc(FOOTER_BYTES - buf.length)])
  return vhdChecksum(full, F.checksum) === full.readUInt32BE(F.checksum)
}

/** True when the last 512 (or 511) bytes of a file hold a `conectix` cookie (no checksum check). */
export function hasVhdCookie(tail: Buffer): boolean {
  return (
    (tail.length >= FOOTER_BYTES && tail.toString('latin1', tail.length - FOOTER_BYTES, tail.length - FOOTER_BYTES + 8) === VHD_FOOTER_COOKIE) ||
    (tail.length >= OLD_FOOTER_BYTES && tail.toString('latin1', tail.length - OLD_FOOTER_BYTES, tail.length - OLD_FOOTER_BYTES + 8) === VHD_FOOTER_COOKIE)
  )
}

/**
 * Reads the VHD footer (and dynamic header) of `file`.
 *
 * @returns the {@link VhdInfo}.
 * @throws E_MIG_UNSUPPORTED_FORMAT no `conectix` cookie at the end (nor at offset 0); a disk type
 *   other than 2/3/4; a format version other than 1.x.
 * @throws E_MIG_MALFORMED_ARCHIVE no footer with a valid checksum; current size over 2 TiB or past
 *   the end of a fixed disk; a dynamic header missing, with a bad cookie or checksum, a block
 *   size not a power of two, or a BAT outside the file or too small for the size.
 * `win`: only that byte range of `file` holds the image (a tar member read in place); sizes and
 * offsets are then relative to it.
 * @throws E_MIG_DISK_READ_FAILED the file cannot be opened or read.
 */
export async function readVhdInfo(file: string, win?: FileWindow): Promise<VhdInfo> {
  const fh = await openRead(file)
  try {
    return await readVhdInfoFrom(fh, file, win)
  } finally {
    await fh.close()
  }
}

/**
 * {@link readVhdInfo} of an open file: `fh` is read (never closed), `file` names it in messages.
 * Same result and errors.
 */
export async function readVhdInfoFrom(fh: FileHandle, file: string, win?: FileWindow): Promise<VhdInfo> {
  const fileSize = win ? win.length : (await fh.stat()).size
  const candidates: number[] = []
  if (fileSize >= FOOTER_BYTES) candidates.push(fileSize - FOOTER_BYTES)
  if (fileSize >= OLD_FOOTER_BYTES) candidates.push(fileSize - OLD_FOOTER_BYTES)
  candidates.push(0)
  let footer: Buffer | null = null
  let footerOffset = -1
  let sawCookie = false
  for (const off of candidates) {
    const b = await readInWindow(fh, file, win, Math.min(FOOTER_BYTES, fileSize - off), off)
    if (b.toString('latin1', F.cookie, F.cookie + 8) !== VHD_FOOTER_COOKIE) continue
    sawCookie = true
    if (footerOk(b)) {
      footer = b.length >= FOOTER_BYTES ? b : Buffer.concat([b, Buffer.alloc(FOOTER_BYTES - b.length)])
      footerOffset = off
      break
    }
  }
  if (!sawCookie) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: not a VHD image (no conectix footer)`)
  if (!footer) throw malformed(file, 'VHD footer checksum mismatch (no intact footer copy)')

  const version = footer.readUInt32BE(F.version)
  if (version >>> 16 !== 1) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: VHD format version 0x${version.toString(16)} is not 1.x`)
  const dataOffset = footer.readBigUInt64BE(F.data_offset)
  const creator_app = footer.toString('latin1', F.creator_app, F.creator_app + 4)
  const unique_id = footer.toString('hex', F.unique_id, F.unique_id + 16)
  const currentBig = footer.readBigUInt64BE(F.current_size)
  const geometry = { cylinders: footer.readUInt16BE(F.cylinders), heads: footer[F.heads]!, sectors: footer[F.sectors]! }
  const type = footer.readUInt32BE(F.disk_type)
  const disk_type = type === 2 ? 'fixed' : type === 3 ? 'dynamic' : type === 4 ? 'differencing' : null
  if (!disk_type) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file}: VHD disk type ${type} is not fixed (2), dynamic (3) or differencing (4)`)
  if (currentBig > BigInt(VHD_MAX_VIRTUAL_SIZE)) throw malformed(file, `current size ${currentBig} bytes exceeds 2 TiB`)
  const current_size = Number(currentBig)

  // qemu block/vpc.c: CHS size for Virtual PC and old qemu, current size otherwise and for the
  // maximum geometry 65535/16/255.
  const chs = geometry.cylinders * geometry.heads * geometry.sectors * 512
  const maxChs = geometry.cylinders === 65535 && geometry.heads === 16 && geometry.sectors === 255
  const virtual_size = !maxChs && (creator_app === 'vpc ' || creator_app === 'qemu') ? chs : current_size

  if (disk_type === 'fixed') {
    if (footerOffset === 0) throw malformed(file, 'fixed VHD has no footer at its end')
    if (virtual_size > footerOffset) throw malformed(file, `fixed VHD declares ${virtual_size} bytes but holds ${footerOffset}`)
    return {
      disk_type,
      virtual_size,
      current_size,
      geometry,
      parent_name: null,
      parent_locators: [],
      block_size: null,
      creator_app,
      footer_offset: footerOffset,
      unique_id,
      parent_unique_id: null,
      bat_offset: null,
    }
  }

  // Dynamic disk header.
  if (dataOffset === NO_OFFSET || dataOffset + BigInt(DYNAMIC_HEADER_BYTES) > BigInt(fileSize))
    throw malformed(file, `dynamic disk header offset ${dataOffset} lies outside the file`)
  const dhOff = Number(dataOffset)
  const dh = await readInWindow(fh, file, win, DYNAMIC_HEADER_BYTES, dhOff)
  if (dh.toString('latin1', D.cookie, D.cookie + 8) !== VHD_DYNAMIC_COOKIE) throw malformed(file, `no cxsparse dynamic disk header at offset ${dhOff}`)
  if (vhdChecksum(dh, D.checksum) !== dh.readUInt32BE(D.checksum)) throw malformed(file, 'dynamic disk header checksum mismatch')
  const batOffset = dh.readBigUInt64BE(D.table_offset)
  const maxEntries = dh.readUInt32BE(D.max_table_entries)
  const block_size = dh.readUInt32BE(D.block_size)
  if (block_size < 512 || block_size > 256 * 1024 * 1024 || (block_size & (block_size - 1)) !== 0)
    throw malformed(file, `block size ${block_size} is not a power of two in 512 B..256 MiB`)
  if (maxEntries * block_size < virtual_size) throw malformed(file, `BAT of ${maxEntries} entries of ${block_size} bytes cannot map ${virtual_size} bytes`)
  if (batOffset + BigInt(maxEntries) * 4n > BigInt(fileSize)) throw malformed(file, `BAT at offset ${batOffset} (${maxEntries} entries) lies outside the file`)

  let parent_name: string | null = null
  let parent_unique_id: string | null = null
  const parent_locators: VhdParentLocator[] = []
  if (disk_type === 'differencing') {
    parent_unique_id = dh.toString('hex', D.parent_unique_id, D.parent_unique_id + 16)
    const nameBuf = dh.subarray(D.parent_name, D.parent_name + PARENT_NAME_BYTES)
    const s = Buffer.from(nameBuf).swap16().toString('utf16le')
    const nul = s.indexOf('\0')
    parent_name = (nul < 0 ? s : s.slice(0, nul)) || null
    for (let i = 0; i < LOCATOR_COUNT; i++) {
      const at = D.parent_locators + i * LOCATOR.bytes
      const code = dh.toString('latin1', at + LOCATOR.platform_code, at + LOCATOR.platform_code + 4)
      if (dh.readUInt32BE(at + LOCATOR.platform_code) === 0) continue
      const enc = PLATFORMS[code]
      if (!enc) continue
      const len = dh.readUInt32BE(at + LOCATOR.data_length)
      const off = dh.readBigUInt64BE(at + LOCATOR.data_offset)
      if (len === 0) continue
      if (len > 4096 || off + BigInt(len) > BigInt(fileSize)) throw malformed(file, `parent locator ${code} at ${off} (+${len}) lies outside the file`)
      const data = await readInWindow(fh, file, win, len, Number(off))
      let p = data.toString(enc)
      const nul2 = p.indexOf('\0')
      if (nul2 >= 0) p = p.slice(0, nul2)
      if (p) parent_locators.push({ platform: code, path: p })
    }
    if (!parent_name && parent_locators.length === 0) throw malformed(file, 'differencing VHD names no parent')
  }
  return {
    disk_type,
    virtual_size,
    current_size,
    geometry,
    parent_name,
    parent_locators,
    block_size,
    creator_app,
    footer_offset: footerOffset,
    unique_id,
    parent_unique_id,
    bat_offset: Number(batOffset),
  }
}
