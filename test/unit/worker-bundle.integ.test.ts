import { describe, expect, test } from 'bun:test'
import { execFileSync, spawnSync } from 'node:child_process'
import { mkdirSync, utimesSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { freshWorkerBundle, WORKER_BUNDLE } from '../../runtime/worker-bundle.ts'
import { REPO, tempDir } from '../helpers/tmp.ts'

/** A fake repository: one source under lib/, one under runtime/, the lock file and (optionally) the bundle, with mtimes in seconds. */
function repo(t: { lib: number; runtime: number; lock: number; bundle?: number; jsc?: number }) {
  const d = tempDir('i15-wb-')
  const at = (p: string, s: number) => {
    mkdirSync(path.dirname(p), { recursive: true })
    writeFileSync(p, 'x')
    utimesSync(p, s, s)
  }
  at(path.join(d.dir, 'lib/pipeline/a.ts'), t.lib)
  at(path.join(d.dir, 'runtime/worker.ts'), t.runtime)
  at(path.join(d.dir, 'package-lock.json'), t.lock)
  if (t.bundle !== undefined) at(path.join(d.dir, WORKER_BUNDLE), t.bundle)
  if (t.jsc !== undefined) at(path.join(d.dir, `${WORKER_BUNDLE}.jsc`), t.jsc)
  return d
}

describe('worker bundle choice', () => {
  test('a bundle newer than every source is used', () => {
    const d = repo({ lib: 1000, runtime: 1000, lock: 900, bundle: 2000, jsc: 2000 })
    expect(freshWorkerBundle(d.dir)).toBe(path.join(d.dir, WORKER_BUNDLE))
    d.cleanup()
  })
  test('a source, the lock file or a missing bytecode file makes it stale: the .ts entry runs', () => {
    for (const t of [
      { lib: 3000, runtime: 1000, lock: 900, bundle: 2000, jsc: 2000 },
      { lib: 1000, runtime: 3000, lock: 900, bundle: 2000, jsc: 2000 },
      { lib: 1000, runtime: 1000, lock: 3000, bundle: 2000, jsc: 2000 },
      { lib: 1000, runtime: 1000, lock: 900, bundle: 2000 },
      { lib: 1000, runtime: 1000, lock: 900 },
    ]) {
      const d = repo(t)
      expect(freshWorkerBundle(d.dir)).toBeNull()
      d.cleanup()
    }
  })
  test('the built bundle loads under Bun and waits for its configuration like the .ts entry', () => {
    const d = tempDir('i15-wb-build-')
    const out = path.join(d.dir, 'bun')
    execFileSync(
      path.join(REPO, 'node_modules/.bin/bun'),
      ['build', 'runtime/worker.ts', '--target', 'bun', '--minify', '--bytecode', '--external', 'better-sqlite3', '--outdir', out],
      {
        cwd: REPO,
        stdio: 'ignore',
      },
    )
    // Without an IPC channel the worker never gets its configuration: it must fail after loading
    // every module (not on a missing one), with the .ts entry's message. A short timer stands in for the 30 s.
    const r = spawnSync(
      path.join(REPO, 'node_modules/.bin/bun'),
      ['-e', `setTimeout(() => { console.log('loaded'); process.exit(0) }, 300); require(${JSON.stringify(path.join(out, 'worker.js'))})`],
      { encoding: 'utf8', timeout: 20_000 },
    )
    expect(r.stderr).not.toMatch(/Cannot find|error/i)
    expect(r.stdout).toContain('loaded')
    d.cleanup()
  })
})
