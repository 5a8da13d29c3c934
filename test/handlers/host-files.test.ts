import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import * as browse from '../../handlers/host-files/browse.ts'
import * as inspect from '../../handlers/host-files/inspect.ts'
import { req, testCtx, thrown } from '../helpers/env.ts'
import type { Ctx } from '../../runtime/context.ts'

let ctx: Ctx
let dir: string
let cleanup: () => Promise<void>
beforeAll(async () => {
  ;({ ctx, dir, cleanup } = await testCtx())
  const root = ctx.config.importRoot
  mkdirSync(path.join(root, 'vmware', 'web01'), { recursive: true })
  writeFileSync(path.join(root, 'vmware', 'web01', 'web01.vmx'), 'displayName = "web01"\n')
  writeFileSync(path.join(root, 'big.ova'), Buffer.alloc(4096))
  mkdirSync(path.join(dir, 'outside'))
  writeFileSync(path.join(dir, 'outside', 'shadow'), 'secret')
  symlinkSync(path.join(dir, 'outside'), path.join(root, 'escape'))
  symlinkSync(path.join(root, 'vmware'), path.join(root, 'vmware-link'))
  writeFileSync(path.join(ctx.paths.uploads, 'someone-elses-upload'), 'x')
})
afterAll(() => cleanup())

const browseAt = (p?: string) => browse.handle(req('GET', p === undefined ? '/host-files' : `/host-files?path=${encodeURIComponent(p)}`), ctx)

describe('GET /host-files', () => {
  test('lists the root: directories first, .uploads hidden, escaping symlinks shown but not followed', async () => {
    const res = await browseAt()
    expect(res.status).toBe(200)
    const body = await res.json()
    expect(body.path).toBe('')
    expect(body.truncated).toBe(false)
    expect(body.items.map((i: any) => [i.name, i.type])).toEqual([
      ['vmware', 'directory'],
      ['vmware-link', 'directory'],
      ['big.ova', 'file'],
      ['escape', 'symlink'],
    ])
    const ova = body.items.find((i: any) => i.name === 'big.ova')
    expect(ova).toMatchObject({ path: 'big.ova', size_bytes: 4096 })
    expect(new Date(ova.modified_at).getTime()).toBeGreaterThan(0)
  })

  test('lists a subdirectory with root-relative paths', async () => {
    const body = await (await browseAt('vmware/web01')).json()
    expect(body.path).toBe('vmware/web01')
    expect(body.items).toEqual([expect.objectContaining({ name: 'web01.vmx', path: 'vmware/web01/web01.vmx', type: 'file', size_bytes: 22 })])
  })

  test('every way out is E_MIG_HOST_PATH_REJECTED', async () => {
    for (const p of ['..', '../..', '/etc', 'escape', 'escape/', 'vmware/../../', '.uploads', '%2e%2e', 'vmware/\0']) {
      const e = await thrown(() => browseAt(p))
      expect([p, e.code]).toEqual([p, 'E_MIG_HOST_PATH_REJECTED'])
    }
  })

  test('missing directory E_MIG_NOT_FOUND; a file E_MIG_BAD_REQUEST', async () => {
    expect((await thrown(() => browseAt('nope'))).code).toBe('E_MIG_NOT_FOUND')
    expect((await thrown(() => browseAt('big.ova'))).code).toBe('E_MIG_BAD_REQUEST')
  })
})

describe('POST /host-files/inspect (rejections)', () => {
  const call = (body: unknown) => inspect.handle(req('POST', '/host-files/inspect', body), ctx)
  test('escapes, bad bodies, missing files', async () => {
    for (const p of ['../outside/shadow', '/etc/passwd', 'escape/shadow', '.uploads/someone-elses-upload'])
      expect((await thrown(() => call({ path: p }))).code).toBe('E_MIG_HOST_PATH_REJECTED')
    expect((await thrown(() => call({}))).code).toBe('E_MIG_BAD_REQUEST')
    expect((await thrown(() => call({ path: 'big.ova', kind: 'iso' }))).code).toBe('E_MIG_BAD_REQUEST')
    expect((await thrown(() => call({ path: 'missing.ova' }))).code).toBe('E_MIG_NOT_FOUND')
  })
})
