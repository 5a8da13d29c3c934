/**
 * Browsing the import root (spec 2.6, `GET /host-files`): the entries of one directory inside
 * the root, never anything outside it (spec 8).
 */
import { lstat, opendir, stat } from 'node:fs/promises'
import * as path from 'node:path'
import { z } from 'zod'
import { MigError } from './errors.ts'
import { relativeToRoot, resolveInRoot, UPLOADS_DIR } from './hostpath.ts'
import { IMPORTER_KINDS } from './kinds.ts'

/** The body of `POST /host-files/inspect`: `path` relative to, or absolute inside, the import root; `kind` skips detection. */
export const HostFileInspectBody = z.strictObject({ path: z.string().min(1).max(4096), kind: z.enum(IMPORTER_KINDS).optional() })

/**
 * One entry of a directory listing (spec 2.6).
 * - `path`: relative to the import root, `/`-separated (what `POST /host-files/inspect` and
 *   `offline_host_path` plans take).
 * - `type`: of the entry after following a symlink that stays inside the root; `symlink` for one
 *   that leads outside (listed so the administrator sees it, but never followed).
 * - `size_bytes`: file size in bytes (0 for directories); `modified_at`: ISO-8601 UTC.
 */
export interface HostFileEntry {
  name: string
  path: string
  type: 'file' | 'directory' | 'symlink' | 'other'
  size_bytes: number
  modified_at: string
}

/** Most entries one listing returns; `truncated` says when a directory held more. */
export const MAX_ENTRIES = 10000

/**
 * Lists the directory `rel` (relative to, or absolute inside, `root`; `''` is the root).
 * Sorted directories first, then by name. `.uploads` is hidden at the root.
 * Throws `E_MIG_HOST_PATH_REJECTED` (escape), `E_MIG_NOT_FOUND` (missing), `E_MIG_BAD_REQUEST`
 * (not a directory).
 */
export async function listHostDir(root: string, rel: string): Promise<{ path: string; items: HostFileEntry[]; truncated: boolean }> {
  const dir = rel === '' || rel === '/' ? resolveInRoot(root, '.') : resolveInRoot(root, rel)
  let st
  try {
    st = await stat(dir)
  } catch {
    throw new MigError('E_MIG_NOT_FOUND', `${JSON.stringify(rel)} does not exist in the import root`)
  }
  if (!st.isDirectory()) throw new MigError('E_MIG_BAD_REQUEST', `${JSON.stringify(rel)} is not a directory`)
  const atRoot = relativeToRoot(root, dir) === ''
  const items: HostFileEntry[] = []
  let truncated = false
  for await (const d of await opendir(dir)) {
    if (atRoot && d.name === UPLOADS_DIR) continue
    if (items.length >= MAX_ENTRIES) {
      truncated = true
      break
    }
    const abs = path.join(dir, d.name)
    items.push(await describe(root, abs, d.name))
  }
  items.sort((a, b) =>
    (a.type === 'directory') !== (b.type === 'directory') ? (a.type === 'directory' ? -1 : 1) : a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
  )
  return { path: relativeToRoot(root, dir), items, truncated }
}

async function describe(root: string, abs: string, name: string): Promise<HostFileEntry> {
  const l = await lstat(abs)
  const rel = relativeToRoot(root, abs)
  let s = l
  if (l.isSymbolicLink()) {
    try {
      resolveInRoot(root, rel)
      s = await stat(abs)
    } catch {
      return { name, path: rel, type: 'symlink', size_bytes: 0, modified_at: l.mtime.toISOString() }
    }
  }
  const type = s.isFile() ? 'file' : s.isDirectory() ? 'directory' : 'other'
  return { name, path: rel, type, size_bytes: type === 'file' ? s.size : 0, modified_at: s.mtime.toISOString() }
}
