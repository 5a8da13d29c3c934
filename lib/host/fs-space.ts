/**
 * File-system space facts for messages and waits: the mount point a path lives on, its free
 * bytes, and whether an error is a "no space left" (ENOSPC, SQLite's SQLITE_FULL).
 */
import { existsSync, readFileSync, realpathSync, statfsSync } from 'node:fs'
import * as path from 'node:path'
import { causeMatches } from '../errors.ts'

/** The nearest existing ancestor of `p` (itself when it exists), resolved through symlinks. */
function existingAncestor(p: string): string {
  let d = path.resolve(p)
  while (!existsSync(d)) d = path.dirname(d)
  return realpathSync(d)
}

/**
 * The mount point of the file system holding `p` (the longest mount point of
 * `/proc/self/mountinfo` above it; `/` when that file cannot be read). Octal escapes (`\040`) of
 * mountinfo are decoded.
 */
export function mountPointOf(p: string): string {
  const real = existingAncestor(p)
  let best = '/'
  let text = ''
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8')
  } catch {
    return best
  }
  for (const line of text.split('\n')) {
    const field = line.split(' ')[4]
    if (!field) continue
    const mp = field.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)))
    const inside = mp === '/' || real === mp || real.startsWith(`${mp}/`)
    if (inside && mp.length >= best.length) best = mp
  }
  return best
}

/** Bytes an unprivileged writer may still allocate on the file system of `p` (statfs `bavail`). */
export function freeBytesOn(p: string): number {
  const st = statfsSync(existingAncestor(p))
  return Number(st.bavail) * Number(st.bsize)
}

/** The file system of `p`: its mount point and free bytes now. */
export function spaceOf(p: string): { mount: string; free: number } {
  return { mount: mountPointOf(p), free: freeBytesOn(p) }
}

/**
 * True when `e` (or an error in its `cause` chain) is a "no space left on device": errno
 * `ENOSPC`, SQLite's `SQLITE_FULL` ("database or disk is full"), or a child tool's message
 * saying so (qemu-img: "No space left on device").
 */
export function isNoSpace(e: unknown): boolean {
  return causeMatches(e, ['ENOSPC', 'SQLITE_FULL'], /no space left on device|ENOSPC|database or disk is full|SQLITE_FULL/i)
}

const MiB = 1024 * 1024

/** Bytes as MiB with one decimal (`12.5 MiB`), the unit of space messages. */
export function mib(n: number): string {
  return `${(n / MiB).toFixed(1)} MiB`
}
