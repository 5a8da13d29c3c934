// The layering rules of DESIGN.md ("no upward imports"), checked on the source text of lib/.
import { describe, expect, test } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'

const ROOT = resolve(import.meta.dir, '../..')

function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name)
    return e.isDirectory() ? tsFiles(p) : e.name.endsWith('.ts') ? [p] : []
  })
}

/** Every relative module a file imports or re-exports (static, `import type`, dynamic `import()`), as root-relative paths. */
function importsOf(file: string): string[] {
  const src = readFileSync(file, 'utf8')
  const specs = [
    ...src.matchAll(/(?:^|\n)\s*(?:import|export)\b[^'"]*?\bfrom\s*['"]([^'"]+)['"]/g),
    ...src.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g),
  ].map((m) => m[1]!)
  return specs.filter((s) => s.startsWith('.')).map((s) => relative(ROOT, resolve(dirname(file), s)))
}

const graph = new Map(tsFiles(join(ROOT, 'lib')).map((f) => [relative(ROOT, f), importsOf(f)]))

/** `file -> import` pairs breaking a rule: files under `from` importing anything under one of `banned`. */
function violations(from: string, banned: string[]): string[] {
  const out: string[] = []
  for (const [file, deps] of graph) {
    if (!file.startsWith(from)) continue
    for (const d of deps) if (banned.some((b) => d.startsWith(b))) out.push(`${file} -> ${d}`)
  }
  return out
}

describe('layering of lib/', () => {
  test('the scanner sees the imports it checks (it cannot pass by finding nothing)', () => {
    expect(graph.size).toBeGreaterThan(50)
    expect(graph.get('lib/pipeline/copy-disk.ts')).toContain('lib/contracts/disk-reader.ts')
    expect(graph.get('lib/formats/vmdk/inspect.ts')).toContain('lib/contracts/inspect.ts')
    // a banned import in a file would be reported
    expect([...graph.values()].flat().some((d) => d.startsWith('lib/errors'))).toBe(true)
  })

  test('no lib module imports from handlers/ or runtime/', () => {
    expect(violations('lib/', ['handlers/', 'runtime/'])).toEqual([])
  })

  test('no format module imports from importers, pipeline or store', () => {
    expect(violations('lib/formats/', ['lib/importers/', 'lib/pipeline/', 'lib/store/'])).toEqual([])
  })

  test('contracts depend on nothing but other contracts and the shared domain types', () => {
    expect(violations('lib/contracts/', ['lib/importers/', 'lib/pipeline/', 'lib/store/', 'lib/adapters/', 'lib/sink/', 'lib/formats/'])).toEqual([])
  })

  test('adapters do not import from the store or the pipeline (session.ts is the glue that loads a source from the store)', () => {
    expect(violations('lib/adapters/', ['lib/store/', 'lib/pipeline/']).filter((v) => !v.startsWith('lib/adapters/session.ts -> lib/store/'))).toEqual([])
  })

  test('no import cycle between lib modules', () => {
    const cycles: string[] = []
    const state = new Map<string, 'open' | 'done'>()
    const visit = (f: string, stack: string[]): void => {
      if (state.get(f) === 'done') return
      if (state.get(f) === 'open') {
        cycles.push([...stack.slice(stack.indexOf(f)), f].join(' -> '))
        return
      }
      state.set(f, 'open')
      for (const d of graph.get(f) ?? []) visit(d, [...stack, f])
      state.set(f, 'done')
    }
    for (const f of graph.keys()) visit(f, [])
    expect(cycles).toEqual([])
  })
})
