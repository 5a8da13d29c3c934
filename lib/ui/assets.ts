/**
 * The built web console (`ui/`, built by Vite into `ui/dist/` by `.ci/install` or
 * `npm run build:ui`): where it lives, and how one of its files is looked up safely.
 */
import { existsSync } from 'node:fs'
import { readFile, stat } from 'node:fs/promises'
import * as path from 'node:path'
import { fileURLToPath } from 'node:url'
import { MigError } from '../errors.ts'

/**
 * The console build directory: `ui/dist/` of the repository this module belongs to. The module
 * runs from `lib/ui/` (Bun) or `dist/lib/ui/` (the Node build), so both parents are tried.
 */
export function consoleDir(): string {
  const here = path.dirname(fileURLToPath(import.meta.url))
  const candidates = [path.resolve(here, '../../ui/dist'), path.resolve(here, '../../../ui/dist')]
  return candidates.find((d) => existsSync(path.join(d, 'index.html'))) ?? candidates[0]
}

/** Content types of the files a Vite build emits. */
const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.json': 'application/json; charset=utf-8',
  '.wasm': 'application/wasm',
  '.map': 'application/json; charset=utf-8',
  '.txt': 'text/plain; charset=utf-8',
}

/** One file of the console: its bytes, content type, and whether its name is content-hashed. */
export interface ConsoleAsset {
  body: Uint8Array<ArrayBuffer>
  contentType: string
  /** Files under `assets/` carry a content hash in their name and never change. */
  immutable: boolean
}

/**
 * Reads `rel` (a path relative to the console root; '' is `index.html`) from `dir`.
 * Throws `E_MIG_NOT_FOUND` (404) for a file that is not there, a path that leaves `dir`
 * (`..`, absolute, NUL) or a directory, and `E_MIG_NOT_FOUND` with status 503 and the command
 * that builds it when the console has not been built at all.
 */
export async function readConsoleAsset(dir: string, rel: string): Promise<ConsoleAsset> {
  if (!existsSync(path.join(dir, 'index.html'))) {
    throw new MigError('E_MIG_NOT_FOUND', 'the web console is not built: run `bash .ci/install` or `npm run build:ui` in the migrator directory, then reload', {
      status: 503,
    })
  }
  const name = rel === '' ? 'index.html' : rel
  const full = path.resolve(dir, name)
  if (name.includes('\0') || path.isAbsolute(name) || (full !== dir && !full.startsWith(dir + path.sep))) {
    throw new MigError('E_MIG_NOT_FOUND', `no console file ${JSON.stringify(rel)}`)
  }
  try {
    if (!(await stat(full)).isFile()) throw new Error('not a file')
    const body = await readFile(full)
    return { body, contentType: TYPES[path.extname(full)] ?? 'application/octet-stream', immutable: name.startsWith('assets/') }
  } catch {
    throw new MigError('E_MIG_NOT_FOUND', `no console file ${JSON.stringify(rel)}`)
  }
}
