/**
 * Shared low-level helpers of the format readers: positioned reads of headers and descriptors
 * (never whole disks) and the `E_MIG_MALFORMED_ARCHIVE` error every reader raises for bad input.
 */
import { readSync, type Stats } from 'node:fs'
import { open, stat, type FileHandle } from 'node:fs/promises'
import { MigError, type ErrorDetails } from '../errors.ts'
import { currentInputScope, pinnedPath, remoteInput } from '../hostpath.ts'
import type { RemoteFile } from '../contracts/remote-file.ts'

/** `MigError('E_MIG_MALFORMED_ARCHIVE', '<file or member>: <reason>')`, with optional details. */
export function malformed(label: string, reason: string, details?: ErrorDetails): MigError {
  return new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: ${reason}`, details ? { details } : {})
}

/**
 * `stat` of `path` (inside an input scope, of the file's pinned descriptor: see
 * `lib/hostpath.ts`). Throws `E_MIG_DISK_READ_FAILED` when it cannot be read, and inside a scope
 * `E_MIG_NOT_FOUND` / `E_MIG_HOST_PATH_REJECTED` as `InputScope.pin` does.
 */
export async function statPath(path: string): Promise<Stats> {
  const remote = remoteInput(path)
  if (remote) return remoteStats(remote)
  try {
    const pin = currentInputScope()?.pin(path)
    if (pin) return pin.stats
    return await stat(path)
  } catch (e) {
    if (e instanceof MigError) throw e
    throw new MigError('E_MIG_DISK_READ_FAILED', `${path}: cannot stat: ${(e as Error).message}`, { cause: e })
  }
}

/**
 * Opens `path` read-only (inside an input scope, its pinned descriptor). Throws
 * `E_MIG_DISK_READ_FAILED` when it cannot be opened, inside a scope also what `InputScope.pin` throws.
 */
export async function openRead(path: string): Promise<FileHandle> {
  const remote = remoteInput(path)
  if (remote) return remoteHandle(remote)
  try {
    return await open(pinnedPath(path), 'r')
  } catch (e) {
    if (e instanceof MigError) throw e
    throw new MigError('E_MIG_DISK_READ_FAILED', `${path}: cannot open: ${(e as Error).message}`, { cause: e })
  }
}

/**
 * Reads up to `len` bytes at byte offset `pos` of `fh` (the file `path`); the result is shorter
 * only at the end of the file. With `into` (at least `len` bytes) the bytes land there and the
 * result is a view of it: no allocation on a hot path. Throws `E_MIG_DISK_READ_FAILED` naming
 * the file and offset.
 */
export async function readAt(fh: FileHandle, path: string, len: number, pos: number, into?: Buffer): Promise<Buffer> {
  const buf = into ? into.subarray(0, len) : Buffer.alloc(len)
  let got = 0
  try {
    while (got < len) {
      const { bytesRead } = await fh.read(buf, got, len - got, pos + got)
      if (bytesRead === 0) break
      got += bytesRead
    }
  } catch (e) {
    if (e instanceof MigError) throw e
    throw new MigError('E_MIG_DISK_READ_FAILED', `${path}: read of ${len} bytes at offset ${pos} failed: ${(e as Error).message}`, { cause: e })
  }
  return got === len ? buf : buf.subarray(0, got)
}

/**
 * {@link readAt} as one blocking `pread` (no round trip through the thread pool): for the many
 * small header reads of a walk over a large archive, where the async call costs more than the
 * read itself (tar.ts). Same result and errors as {@link readAt}.
 */
export function readAtSync(fh: FileHandle, path: string, len: number, pos: number): Buffer {
  if (isRemoteHandle(fh)) throw new MigError('E_MIG_INTERNAL', `${path}: a blocking read of a remote input`)
  const buf = Buffer.alloc(len)
  let got = 0
  try {
    while (got < len) {
      const n = readSync(fh.fd, buf, got, len - got, pos + got)
      if (n === 0) break
      got += n
    }
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${path}: read of ${len} bytes at offset ${pos} failed: ${(e as Error).message}`, { cause: e })
  }
  return got === len ? buf : buf.subarray(0, got)
}

/** A byte range of a file that holds one image (an uncompressed tar member of an OVA): bytes. */
export interface FileWindow {
  offset: number
  length: number
}

/**
 * {@link readAt} inside `win` (the whole file when undefined): `pos` is relative to the window's
 * start and the read stops at the window's end, never running into the next member.
 */
export async function readInWindow(fh: FileHandle, path: string, win: FileWindow | undefined, len: number, pos: number): Promise<Buffer> {
  if (!win) return readAt(fh, path, len, pos)
  return readAt(fh, path, Math.max(0, Math.min(len, win.length - pos)), win.offset + pos)
}

/**
 * Opens `path`, reads up to `len` bytes at byte offset `pos` (short only at the end of the file)
 * and closes it. Throws `E_MIG_DISK_READ_FAILED` naming the file and offset.
 */
export async function readFileRange(path: string, pos: number, len: number): Promise<Buffer> {
  const fh = await openRead(path)
  try {
    return await readAt(fh, path, len, pos)
  } finally {
    await fh.close().catch(() => {})
  }
}

/** Marks the handles of {@link remoteHandle}. */
const REMOTE = Symbol('remote input')

/**
 * The `Stats` a remote input shows to the format helpers: a regular file of its size (times are
 * the epoch: nothing reads them from an input).
 */
function remoteStats(r: RemoteFile): Stats {
  const zero = new Date(0)
  return {
    size: r.size,
    isFile: () => true,
    isDirectory: () => false,
    isBlockDevice: () => false,
    isCharacterDevice: () => false,
    isSymbolicLink: () => false,
    isFIFO: () => false,
    isSocket: () => false,
    mode: 0o100444,
    blocks: Math.ceil(r.size / 512),
    blksize: 4096,
    mtime: zero,
    ctime: zero,
    atime: zero,
    birthtime: zero,
    mtimeMs: 0,
  } as unknown as Stats
}

/**
 * A remote input as the `FileHandle` subset the format readers use: positioned `read`, `stat`,
 * `close` (which leaves the object open: the input scope owns it). It has no descriptor (`fd` is
 * -1): {@link readAtSync}, qemu and hole maps are not for it ({@link isRemoteHandle}).
 */
function remoteHandle(r: RemoteFile): FileHandle {
  const h = {
    [REMOTE]: r,
    fd: -1,
    async read(buffer: Buffer, offset = 0, length = buffer.length - offset, position = 0) {
      const bytesRead = await r.read(buffer.subarray(offset, offset + length), position ?? 0)
      return { bytesRead, buffer }
    },
    async stat() {
      return remoteStats(r)
    },
    async close() {},
  }
  return h as unknown as FileHandle
}

/** True for a handle of a remote input ({@link openRead} of a remote name). */
export function isRemoteHandle(fh: FileHandle): boolean {
  return REMOTE in fh
}
