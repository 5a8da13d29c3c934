/**
 * Format sniffing: what a file or a stream is from its magic bytes, the one place that knows the
 * signatures (DESIGN.md section 5 "Probing"), and the virtual size the fixed header of a VMDK
 * sparse extent or a qcow2 image declares. Used by the probe of unlabelled inputs
 * (`importers/probe.ts`), the OVF disk-format choice (`formats/ovf.ts`), the OVA/OVF importers
 * (the capacity of a disk without a DiskSection entry) and the qemu driver of backing-chain
 * parents (`pipeline/qemu-nbd.ts`).
 *
 * Magic bytes checked (sources: qemu `docs/interop/qcow2.txt` (`QFI\xfb`, version 1 is the legacy
 * qcow format), MS-VHDX 2.2.1, VMware "Virtual Disk Format 5.0" (sparse extent `KDMV`, ESX
 * `COWD`, text descriptor), the VHD specification (footer cookie `conectix`, at the end of every
 * VHD and also at offset 0 of dynamic ones), VirtualBox `VDICore.h`, POSIX ustar, RFC 1952 gzip).
 */
import { MigError } from '../errors.ts'
import type { DiskFormat } from '../manifest.ts'
import { openRead } from './io.ts'
import { QCOW2_HEADER, QCOW_MAGIC } from './qcow2.ts'
import { VDI_HEADER, VDI_SIGNATURE } from './vdi.ts'
import { hasVhdCookie, VHD_FOOTER, VHD_FOOTER_COOKIE } from './vhd.ts'
import { VHDX_FILE_SIGNATURE } from './vhdx.ts'
import { COWD_HEADER, COWD_MAGIC } from './vmdk/cowd.ts'
import { KDMV_HEADER, VMDK_SPARSE_MAGIC } from './vmdk/hosted-sparse.ts'

/**
 * What the magic bytes (or qemu-img) say a file is:
 * `qcow2`; `qcow` (legacy qcow v1, flagged: not importable); `vhdx`; `vhd` (qemu `vpc`);
 * `vmdk_sparse` (`KDMV` hosted sparse extent, incl. streamOptimized); `vmdk_cowd` (ESX `COWD`
 * sparse); `vmdk_descriptor` (text descriptor); `vdi`; `tar` (ustar or GNU tar); `gzip`,
 * `bzip2`, `xz`, `zstd`, `zip` (compressed streams); `xml`; `raw` (qemu-img found no format);
 * `unknown` (recognised non-disk files such as PNG, or nothing recognisable).
 */
export type ProbeFormat =
  | 'qcow2'
  | 'qcow'
  | 'vhdx'
  | 'vhd'
  | 'vmdk_sparse'
  | 'vmdk_cowd'
  | 'vmdk_descriptor'
  | 'vdi'
  | 'tar'
  | 'gzip'
  | 'bzip2'
  | 'xz'
  | 'zstd'
  | 'zip'
  | 'xml'
  | 'raw'
  | 'unknown'

/**
 * Result of {@link probeFile}.
 * - `format`: see {@link ProbeFormat}.
 * - `disk_format`: the qemu driver that reads it as a disk (`qcow2`, `vhdx`, `vpc`, `vmdk`,
 *   `vdi`, `raw`), or null for containers, descriptors of other kinds and unknown files.
 * - `version`: the format version where the magic carries one (qcow 1/2/3).
 * - `description`: human text of what was seen (`"qcow2 v3 image"`, `"PNG image"`).
 * - `source`: `magic` or `qemu-img` (the fallback). `size`: file size, bytes.
 */
export interface ProbeResult {
  format: ProbeFormat
  disk_format: DiskFormat | null
  version?: number
  description: string
  source: 'magic' | 'qemu-img'
  size: number
}

/** Bytes read from the start of a file for magic checks. */
const HEAD_BYTES = 4096

/** Well-known non-disk files, reported as `unknown` with their name. */
const OTHER_MAGIC: Array<[Buffer, string]> = [
  [Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), 'PNG image'],
  [Buffer.from([0xff, 0xd8, 0xff]), 'JPEG image'],
  [Buffer.from('GIF8', 'latin1'), 'GIF image'],
  [Buffer.from('%PDF-', 'latin1'), 'PDF document'],
  [Buffer.from([0x7f, 0x45, 0x4c, 0x46]), 'ELF executable'],
  [Buffer.from('MZ', 'latin1'), 'DOS/Windows executable'],
  [Buffer.from('Rar!', 'latin1'), 'RAR archive'],
  [Buffer.from('7z\xbc\xaf\x27\x1c', 'latin1'), '7-Zip archive'],
]

/**
 * The first bytes (up to 4 KiB) and the last 512 bytes (fewer for a smaller file) of `file`, and
 * its size in bytes: what {@link probeMagic} classifies. Throws `E_MIG_DISK_READ_FAILED`.
 */
export async function readHeadTail(file: string): Promise<{ head: Buffer; tail: Buffer; size: number }> {
  const fh = await openRead(file)
  try {
    const size = (await fh.stat()).size
    const head = Buffer.alloc(Math.min(HEAD_BYTES, size))
    const tail = Buffer.alloc(Math.min(512, size))
    try {
      if (head.length) await fh.read(head, 0, head.length, 0)
      if (tail.length) await fh.read(tail, 0, tail.length, size - tail.length)
    } catch (e) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${file}: read failed: ${(e as Error).message}`, { cause: e })
    }
    return { head, tail, size }
  } finally {
    await fh.close()
  }
}

/** Text start without a UTF-8 BOM and leading whitespace. */
function textStart(head: Buffer): string {
  let s = head.toString('latin1', 0, Math.min(head.length, 64))
  if (s.startsWith('\xef\xbb\xbf')) s = s.slice(3)
  return s.replace(/^[\s]+/, '')
}

/**
 * Classifies the bytes of a file: `head` (its first bytes, up to 4 KiB), `tail` (its last 512 or
 * fewer) and `size`. Pure; returns null when no magic matched (then qemu-img is asked).
 */
export function probeMagic(head: Buffer, tail: Buffer, size: number): ProbeResult | null {
  const r = (format: ProbeFormat, disk_format: DiskFormat | null, description: string, version?: number): ProbeResult => ({
    format,
    disk_format,
    description,
    source: 'magic',
    size,
    ...(version !== undefined ? { version } : {}),
  })
  if (size === 0) return r('unknown', null, 'empty file')
  const at = (off: number, s: string): boolean => head.length >= off + s.length && head.toString('latin1', off, off + s.length) === s
  if (head.length >= 4 && head.readUInt32BE(QCOW2_HEADER.magic) === QCOW_MAGIC) {
    const v = head.length >= 8 ? head.readUInt32BE(QCOW2_HEADER.version) : -1
    if (v === 1) return r('qcow', null, 'legacy qcow v1 image', 1)
    return r('qcow2', 'qcow2', `qcow2 v${v} image`, v)
  }
  if (at(0, VHDX_FILE_SIGNATURE)) return r('vhdx', 'vhdx', 'VHDX image')
  if (at(KDMV_HEADER.magic, VMDK_SPARSE_MAGIC)) return r('vmdk_sparse', 'vmdk', 'VMDK sparse extent')
  if (at(COWD_HEADER.magic, COWD_MAGIC)) return r('vmdk_cowd', 'vmdk', 'VMDK ESX sparse (COWD) extent')
  if (textStart(head).startsWith('# Disk DescriptorFile')) return r('vmdk_descriptor', 'vmdk', 'VMDK descriptor')
  if (head.length >= VDI_HEADER.signature + 4 && head.readUInt32LE(VDI_HEADER.signature) === VDI_SIGNATURE) return r('vdi', 'vdi', 'VirtualBox VDI image')
  if (hasVhdCookie(tail) || at(VHD_FOOTER.cookie, VHD_FOOTER_COOKIE)) return r('vhd', 'vpc', 'VHD image')
  if (at(257, 'ustar')) return r('tar', null, 'tar archive')
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return r('gzip', null, 'gzip-compressed file')
  if (at(0, 'BZh')) return r('bzip2', null, 'bzip2-compressed file')
  if (at(0, '\xfd7zXZ\x00')) return r('xz', null, 'xz-compressed file')
  if (at(0, '\x28\xb5\x2f\xfd')) return r('zstd', null, 'zstd-compressed file')
  if (at(0, 'PK\x03\x04')) return r('zip', null, 'zip archive')
  for (const [magic, what] of OTHER_MAGIC) if (head.length >= magic.length && head.subarray(0, magic.length).equals(magic)) return r('unknown', null, what)
  const t = textStart(head)
  if (t.startsWith('<?xml') || /^<[A-Za-z!]/.test(t)) return r('xml', null, 'XML document')
  return null
}

/**
 * The qemu driver that reads data starting with `head` (and ending with `tail`, the last 512
 * bytes, for a fixed VHD whose only footer is at the end), or null when no disk signature
 * matches (raw or unknown data) and for a legacy qcow v1 image, which no importer reads.
 */
export function sniffDiskFormat(head: Uint8Array, tail?: Uint8Array): DiskFormat | null {
  const h = Buffer.from(head.buffer, head.byteOffset, head.byteLength)
  const t = tail ? Buffer.from(tail.buffer, tail.byteOffset, tail.byteLength) : Buffer.alloc(0)
  return probeMagic(h, t, Math.max(h.length, 1))?.disk_format ?? null
}

/**
 * Virtual size in bytes read from an image header, for disks referenced as `ovf:/file/<id>`
 * (no DiskSection capacity): VMDK sparse extent header `capacity` (sectors, u64 LE at offset 12;
 * VMDK spec 5.0 "SparseExtentHeader"), qcow2 `size` (u64 BE at offset 24; qemu
 * docs/interop/qcow2.txt). Null for other formats or a short head.
 */
export function capacityFromHeader(format: DiskFormat, head: Uint8Array): number | null {
  const b = Buffer.from(head.buffer, head.byteOffset, head.byteLength)
  let v: bigint | null = null
  if (format === 'vmdk' && b.length >= KDMV_HEADER.capacity + 8 && b.toString('latin1', KDMV_HEADER.magic, KDMV_HEADER.magic + 4) === VMDK_SPARSE_MAGIC)
    v = b.readBigUInt64LE(KDMV_HEADER.capacity) * 512n
  else if (format === 'qcow2' && b.length >= QCOW2_HEADER.size + 8) v = b.readBigUInt64BE(QCOW2_HEADER.size)
  if (v === null || v > BigInt(Number.MAX_SAFE_INTEGER)) return null
  return Number(v)
}
