/**
 * Benchmark source layouts: raw disk images whose data is laid out the way real
 * disks hold it, converted by the caller to each image format.
 *
 * - `alternating`: every other 64 KiB cluster holds data (50%; the worst case for qemu-img, one
 *   write per 64 KiB).
 * - `runs`: data in runs of 64 KiB to 4 MiB (64 KiB aligned) over about 45% of the disk, the way
 *   a file system leaves data (the measurement).
 * - `long`: about 50% of the disk holds data; 90% of the data is in runs of 2 to 16 MiB, the rest
 *   in 64 KiB pieces.
 * - `sparse`: 5% of the disk holds data, scattered in pieces of 64 KiB to 1 MiB.
 * - `ext4`: a real ext4 file system (`mkfs.ext4 -d`) populated with a copy of `/usr` (as much of
 *   it as fits in about 70% of the disk: `mkfs.ext4 -d` stops at the first file that does not fit,
 *   so the copy is made from a size-bounded list of files).
 *
 * Data bytes are pseudo-random (a fixed seed), never all-zero in any 4 KiB block.
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeFileSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { cliArg } from './source.ts'

/** A layout name. */
export type Layout = 'alternating' | 'runs' | 'long' | 'sparse' | 'ext4'

/** Every layout, in table order. */
export const LAYOUTS: Layout[] = ['alternating', 'runs', 'long', 'sparse', 'ext4']

const K64 = 64 * 1024
const MiB = 1024 * 1024

/** A small deterministic PRNG (xorshift32), so every run builds the same layout. */
function rng(seed: number): () => number {
  let x = seed >>> 0 || 1
  return () => {
    x ^= x << 13
    x >>>= 0
    x ^= x >>> 17
    x ^= x << 5
    x >>>= 0
    return x / 0x100000000
  }
}

/** A random length in [lo, hi], a multiple of 64 KiB. */
function len64(r: () => number, lo: number, hi: number): number {
  return Math.max(lo, Math.min(hi, Math.round((lo + r() * (hi - lo)) / K64) * K64))
}

/** The data extents `[offset, length]` of a synthetic layout over `size` bytes. */
function extentsOf(layout: Exclude<Layout, 'ext4'>, size: number): Array<[number, number]> {
  const out: Array<[number, number]> = []
  const r = rng(0x15 + layout.length)
  let o = 0
  const push = (n: number) => {
    n = Math.min(n, size - o)
    if (n > 0) out.push([o, n])
    o += n
  }
  while (o < size) {
    if (layout === 'alternating') {
      push(K64)
      o += K64
    } else if (layout === 'runs') {
      // mean data run ~2 MiB, mean gap ~2.45 MiB: about 45% data
      push(len64(r, K64, 4 * MiB))
      o += len64(r, K64, 4.9 * MiB)
    } else if (layout === 'long') {
      if (r() < 0.1) {
        // a 64 KiB piece: 10% of the data by volume needs many small pieces
        for (let i = 0; i < 16 && o < size; i++) {
          push(K64)
          o += K64
        }
      } else {
        push(len64(r, 2 * MiB, 16 * MiB))
        o += len64(r, 2 * MiB, 16 * MiB)
      }
    } else {
      push(len64(r, K64, MiB))
      o += len64(r, 2 * MiB, 17 * MiB)
    }
  }
  return out
}

/**
 * Writes the raw image `<dir>/<layout>.raw` of `size` bytes (sparse where the layout has no data).
 * Returns its path and its data bytes (for ext4: the blocks the file system allocated, as `du`
 * reports them).
 */
export function makeRawLayout(dir: string, layout: Layout, size: number): { path: string; dataBytes: number } {
  const raw = path.join(dir, `${layout}.raw`)
  rmSync(raw, { force: true })
  if (layout === 'ext4') return makeExt4(dir, raw, size)
  const pool = randomBytes(8 * MiB)
  const fd = openSync(raw, 'w')
  let dataBytes = 0
  let p = 0
  for (const [off, n] of extentsOf(layout, size)) {
    for (let d = 0; d < n; ) {
      const k = Math.min(n - d, 4 * MiB)
      writeSync(fd, pool, p % (4 * MiB), k, off + d)
      p += K64 * 7
      d += k
    }
    dataBytes += n
  }
  closeSync(fd)
  spawnSync('truncate', ['-s', String(size), raw])
  return { path: raw, dataBytes }
}

/** The `--layouts` argument (comma-separated, default `dflt`); throws on a name not in {@link LAYOUTS}. */
export function layoutsArg(dflt: string): Layout[] {
  const layouts = cliArg('layouts', dflt).split(',') as Layout[]
  for (const l of layouts) if (!LAYOUTS.includes(l)) throw new Error(`unknown layout ${l}`)
  return layouts
}

/** The `--cache` argument: the raw-layout cache directory (default /var/tmp/mig-bench-cache), null for `none`. */
export function cacheDirArg(): string | null {
  const dir = cliArg('cache', '/var/tmp/mig-bench-cache')
  return dir === 'none' ? null : dir
}

/**
 * The raw image of `layout` at `size` bytes, kept in the directory `cache` as
 * `<layout>-<size>.raw` (with its data bytes in `<file>.json`) and reused by later runs (an 8 GiB
 * ext4 layout takes about 10 minutes to build here). With `cache` null it is built in `dir`, and
 * the caller deletes it.
 */
export function cachedRawLayout(cache: string | null, dir: string, layout: Layout, size: number): { path: string; dataBytes: number } {
  if (!cache) return makeRawLayout(dir, layout, size)
  mkdirSync(cache, { recursive: true })
  const file = path.join(cache, `${layout}-${size}.raw`)
  const meta = `${file}.json`
  if (existsSync(file) && existsSync(meta)) return { path: file, dataBytes: JSON.parse(readFileSync(meta, 'utf8')).dataBytes }
  const built = makeRawLayout(cache, layout, size)
  renameSync(built.path, file)
  writeFileSync(meta, JSON.stringify({ dataBytes: built.dataBytes }))
  return { path: file, dataBytes: built.dataBytes }
}

function makeExt4(dir: string, raw: string, size: number): { path: string; dataBytes: number } {
  // Copy of /usr bounded to ~70% of the disk: file list from `find`, cut at the budget.
  const budget = Math.floor(size * 0.7)
  const tree = path.join(dir, 'ext4-tree')
  rmSync(tree, { recursive: true, force: true })
  mkdirSync(tree)
  const list = execFileSync('find', ['/usr', '-xdev', '-type', 'f', '-size', '-64M', '-printf', '%s %p\\n'], { encoding: 'utf8', maxBuffer: 1 << 28 }).split(
    '\n',
  )
  let used = 0
  const files: string[] = []
  for (const line of list) {
    const sp = line.indexOf(' ')
    if (sp < 0) continue
    const n = Number(line.slice(0, sp))
    if (used + n + 4096 > budget) break
    used += n + 4096
    files.push(line.slice(sp + 1).slice(1)) // relative to /
  }
  // cp --parents keeps the directory structure; hard links would alias /usr, so a real copy.
  const listFile = path.join(dir, 'ext4-files')
  writeFileSync(listFile, files.join('\0'))
  execFileSync('bash', ['-c', `cd / && xargs -0 -a "$1" cp --parents -t "$2" 2>/dev/null; true`, 'x', listFile, tree], { stdio: 'ignore' })
  rmSync(listFile, { force: true })
  spawnSync('truncate', ['-s', String(size), raw])
  execFileSync('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=0,lazy_journal_init=0', '-d', tree, raw], { stdio: ['ignore', 'ignore', 'inherit'] })
  rmSync(tree, { recursive: true, force: true })
  const du = Number(execFileSync('du', ['-B1', '--', raw], { encoding: 'utf8' }).split('\t')[0])
  return { path: raw, dataBytes: du }
}
