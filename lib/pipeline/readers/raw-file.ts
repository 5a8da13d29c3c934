/**
 * Disk reader over raw bytes in a file (DESIGN.md section 5, readers 1 and 2): a raw or flat
 * disk file, a VMDK flat extent, or a tar member's byte range inside an OVA/XVA read in place
 * with positioned reads (never extracted).
 *
 * Extents come from the file's holes (`qemu-img map` on the open descriptor, which asks
 * `SEEK_DATA`/`SEEK_HOLE`; Node cannot): a hole is a zero extent, never read; data extents are cut
 * at 1 GiB. A block device has no holes, so all of it is data; zero detection on the bytes read
 * happens in the chunker. `qemuNode` is the raw driver's `offset`/`size` window over this reader's
 * open descriptor (`/proc/<pid>/fd/<fd>`: the file opened once, never its name again), so the copy
 * loop may let qemu-img read it directly, and the map is taken on that same descriptor.
 */
import { MigError } from '../../errors.ts'
import { readAt } from '../../formats/io.ts'
import type { DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'
import { qemuImgMap } from '../qemu-img-map.ts'
import { imageFileNode, openImageFile, type ImageFileOptions } from './image-file.ts'

/** Extent granularity reported by raw readers: at most 1 GiB per extent. */
const EXTENT_SPAN = 1024 * 1024 * 1024

/**
 * Opens a reader of `length` bytes at `offset` of the file `path`; `size` is `length`.
 * Throws `E_MIG_DISK_READ_FAILED` when the file cannot be opened ({@link openImageFile}: not a
 * file or block device, the range outside the file), and on read errors or short reads (file
 * truncated meanwhile).
 */
export async function openRawFileReader(path: string, opts: ImageFileOptions = {}): Promise<DiskReader> {
  const file = await openImageFile(path, opts)
  const { fh, base, length: size, label } = file
  let closed = false
  const qemuNode = file.remote ? undefined : imageFileNode(file)

  return {
    size,
    qemuNode,
    async *extents(from: number): AsyncIterable<DiskExtent> {
      if (closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: extents after close`)
      if (!qemuNode) {
        // a remote input: no holes to ask for, all of it is data (the chunker finds the zeros)
        for (let o = Math.max(0, from); o < size; o += EXTENT_SPAN) yield { offset: o, length: Math.min(EXTENT_SPAN, size - o), zero: false }
        return
      }
      for await (const x of qemuImgMap({ node: qemuNode, from: Math.max(0, from), size, label })) {
        if (x.zero) yield x
        else
          for (let o = x.offset; o < x.offset + x.length; o += EXTENT_SPAN)
            yield { offset: o, length: Math.min(EXTENT_SPAN, x.offset + x.length - o), zero: false }
      }
    },
    async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
      if (closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read at offset ${offset} after close`)
      if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > size) {
        throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read of ${length} bytes at offset ${offset} is outside the disk (${size} bytes)`)
      }
      const buf = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
      const got = (await readAt(fh, label, length, base + offset, buf)).length
      if (got !== length) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: short read at offset ${offset + got} (file truncated?)`)
      return buf
    },
    async close(): Promise<void> {
      if (closed) return
      closed = true
      await fh.close().catch(() => {})
    },
  }
}
