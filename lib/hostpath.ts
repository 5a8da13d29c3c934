/**
 * Confinement of host paths to the import root (spec 1.5, 8: "paths that escape it are rejected").
 *
 * Every path that comes from a request or from inside an archive/descriptor goes through
 * {@link resolveInRoot} before it is opened. Rejections are `E_MIG_HOST_PATH_REJECTED`.
 */
import { realpathSync, lstatSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from './errors.ts'

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
      return path.join(realpathSync(head), ...tail.reverse())
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

/** Path of `abs` relative to the import root, with `/` separators (for API responses). */
export function relativeToRoot(root: string, abs: string): string {
  const rel = path.relative(realpathOfExisting(path.resolve(root)), abs)
  return rel.split(path.sep).join('/')
}
