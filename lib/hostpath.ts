/**
 * Confinement of host paths to the import root (spec 1.5, 8: "paths that escape it are rejected").
 *
 * Every path that comes from a request or from inside an archive/descriptor goes through
 * {@link resolveInRoot} before it is opened. Rejections are `E_MIG_HOST_PATH_REJECTED`.
 */
import { AsyncLocalStorage } from 'node:async_hooks'
import { closeSync, constants as FS, fstatSync, lstatSync, openSync, readlinkSync, realpathSync, type Stats } from 'node:fs'
import * as path from 'node:path'
import { MigError } from './errors.ts'
import type { RemoteFile } from './contracts/remote-file.ts'

/** Name of the directory below the import root that holds multipart uploads (spec 1.5). */
export const UPLOADS_DIR = '.uploads'

/** Options of {@link resolveInRoot}. */
export interface ResolveOptions {
  /** Allow paths below `<root>/.uploads` (only the upload store and its importers do). Default false. */
  allowUploads?: boolean
  /** Directory a relative path is taken from (a descriptor's folder); defaults to the root. */
  base?: string
}

function reject(p: string, why: string): never {
  throw new MigError('E_MIG_HOST_PATH_REJECTED', `path ${JSON.stringify(p)} rejected: ${why}`, { details: { path: p } })
}

function isInside(root: string, p: string): boolean {
  const rel = path.relative(root, p)
  return rel === '' || (!rel.startsWith('..') && !path.isAbsolute(rel))
}

/** Realpath of the longest existing prefix of `p`, with the missing tail re-appended. */
function realpathOfExisting(p: string): string {
  let head = p
  const tail: string[] = []
  for (;;) {
    try {
      lstatSync(head)
      return path.join(realpathSync(head).replace(/ \(deleted\)$/, ''), ...tail.reverse())
    } catch {
      const parent = path.dirname(head)
      if (parent === head) return p
      tail.push(path.basename(head))
      head = parent
    }
  }
}

/**
 * Resolves `candidate` (absolute, or relative to `opts.base` or the root) to an absolute path
 * that is inside `root` once every symlink at any depth is followed.
 *
 * Rejected with `E_MIG_HOST_PATH_REJECTED`: NUL bytes, empty paths, percent-encoded traversal
 * (`%2e%2e`, `%2f`), `..` that climbs out, absolute paths elsewhere, symlinks (file or
 * directory) that resolve outside, and `<root>/.uploads` unless `allowUploads`.
 * The file need not exist; what exists of it is checked through realpath.
 *
 * @returns the absolute, symlink-free path.
 */
export function resolveInRoot(root: string, candidate: string, opts: ResolveOptions = {}): string {
  if (typeof candidate !== 'string' || candidate.length === 0) reject(String(candidate), 'empty path')
  // a remote input of the active scope (its URL) is not a host path
  if (scopeStorage.getStore()?.remote(candidate)) return candidate
  // a name relative to a remote folder export's descriptor: a sibling URL, never a host path
  if (opts.base && scopeStorage.getStore()?.isRemoteFolder(opts.base)) return remoteSibling(opts.base, candidate)
  if (candidate.includes('\0')) reject(candidate, 'NUL byte in path')
  if (candidate.length > 4096) reject(candidate.slice(0, 64) + '…', 'path longer than 4096 bytes')
  if (/%(2e|2f|5c|00)/i.test(candidate)) reject(candidate, 'percent-encoded path characters')
  const realRoot = realpathOfExisting(path.resolve(root))
  const absRoot = path.resolve(root)
  const base = opts.base ? path.resolve(opts.base) : absRoot
  const joined = path.resolve(base, candidate)
  // Textual check first (catches `..` and foreign absolute paths even when nothing exists).
  if (!isInside(absRoot, joined) && !isInside(realRoot, joined)) reject(candidate, 'outside the import root')
  const real = realpathOfExisting(joined)
  if (!isInside(realRoot, real)) reject(candidate, 'resolves outside the import root (symlink)')
  if (!opts.allowUploads) {
    const rel = path.relative(realRoot, real)
    if (rel.split(path.sep)[0] === UPLOADS_DIR) reject(candidate, `the ${UPLOADS_DIR} directory is not browsable`)
  }
  return real
}

/**
 * The URL of `rel`, a file name relative to the remote folder `folder` (the descriptor's URL
 * without its last segment): `<folder>/<rel, each segment percent-encoded>`. A name from a
 * descriptor is hostile input: NUL or control characters, a backslash, a scheme (`x:`), an
 * absolute path, an empty, `.` or `..` segment, or a percent sign are rejected with
 * `E_MIG_HOST_PATH_REJECTED` ("outside the remote folder"): a companion is always a file of the
 * same folder (or below it) on the same server, bucket or share.
 */
export function remoteSibling(folder: string, rel: string): string {
  if (rel.length === 0 || rel.length > 1024) reject(rel.slice(0, 64), 'a remote companion name must be 1 to 1024 characters')
  if (/[\x00-\x1f\\%]/.test(rel)) reject(rel, 'a control character, backslash or percent sign in a remote companion name (outside the remote folder)')
  if (/^[a-z][a-z0-9+.-]*:/i.test(rel) || rel.startsWith('/')) reject(rel, 'an absolute name or another host: outside the remote folder')
  const parts = rel.split('/')
  if (parts.some((p) => p === '' || p === '.' || p === '..')) reject(rel, 'an empty, . or .. segment: outside the remote folder')
  return `${folder}/${parts.map(encodeURIComponent).join('/')}`
}

/** Path of `abs` relative to the import root, with `/` separators (for API responses). */
export function relativeToRoot(root: string, abs: string): string {
  const rel = path.relative(realpathOfExisting(path.resolve(root)), abs)
  return rel.split(path.sep).join('/')
}

/**
 * Open-once access to input files (a name checked, then opened again, can be
 * swapped in between by a `rename` to a symlink leading outside the import root).
 *
 * An {@link InputScope} opens each input file once (`O_RDONLY|O_NONBLOCK|O_NOCTTY`), then checks
 * the open file itself: its real path read from `/proc/self/fd/<fd>` must lie inside the import
 * root and `fstat` must say regular file. Every later access within the scope goes to that
 * descriptor: {@link pinnedPath} gives `/proc/self/fd/<fd>` (a reopen of the same inode, never a
 * new name lookup) and {@link pinnedFd} the descriptor itself for a child process (qemu-nbd,
 * qemu-img receive it in their stdio and read `/dev/fd/<n>`). The active scope is carried by an
 * `AsyncLocalStorage`, so format readers need no extra argument; outside any scope these helpers
 * return the path unchanged (unit tests of single formats).
 */

const scopeStorage = new AsyncLocalStorage<InputScope>()

/** The input files one inspect or one job reads, each opened once (see the section comment above). */
export class InputScope {
  private readonly realRoot: string
  private readonly pins = new Map<string, { fd: number; stats: Stats; real: string }>()
  private readonly memos = new Map<string, Promise<unknown>>()
  private readonly remotes = new Map<string, RemoteFile>()
  private readonly remoteFolders = new Set<string>()
  private closed = false

  /** `root`: the import root (absolute). */
  constructor(root: string) {
    this.realRoot = realpathOfExisting(path.resolve(root))
  }

  /** Runs `fn` with this scope active for every {@link pinnedPath}/{@link pinnedFd} it reaches. */
  run<T>(fn: () => T): T {
    return scopeStorage.run(this, fn)
  }

  /**
   * The pinned descriptor of `file`, opening and checking it on first use.
   * Throws `E_MIG_NOT_FOUND` (cannot be opened), `E_MIG_HOST_PATH_REJECTED` (the open file lies
   * outside the import root, or is not a regular file or directory). Directories are checked but
   * not kept open (returns null for them).
   */
  pin(file: string): { fd: number; stats: Stats; real: string } | null {
    if (this.closed) throw new MigError('E_MIG_INTERNAL', 'input scope used after close')
    if (this.remotes.has(file))
      throw new MigError(
        'E_MIG_UNSUPPORTED_FORMAT',
        `${file}: this image needs a reader of host files (qemu); a remote input is read only by the migrator's own readers`,
      )
    const hit = this.pins.get(file)
    if (hit) return hit
    let fd: number
    try {
      fd = openSync(file, FS.O_RDONLY | FS.O_NONBLOCK | FS.O_NOCTTY)
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code
      throw new MigError(
        code === 'ENOENT' ? 'E_MIG_NOT_FOUND' : 'E_MIG_DISK_READ_FAILED',
        `${relativeToRoot(this.realRoot, file)}: cannot open (${code ?? 'error'})`,
      )
    }
    let keep = false
    try {
      const stats = fstatSync(fd)
      const real = readlinkSync(`/proc/self/fd/${fd}`).replace(/ \(deleted\)$/, '')
      if (!isInside(this.realRoot, real)) reject(relativeToRoot(this.realRoot, file), 'the opened file lies outside the import root (symlink)')
      if (stats.isDirectory()) return null
      if (!stats.isFile()) reject(relativeToRoot(this.realRoot, file), 'not a regular file')
      const pin = { fd, stats, real }
      this.pins.set(file, pin)
      keep = true
      return pin
    } finally {
      if (!keep) closeSync(fd)
    }
  }

  /**
   * What `make()` resolves to for (`file`, `key`), made once per scope: a listing of a pinned file
   * that the inspection and the job's readers each need is read once. A rejection is not kept
   * (the next caller tries again). `file` must be pinned in this scope.
   */
  memo<T>(file: string, key: string, make: () => Promise<T>): Promise<T> {
    const k = `${file}\0${key}`
    const hit = this.memos.get(k)
    if (hit) return hit as Promise<T>
    const p = make()
    this.memos.set(k, p)
    p.catch(() => this.memos.delete(k))
    return p
  }

  /**
   * Registers the remote input `file` (opened by `lib/remote/`) under its name (its URL): the
   * format helpers of `lib/formats/io.ts` read it by that name, `resolveInRoot` passes it
   * through, and {@link close} closes it.
   */
  addRemote(file: RemoteFile): void {
    if (this.closed) throw new MigError('E_MIG_INTERNAL', 'input scope used after close')
    this.remotes.set(file.name, file)
  }

  /**
   * Registers `folder` (a descriptor's URL without its last segment) as a remote folder export:
   * `resolveInRoot` with this `base` gives the sibling URL ({@link remoteSibling}), which is a
   * remote input of the scope when the opener found that companion.
   */
  addRemoteFolder(folder: string): void {
    this.remoteFolders.add(folder)
  }

  /** Whether `folder` was registered with {@link addRemoteFolder}. */
  isRemoteFolder(folder: string): boolean {
    return this.remoteFolders.has(folder)
  }

  /** The remote input registered under `name`, if any. */
  remote(name: string): RemoteFile | undefined {
    return this.remotes.get(name)
  }

  /**
   * Throws `E_MIG_DISK_READ_FAILED` ("the source changed while it was read", naming the file
   * relative to the import root) when a pinned file's size or modification time (fstat of the
   * pinned descriptor) differs from what it was when pinned: it was written in place. A file
   * renamed over keeps its pinned inode, which is read consistently to the end, so that passes.
   */
  assertUnchanged(): void {
    for (const [file, p] of this.pins) {
      let now: Stats
      try {
        now = fstatSync(p.fd)
      } catch {
        continue // closed with the scope
      }
      if (now.size !== p.stats.size || now.mtimeMs !== p.stats.mtimeMs) {
        throw new MigError(
          'E_MIG_DISK_READ_FAILED',
          `${relativeToRoot(this.realRoot, file)}: the source changed while it was read (size ${p.stats.size} -> ${now.size}, modified ${p.stats.mtime.toISOString()} -> ${now.mtime.toISOString()}); the copy would mix two versions of the disk: stop what writes the file, then submit the migration again`,
          { details: { file: relativeToRoot(this.realRoot, file) } },
        )
      }
    }
  }

  /** Closes every pinned descriptor and remote input. Never throws. */
  close(): void {
    this.closed = true
    for (const r of this.remotes.values()) r.close()
    this.remotes.clear()
    for (const p of this.pins.values()) {
      try {
        closeSync(p.fd)
      } catch {
        /* already closed */
      }
    }
    this.pins.clear()
    this.memos.clear()
  }
}

/** The remote input `name` of the active scope (see {@link InputScope.addRemote}), if any. */
export function remoteInput(name: string): RemoteFile | undefined {
  return scopeStorage.getStore()?.remote(name)
}

/** The active {@link InputScope}, if any. */
export function currentInputScope(): InputScope | undefined {
  return scopeStorage.getStore()
}

/**
 * The path to open for reading the input file `file`: inside a scope `/proc/self/fd/<fd>` of its
 * pinned descriptor (directories: `file` itself); outside any scope `file`. Throws what
 * {@link InputScope.pin} throws.
 */
export function pinnedPath(file: string): string {
  const pin = scopeStorage.getStore()?.pin(file)
  return pin ? `/proc/self/fd/${pin.fd}` : file
}

/**
 * How another process of this host opens `file` (qemu-img started by this worker): the pinned
 * descriptor as `/proc/<this pid>/fd/<fd>` (the same open file, never the name again), or `file`
 * outside a scope. Valid while the scope is open.
 */
export function pinnedProcPath(file: string): string {
  const pin = scopeStorage.getStore()?.pin(file)
  return pin ? `/proc/${process.pid}/fd/${pin.fd}` : file
}

/** The pinned descriptor of `file` in the active scope (undefined outside a scope or for a directory). */
export function pinnedFd(file: string): number | undefined {
  return scopeStorage.getStore()?.pin(file)?.fd
}

/**
 * Runs `fn` inside the active scope, or inside a fresh scope over `root` that is closed when
 * `fn` settles.
 */
export async function withInputScope<T>(root: string, fn: () => Promise<T>): Promise<T> {
  if (scopeStorage.getStore()) return fn()
  const scope = new InputScope(root)
  try {
    return await scope.run(fn)
  } finally {
    scope.close()
  }
}

/** Runs `fn` with no input scope active: for files the job made itself (staged OVF disks), not inputs. */
export function outsideInputScope<T>(fn: () => T): T {
  return scopeStorage.exit(fn)
}

/**
 * The name a child process opens for the input file `path`: inside an input scope
 * (`lib/hostpath.ts`) with `childFds` given, the file's pinned descriptor is appended to
 * `childFds` (the caller passes them as the child's fds 3, 4, ...) and the name is `/dev/fd/<n>`,
 * so qemu opens the very file that was checked, never the name again; otherwise `path`.
 */
export function childFile(path: string, childFds?: number[]): string {
  const fd = childFds ? pinnedFd(path) : undefined
  if (fd === undefined) return path
  childFds!.push(fd)
  return `/dev/fd/${2 + childFds!.length}`
}

/**
 * `text` with the host's absolute directories taken out, for messages that reach API clients
 * (messages name paths relative to the import root, never absolute server paths):
 * `<import root>/x` becomes `x`, the import root itself `.`, `<data dir>/x` becomes `<data dir>/x`
 * literally. Both the given and the symlink-free spelling of each directory are replaced.
 */
export function redactHostPaths(text: string, importRoot: string, dataDir?: string): string {
  const pairs: Array<[string, string]> = []
  for (const r of new Set([path.resolve(importRoot), realpathOfExisting(path.resolve(importRoot))])) pairs.push([`${r}/`, ''], [r, '.'])
  if (dataDir)
    for (const d of new Set([path.resolve(dataDir), realpathOfExisting(path.resolve(dataDir))])) pairs.push([`${d}/`, '<data dir>/'], [d, '<data dir>'])
  let out = text
  for (const [from, to] of pairs) if (from.length > 1) out = out.split(from).join(to)
  return out
}
