/**
 * The image file a block-table or raw reader reads: opened once by its pinned
 * descriptor (`lib/hostpath.ts`), never by its name again, with the byte range the disk image
 * occupies in it (all of it, or a tar member's data).
 */
import { open, type FileHandle } from 'node:fs/promises'
import { MigError } from '../../errors.ts'
import { isRemoteHandle, openRead, readAt } from '../../formats/io.ts'
import { pinnedPath, remoteInput } from '../../hostpath.ts'
import type { VmdkFile } from '../../formats/vmdk/sparse-extent.ts'
import type { QemuNode } from '../qemu-img-copy.ts'

/** The open image file: descriptor, byte range (a tar member) and name. Bytes. */
export interface ImageFile {
  fh: FileHandle
  /** Start of the image in the file. */
  base: number
  /** Length of the image in the file. */
  length: number
  /** A block device (no holes to look for). */
  isBlock: boolean
  /** A remote input (`lib/remote/`): no descriptor, no holes to look for, no qemu node. */
  remote: boolean
  /** Name used in messages. */
  label: string
}

/** Options of {@link openImageFile}. Bytes. */
export interface ImageFileOptions {
  /** Start of the image inside the file (tar member data offset); default 0. */
  offset?: number
  /** Length of the image (tar member size); default: the file's size minus `offset`. */
  length?: number
  /** Name used in messages (e.g. `disk1.vhd in vm.tar`); defaults to the path. */
  label?: string
}

/**
 * Opens `path` once (inside an input scope, its pinned descriptor), a regular file or a block
 * device, and checks the byte range. Throws `E_MIG_DISK_READ_FAILED` (cannot open or stat, not a
 * file, range outside the file); the caller closes `fh`.
 */
export async function openImageFile(path: string, opts: ImageFileOptions = {}): Promise<ImageFile> {
  const label = opts.label ?? path
  const fail = (why: string, cause?: unknown) => new MigError('E_MIG_DISK_READ_FAILED', `${label}: ${why}`, cause ? { cause } : {})
  let fh: FileHandle
  try {
    const remote = remoteInput(path)
    fh = remote ? await openRead(path) : await open(pinnedPath(path), 'r')
  } catch (e) {
    throw fail(`cannot open: ${(e as Error).message}`, e)
  }
  try {
    const st = await fh.stat()
    if (!st.isFile() && !st.isBlockDevice()) throw fail('not a regular file or block device')
    const base = opts.offset ?? 0
    const length = opts.length ?? st.size - base
    if (!Number.isSafeInteger(base) || base < 0 || !Number.isSafeInteger(length) || length < 0 || base + length > st.size)
      throw fail(`range of ${length} bytes at offset ${base} lies outside the file (${st.size} bytes)`)
    return { fh, base, length, isBlock: st.isBlockDevice(), remote: isRemoteHandle(fh), label }
  } catch (e) {
    await fh.close().catch(() => {})
    throw e instanceof MigError ? e : fail((e as Error).message, e)
  }
}

/**
 * The qemu block node over the image's byte range in `file` (not for a remote input:
 * `E_MIG_INTERNAL`): the `raw` driver's `offset`/`size`
 * window on the open descriptor (`/proc/<pid>/fd/<fd>`, never the name again), a `host_device` or
 * `file` protocol node below it (qemu docs, "Block device options": raw, file, host_device).
 */
export function imageFileNode(file: ImageFile): QemuNode {
  const { fh, base, length, isBlock } = file
  if (file.remote) throw new MigError('E_MIG_INTERNAL', `${file.label}: a remote input has no qemu node`)
  return { driver: 'raw', offset: base, size: length, file: { driver: isBlock ? 'host_device' : 'file', filename: `/proc/${process.pid}/fd/${fh.fd}` } }
}

/**
 * The image's byte range as a random-access file (the {@link VmdkFile} shape the VMDK extent
 * readers of lib/formats/vmdk/ take): `read(offset, length)` is relative to the range, and a
 * short read (a file cut short since it was opened) is `E_MIG_DISK_READ_FAILED`.
 */
export function imageFileView(file: ImageFile): VmdkFile {
  return {
    name: file.label,
    size: file.length,
    async read(offset, length, into) {
      const got = await readAt(file.fh, file.label, length, file.base + offset, into)
      if (got.length !== length) throw new MigError('E_MIG_DISK_READ_FAILED', `${file.label}: short read of ${length} bytes at offset ${offset} (truncated?)`)
      return got
    },
  }
}
