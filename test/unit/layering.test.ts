// The layering rules of DESIGN.md ("no upward imports"), checked on the source text of lib/,
// runtime/, handlers/ and cli/: the layer order below (docs/architecture.md "Layers"), no import
// from a lower layer to a higher one, and no import cycle anywhere.
import { describe, expect, test } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'

const ROOT = resolve(import.meta.dir, '../..')

/** The folders whose files are checked. */
const TREE = ['lib', 'runtime', 'handlers', 'cli']

/**
 * The layers, lowest first. A file belongs to the layer with the longest path that names it (a
 * folder ends in `/`); it may import files of its own layer and of lower ones, never of a higher
 * one. Same order in docs/architecture.md "Layers".
 */
const LAYERS: Array<{ name: string; paths: string[] }> = [
  {
    name: 'shared',
    paths: [
      'lib/errors.ts',
      'lib/bytes.ts',
      'lib/buffer-pool.ts',
      'lib/kinds.ts',
      'lib/mac.ts',
      'lib/throttle.ts',
      'lib/cpu-time.ts',
      'lib/script-thread.ts',
      'lib/tls.ts',
      'lib/retry.ts',
      'lib/limits.ts',
      'lib/exec.ts',
    ],
  },
  { name: 'contracts', paths: ['lib/contracts/'] },
  { name: 'records', paths: ['lib/manifest.ts', 'lib/remote/ref.ts', 'lib/plan.ts', 'lib/job.ts'] },
  { name: 'host', paths: ['lib/hostpath.ts', 'lib/hostfiles.ts', 'lib/host/', 'lib/crypto/', 'lib/http/', 'lib/ui/', 'lib/auth/', 'lib/nbd/'] },
  { name: 'formats', paths: ['lib/formats/'] },
  { name: 'importers', paths: ['lib/importers/'] },
  { name: 'store', paths: ['lib/store/'] },
  { name: 'inputs', paths: ['lib/remote/', 'lib/adapters/', 'lib/sources.ts', 'lib/uploads/', 'lib/backup/'] },
  { name: 'sink', paths: ['lib/sink/'] },
  { name: 'pipeline', paths: ['lib/pipeline/'] },
  { name: 'destination', paths: ['lib/domain/', 'lib/v2v/'] },
  { name: 'jobs', paths: ['lib/jobs/', 'lib/live-import/', 'lib/metrics/'] },
  { name: 'api', paths: ['lib/openapi.ts'] },
  { name: 'runtime', paths: ['runtime/'] },
  { name: 'handlers', paths: ['handlers/'] },
  { name: 'server', paths: ['runtime/handlers.ts', 'runtime/app.ts', 'runtime/serve-bun.ts', 'runtime/serve-node.ts'] },
  { name: 'cli', paths: ['cli/'] },
]

type Graph = Map<string, string[]>

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

const graph: Graph = new Map(TREE.flatMap((d) => tsFiles(join(ROOT, d))).map((f) => [relative(ROOT, f), importsOf(f)]))

/** The index in {@link LAYERS} of `file` (longest matching path), or -1 when no layer names it. */
function layerOf(file: string): number {
  let best = -1
  let bestLength = 0
  LAYERS.forEach((layer, i) => {
    for (const p of layer.paths) {
      const hit = p.endsWith('/') ? file.startsWith(p) : file === p
      if (hit && p.length > bestLength) {
        best = i
        bestLength = p.length
      }
    }
  })
  return best
}

/** `file (layer) -> import (layer)` for every import of `g` that runs up the layers, or to a file no layer names. */
function backUpImports(g: Graph): string[] {
  const out: string[] = []
  for (const [file, deps] of g) {
    const from = layerOf(file)
    for (const d of deps) {
      const to = layerOf(d)
      if (to < 0 || to > from) out.push(`${file} (${LAYERS[from]?.name ?? 'no layer'}) -> ${d} (${LAYERS[to]?.name ?? 'no layer'})`)
    }
  }
  return out
}

/** Every import cycle of `g` that a depth-first walk meets, as `a -> b -> ... -> a`. */
function cyclesOf(g: Graph): string[] {
  const cycles: string[] = []
  const state = new Map<string, 'open' | 'done'>()
  const visit = (f: string, stack: string[]): void => {
    if (state.get(f) === 'done') return
    if (state.get(f) === 'open') {
      cycles.push([...stack.slice(stack.indexOf(f)), f].join(' -> '))
      return
    }
    state.set(f, 'open')
    for (const d of g.get(f) ?? []) visit(d, [...stack, f])
    state.set(f, 'done')
  }
  for (const f of g.keys()) visit(f, [])
  return cycles
}

/** `file -> import` pairs breaking a rule: files under `from` importing anything under one of `banned`. */
function violations(from: string, banned: string[]): string[] {
  const out: string[] = []
  for (const [file, deps] of graph) {
    if (!file.startsWith(from)) continue
    for (const d of deps) if (banned.some((b) => d.startsWith(b))) out.push(`${file} -> ${d}`)
  }
  return out
}

describe('layering of lib/, runtime/, handlers/, cli/', () => {
  test('the scanner sees the imports it checks (it cannot pass by finding nothing)', () => {
    expect(graph.size).toBeGreaterThan(250)
    expect(graph.get('lib/pipeline/copy-disk.ts')).toContain('lib/contracts/disk-reader.ts')
    expect(graph.get('lib/formats/vmdk/inspect.ts')).toContain('lib/contracts/inspect.ts')
    expect(graph.get('runtime/worker.ts')).toContain('lib/jobs/orchestrator.ts')
    expect(graph.get('handlers/migrations/create.ts')).toContain('runtime/context.ts')
    expect(graph.get('runtime/handlers.ts')).toContain('handlers/migrations/create.ts')
    // a banned import in a file would be reported
    expect([...graph.values()].flat().some((d) => d.startsWith('lib/errors'))).toBe(true)
  })

  test('every file belongs to a layer', () => {
    expect([...graph.keys()].filter((f) => layerOf(f) < 0)).toEqual([])
  })

  test('no import runs back up the layers', () => {
    expect(backUpImports(graph)).toEqual([])
  })

  test('no import cycle anywhere', () => {
    expect(cyclesOf(graph)).toEqual([])
  })

  test('the checks fail on a back-up import and on a cycle (a synthetic graph)', () => {
    const bad: Graph = new Map([
      ['lib/formats/qcow2.ts', ['lib/errors.ts', 'lib/jobs/orchestrator.ts']],
      ['lib/jobs/orchestrator.ts', ['lib/jobs/offline-copy.ts']],
      ['lib/jobs/offline-copy.ts', ['lib/jobs/orchestrator.ts']],
      ['runtime/worker.ts', ['lib/jobs/orchestrator.ts', 'somewhere/else.ts']],
      ['lib/errors.ts', []],
    ])
    expect(backUpImports(bad)).toEqual([
      'lib/formats/qcow2.ts (formats) -> lib/jobs/orchestrator.ts (jobs)',
      'runtime/worker.ts (runtime) -> somewhere/else.ts (no layer)',
    ])
    expect(cyclesOf(bad)).toEqual(['lib/jobs/orchestrator.ts -> lib/jobs/offline-copy.ts -> lib/jobs/orchestrator.ts'])
    // the longest path wins: runtime/app.ts sits above handlers/, the rest of runtime/ below
    expect(LAYERS[layerOf('runtime/app.ts')]!.name).toBe('server')
    expect(LAYERS[layerOf('runtime/context.ts')]!.name).toBe('runtime')
    expect(LAYERS[layerOf('lib/remote/ref.ts')]!.name).toBe('records')
    expect(LAYERS[layerOf('lib/remote/folder.ts')]!.name).toBe('inputs')
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
})
