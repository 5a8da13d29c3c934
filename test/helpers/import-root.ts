/**
 * The scaffolding of the importer and format tests that build inputs on disk: one temporary
 * import root per test file, and qemu-img run quietly.
 */
import { afterAll } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { tempDir } from './tmp.ts'

/**
 * A temporary import root (`mkdtemp` under the system's tmp, name starting with `prefix`) made now
 * and removed after the file's tests; `ctx()` is the importers' context over it.
 */
export function importRootFor(prefix: string): { root: string; ctx: () => { importRoot: string } } {
  const t = tempDir(prefix)
  afterAll(() => t.cleanup())
  return { root: t.dir, ctx: () => ({ importRoot: t.dir }) }
}

/** Runs `qemu-img <args>` in `cwd`, its output captured (its stderr is in the error when it fails). */
export function qemuImg(cwd: string, ...args: string[]): void {
  execFileSync('qemu-img', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] })
}
