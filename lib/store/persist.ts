/**
 * Maps store failures to `E_MIG_PERSIST_FAILED` (spec 7) so a read-only or full database never
 * takes the server down: the request fails with 503 and the next one is tried afresh.
 *
 * The store's space reserve: a file of {@link RESERVE_BYTES} next to the database
 * (`store.reserve`), made when the store opens and while its file system has room. A write that
 * records what happened to a job (its failure, its "waiting for space" notice: `useReserve`) and
 * fails for want of space (SQLITE_FULL, ENOSPC) removes it and is tried once more, so that a file
 * system filled by another process still takes those few pages. Other writes (progress, leases,
 * events) never release it: they would spend it on what can wait. {@link ensureStoreReserve} makes it again once the file
 * system has room.
 */
import { existsSync, openSync, closeSync, fsyncSync, rmSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { isNoSpace, mib, spaceOf } from '../host/fs-space.ts'

/** Size of the store's space reserve, bytes (8 MiB: thousands of job updates). */
export const RESERVE_BYTES = 8 * 1024 * 1024

/** Bytes the store wants free on its file system to take writes again: twice its reserve. */
export const STORE_NEEDS_BYTES = 2 * RESERVE_BYTES

/** The database file of this process's store (set by {@link setStoreFile}); null: no reserve. */
let storeFile: string | null = null

/** Path of the reserve file of the store at `dbFile`. */
export function reserveFileOf(dbFile: string): string {
  return path.join(path.dirname(dbFile), 'store.reserve')
}

/** Records the database file of this process (enables the reserve) and makes the reserve when there is room. */
export function setStoreFile(dbFile: string): void {
  storeFile = dbFile
  ensureStoreReserve()
}

/**
 * Makes the reserve file when it is missing and its file system has at least four times its
 * size free (it never takes the last free space). Returns whether the reserve exists. Never throws.
 */
export function ensureStoreReserve(): boolean {
  if (!storeFile) return false
  const file = reserveFileOf(storeFile)
  try {
    if (existsSync(file)) return true
    if (spaceOf(file).free < 4 * RESERVE_BYTES) return false
    const fd = openSync(file, 'w', 0o600)
    try {
      const block = Buffer.alloc(1024 * 1024)
      for (let at = 0; at < RESERVE_BYTES; at += block.length) writeSync(fd, block, 0, block.length, at)
      fsyncSync(fd)
    } finally {
      closeSync(fd)
    }
    return true
  } catch {
    rmSync(file, { force: true })
    return false
  }
}

/** Removes the reserve; true when there was one to remove. Never throws. */
function releaseReserve(): boolean {
  if (!storeFile) return false
  const file = reserveFileOf(storeFile)
  if (!existsSync(file)) return false
  rmSync(file, { force: true })
  return true
}

/** The `E_MIG_PERSIST_FAILED` of store operation `what` that failed with `e`. */
function persistError(what: string, e: unknown): MigError {
  const reason = e instanceof Error ? e.message : String(e)
  if (isNoSpace(e) && storeFile) {
    const { mount, free } = spaceOf(storeFile)
    return new MigError(
      'E_MIG_PERSIST_FAILED',
      `store: ${what} failed: no space left on ${mount} (the file system of the store ${storeFile}; ${reason}): ${mib(free)} free, the store needs ${mib(STORE_NEEDS_BYTES)}; free space on ${mount}`,
      { cause: e, details: { mount, free_bytes: free, needed_bytes: STORE_NEEDS_BYTES } },
    )
  }
  return new MigError('E_MIG_PERSIST_FAILED', `store: ${what} failed: ${reason}`, { cause: e })
}

/**
 * Runs a store operation; any error that is not already a MigError (SQLITE_FULL, SQLITE_READONLY,
 * SQLITE_IOERR, a closed database) becomes `E_MIG_PERSIST_FAILED` naming `what` and the cause
 * (for want of space: the file system's mount point, its free bytes and the fix). With
 * `useReserve`, a failure for want of space is tried once more after the space reserve is released.
 */
export async function persist<T>(what: string, fn: () => Promise<T>, opts: { useReserve?: boolean } = {}): Promise<T> {
  try {
    return await fn()
  } catch (e) {
    if (e instanceof MigError) throw e
    if (opts.useReserve && isNoSpace(e) && releaseReserve()) {
      try {
        return await fn()
      } catch (e2) {
        if (e2 instanceof MigError) throw e2
        throw persistError(what, e2)
      }
    }
    throw persistError(what, e)
  }
}
