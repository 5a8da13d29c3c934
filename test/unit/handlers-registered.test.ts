/**
 * Every handler file under handlers/ is registered in runtime/handlers.ts, and every registered
 * module is such a file: a new endpoint file that is not added to HANDLERS (or a module listed
 * there that is not one file per endpoint under handlers/) fails here. Each file exports
 * `method`, `path` and `handle`, and no two register the same method and path.
 */
import { describe, expect, test } from 'bun:test'
import { readdirSync, statSync } from 'node:fs'
import path from 'node:path'
import { HANDLERS } from '../../runtime/handlers.ts'
import type { HandlerModule } from '../../runtime/router.ts'

const ROOT = path.resolve(import.meta.dir, '../../handlers')

/** Every .ts file under handlers/, relative to it. */
function handlerFiles(dir = ROOT): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = path.join(dir, name)
    if (statSync(p).isDirectory()) return handlerFiles(p)
    return name.endsWith('.ts') ? [path.relative(ROOT, p)] : []
  })
}

describe('handler registration', () => {
  const files = handlerFiles()

  test('handlers/ holds the endpoint files', () => {
    expect(files.length).toBeGreaterThan(20)
  })

  test('every file under handlers/ exports method, path and handle and is in HANDLERS; HANDLERS holds nothing else', async () => {
    const modules = new Map<HandlerModule, string>()
    const unregistered: string[] = []
    for (const file of files) {
      const m = (await import(path.join(ROOT, file))) as HandlerModule
      expect({ file, method: typeof m.method, path: typeof m.path, handle: typeof m.handle }).toEqual({
        file,
        method: 'string',
        path: 'string',
        handle: 'function',
      })
      modules.set(m, file)
      if (!HANDLERS.includes(m)) unregistered.push(file)
    }
    expect(unregistered).toEqual([])
    const foreign = HANDLERS.filter((m) => !modules.has(m)).map((m) => `${m.method} ${m.path}`)
    expect(foreign).toEqual([])
    expect(HANDLERS.length).toBe(files.length)
  })

  test('no two handlers answer the same method and path', () => {
    const routes = HANDLERS.map((m) => `${m.method} ${m.path}`)
    expect(routes.filter((r, i) => routes.indexOf(r) !== i)).toEqual([])
  })
})
