/**
 * What the reader tests (readers, vhd-blocks, vhdx-blocks, vdi-blocks) build their cases from:
 * a file's SHA-256, a manifest disk of a source, and images written and read back by
 * `qemu-img convert` (the reference bytes).
 */
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
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
