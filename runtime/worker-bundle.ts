/**
 * Which file the supervisor forks as a job's worker (the worker's start is a fixed cost
 * of every job). Under Bun the worker's TypeScript modules are bundled into one file with
 * bytecode (`npm run build:worker`, run by `.ci/install`: `dist/bun/worker.js` and its `.jsc`),
 * which Bun starts without transpiling about 600 modules. The bundle is used only when it is at
 * least as new as every source it was built from (`.ts` files under `runtime/` and `lib/`,
 * `package-lock.json`); otherwise, or when it is missing, the `.ts` entry runs as before, so a
 * source edited after the build is never run from a stale bundle. Under Node the compiled
 * `dist/runtime/worker.js` (tsc) is the worker.
 */
import { readdirSync, statSync } from 'node:fs'
import * as path from 'node:path'

/** The bundle's path relative to the repository root. */
export const WORKER_BUNDLE = path.join('dist', 'bun', 'worker.js')

/** Newest modification time (ms) of the `.ts` files under `dir`, recursively; 0 when there are none. */
function newestTs(dir: string): number {
  let newest = 0
  let entries: import('node:fs').Dirent[]
  try {
    entries = readdirSync(dir, { withFileTypes: true })
  } catch {
    return 0
  }
  for (const e of entries) {
    const p = path.join(dir, e.name)
    if (e.isDirectory()) newest = Math.max(newest, newestTs(p))
    else if (e.name.endsWith('.ts')) newest = Math.max(newest, statSync(p).mtimeMs)
  }
  return newest
}

/**
 * The bundled worker under repository `root` when it exists (with its bytecode file) and is not
 * older than any source it was built from; else null (the caller runs the `.ts` entry).
 */
export function freshWorkerBundle(root: string): string | null {
  const bundle = path.join(root, WORKER_BUNDLE)
  let built: number
  try {
    built = Math.min(statSync(bundle).mtimeMs, statSync(`${bundle}.jsc`).mtimeMs)
  } catch {
    return null
  }
  let lock = 0
  try {
    lock = statSync(path.join(root, 'package-lock.json')).mtimeMs
  } catch {}
  const sources = Math.max(newestTs(path.join(root, 'runtime')), newestTs(path.join(root, 'lib')), lock)
  return built >= sources ? bundle : null
}
