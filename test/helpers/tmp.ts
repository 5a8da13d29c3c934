/**
 * Test scaffolding free of the app: temporary directories, corpus location, error capture.
 */
import { existsSync, mkdtempSync, realpathSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import * as path from 'node:path'

/**
 * The repository root and the shared corpus (used in place, never copied into the repo). The
 * corpus path is resolved through symlinks, as the importers resolve the paths they report.
 */
export const REPO = path.resolve(import.meta.dir, '../..')
const corpus = path.resolve(REPO, '../shared/corpus')
export const CORPUS = existsSync(corpus) ? realpathSync(corpus) : corpus

/** A fresh temporary directory; `cleanup()` removes it. */
export function tempDir(prefix = 'mig-test-'): { dir: string; cleanup(): void } {
  const dir = mkdtempSync(path.join(tmpdir(), prefix))
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) }
}

/** Runs `fn` and returns the error it throws (fails the test if it does not throw). */
export async function thrown(fn: () => unknown): Promise<any> {
  try {
    await fn()
  } catch (e) {
    return e
  }
  throw new Error('expected an error, none was thrown')
}
