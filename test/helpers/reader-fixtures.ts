/**
 * What the reader tests (readers, vhd-blocks, vhdx-blocks, vdi-blocks, stream-vmdk) build their
 * cases from: a file's SHA-256, a manifest disk of a source, images written and read back by
 * `qemu-img convert` (the reference bytes), and an image packed alone into a tar.
 */
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import * as path from 'node:path'
import { listTarMembers } from '../../lib/formats/tar.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'

/** SHA-256 of the file `p` (read whole: test-sized files only), lower-case hex. */
export const sha256File = (p: string): string => createHash('sha256').update(readFileSync(p)).digest('hex')

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
