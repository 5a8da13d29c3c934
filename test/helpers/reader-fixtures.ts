/**
 * What the reader tests (readers, vhd-blocks, vhdx-blocks, vdi-blocks, qcow2-clusters,
 * vmdk-grains, stream-vmdk) build their cases from: a file's SHA-256, a manifest disk of a source,
 * images written and read back by `qemu-img convert` (the reference bytes), an image packed alone
 * into a tar, an extent walk collected, the zeroed half of a piece, the check of a file cut
 * short after open, and the bytes of an image read or patched in place (a header field, a table
 * entry).
 */
import { expect } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { closeSync, openSync, readFileSync, readSync, truncateSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import type { DiskExtent, DiskReader } from '../../lib/contracts/disk-reader.ts'
import { listTarMembers } from '../../lib/formats/tar.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { migErrorOf } from './mig-error.ts'

/** SHA-256 of the file `p` (read whole: test-sized files only), lower-case hex. */
export const sha256File = (p: string): string => createHash('sha256').update(readFileSync(p)).digest('hex')

/** Bytes `[at, at + n)` of `file`. */
export function bytesAt(file: string, at: number, n: number): Buffer {
  const b = Buffer.alloc(n)
  const fd = openSync(file, 'r')
  readSync(fd, b, 0, n, at)
  closeSync(fd)
  return b
}

/** Writes `b` at `at` of `file`. */
export function writeAt(file: string, at: number, b: Buffer): void {
  const fd = openSync(file, 'r+')
  writeSync(fd, b, 0, b.length, at)
  closeSync(fd)
}

/** A virtio manifest disk of `capacity` bytes read from `source` (label `disk <format>` unless `extra` names one). */
export function manifestDisk(
  format: ManifestDisk['disk_format'],
  source: ManifestDisk['source'],
  capacity: number,
  extra: Partial<ManifestDisk> = {},
): ManifestDisk {
  return { label: `disk ${format}`, capacity_bytes: capacity, disk_format: format, source, controller: 'virtio', address: '0:0', ...extra }
}

/** `qemu-img convert -f raw -O <format> <opts> raw out`; returns `out`. */
export function qemuImageOf(raw: string, out: string, format: string, opts: string[] = []): string {
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', format, ...opts, raw, out])
  return out
}

/** `qemu-img convert [-f format] -O raw src out` (qemu probes the format when none is given); returns `out`. */
export function qemuRawOf(src: string, out: string, format?: string): string {
  execFileSync('qemu-img', ['convert', ...(format ? ['-f', format] : []), '-O', 'raw', src, out])
  return out
}

/**
 * Packs `file` alone into `<file>.tar` (GNU tar, as an OVA or a VM folder export holds it) and
 * returns the manifest source that reads it in place: the tar, the member's data offset and size
 * (bytes), and its name.
 */
export async function tarredImage(file: string): Promise<ManifestDisk['source']> {
  const tar = `${file}.tar`
  execFileSync('tar', ['-C', path.dirname(file), '-cf', tar, path.basename(file)])
  const m = (await listTarMembers(tar))[0]!
  return { path: tar, offset: m.offset, length: m.size, member: m.name }
}

/** Every extent `it` yields, in order. */
export async function collectExtents(it: AsyncIterable<DiskExtent>): Promise<DiskExtent[]> {
  const out: DiskExtent[] = []
  for await (const x of it) out.push(x)
  return out
}

/**
 * Opens the image `img` of the scattered disk with `open`, cuts the file to 2 MiB, and checks
 * that a read of its data at 33 MiB (past the cut) fails `E_MIG_DISK_READ_FAILED` with a short
 * read: a file cut short after it was opened never copies zeros. Closes the reader.
 */
export async function expectCutShortReadFails(img: string, open: (p: string) => Promise<DiskReader | null>): Promise<void> {
  const reader = (await open(img))!
  try {
    truncateSync(img, 2 * 1024 * 1024)
    const err = await migErrorOf(reader.read(33 * 1024 * 1024, 1024 * 1024))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('short read')
  } finally {
    await reader.close()
  }
}

/**
 * The extents `open`'s reader of `img` gives after qemu-io's `write -z 7M 512k` on the scattered
 * disk (zero flag or zeroed grain entries): the first half of the 1 MiB piece at 7 MiB is a zero
 * extent (never read), the second half data. Closes the reader.
 */
export async function expectZeroedAt7MiB(img: string, open: (p: string) => Promise<DiskReader | null>): Promise<void> {
  const reader = (await open(img))!
  try {
    const ext = await collectExtents(reader.extents(0))
    const at = (o: number) => ext.find((x) => x.offset <= o && o < x.offset + x.length)?.zero
    expect(at(7 * 1024 * 1024)).toBe(true)
    expect(at(7.5 * 1024 * 1024)).toBe(false)
  } finally {
    await reader.close()
  }
}
