/**
 * The web console's endpoints as functions and through the app: `GET /ui/*` serves the Vite build
 * (index, hashed assets with their content types and cache headers, the redirect from `/ui`,
 * 404 for unknown files and paths leaving the build directory, 503 with the build command when
 * nothing is built), behind the Basic guard; `GET /migrations/:id/serial-log` tails the serial
 * console log of the job's domain.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync, readdirSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import * as serialLog from '../../handlers/migrations/serial-log.ts'
import { consoleDir, readConsoleAsset } from '../../lib/ui/assets.ts'
import type { Ctx } from '../../runtime/context.ts'
import { req, tempDir, testApp, testCtx, thrown } from '../helpers/env.ts'

describe('GET /ui/*', () => {
  let app: Awaited<ReturnType<typeof testApp>>
  beforeAll(async () => {
    app = await testApp({ MIGRATOR_BASIC_AUTH: 'op:s3cret' })
  })
  afterAll(() => app.cleanup())
  const auth = { authorization: `Basic ${Buffer.from('op:s3cret').toString('base64')}` }

  test('serves the built index and its hashed assets (built by .ci/install)', async () => {
    const index = await app.app.fetch(req('GET', '/ui/', undefined, auth))
    expect([index.status, index.headers.get('content-type'), index.headers.get('cache-control')]).toEqual([200, 'text/html; charset=utf-8', 'no-cache'])
    const html = await index.text()
    const js = /src="\.\/(assets\/[^"]+\.js)"/.exec(html)?.[1]
    expect(js).toBeDefined()
    // relative asset URLs: the console works under any API base path, with nothing from outside
    expect(html).not.toMatch(/(src|href)="(https?:)?\/\//)
    const asset = await app.app.fetch(req('GET', `/ui/${js}`, undefined, auth))
    expect([asset.status, asset.headers.get('content-type'), asset.headers.get('cache-control')]).toEqual([
      200,
      'text/javascript; charset=utf-8',
      'public, max-age=31536000, immutable',
    ])
    expect((await asset.text()).length).toBeGreaterThan(1000)
  })

  test('/ui redirects to /ui/', async () => {
    const res = await app.app.fetch(req('GET', '/ui', undefined, auth))
    expect([res.status, res.headers.get('location')]).toEqual([308, '/api/v1/migrator/ui/'])
  })

  test('behind the same Basic guard as the API', async () => {
    const res = await app.app.fetch(req('GET', '/ui/'))
    expect([res.status, res.headers.get('www-authenticate')]).toEqual([401, 'Basic realm="migrator"'])
  })

  test('unknown files and paths that leave the build directory: 404 E_MIG_NOT_FOUND', async () => {
    for (const p of ['/ui/nope.js', '/ui/..%2F..%2Fpackage.json', '/ui/assets/', '/ui/%2Fetc%2Fpasswd']) {
      const res = await app.app.fetch(req('GET', p, undefined, auth))
      expect([p, res.status, ((await res.json()) as any).error.code]).toEqual([p, 404, 'E_MIG_NOT_FOUND'])
    }
  })

  test('no build: 503 naming the command that builds it', async () => {
    const t = tempDir()
    try {
      const e = await thrown(() => readConsoleAsset(t.dir, ''))
      expect([e.code, e.status]).toEqual(['E_MIG_NOT_FOUND', 503])
      expect(e.message).toContain('npm run build:ui')
      // a built directory answers
      writeFileSync(path.join(t.dir, 'index.html'), '<!doctype html>')
      expect((await readConsoleAsset(t.dir, '')).contentType).toBe('text/html; charset=utf-8')
    } finally {
      t.cleanup()
    }
    expect(readdirSync(consoleDir())).toContain('index.html')
  })
})

describe('GET /migrations/:id/serial-log', () => {
  let ctx: Ctx
  let cleanup: () => Promise<void>
  beforeAll(async () => {
    ;({ ctx, cleanup } = await testCtx())
  })
  afterAll(() => cleanup())

  test('the last lines of the domain serial log, control characters removed; empty before a domain exists', async () => {
    const job = await ctx.store.jobs.create({
      id: crypto.randomUUID(),
      plan: { source: { Offline: 'ova_archive' }, source_ref: { kind: 'offline_host_path', path: 'x.ova' }, mode: 'Cold' },
      strategy: 'offline',
      effective_mode: 'Cold',
      now: new Date().toISOString(),
    })
    const get = async (q = '') => (await serialLog.handle(req('GET', `/migrations/${job.id}/serial-log${q}`), ctx, { id: job.id })).json() as Promise<any>
    expect(await get()).toEqual({ id: job.id, domain: null, lines: [] })
    await ctx.store.jobs.update(job.id, { domain: 'web01' }, new Date().toISOString())
    mkdirSync(path.join(ctx.config.dataDir, 'logs'), { recursive: true })
    writeFileSync(path.join(ctx.config.dataDir, 'logs', `${job.id}.serial.log`), Array.from({ length: 80 }, (_, i) => `line ${i}\x1b[0m`).join('\r\n') + '\r\n')
    const all = await get()
    expect([all.domain, all.lines.length, all.lines[0], all.lines[49]]).toEqual(['web01', 50, 'line 30[0m', 'line 79[0m'])
    expect((await get('?lines=3')).lines).toEqual(['line 77[0m', 'line 78[0m', 'line 79[0m'])
  })

  test('bad ?lines= is E_MIG_BAD_REQUEST, an unknown job E_MIG_NOT_FOUND', async () => {
    const job = (await ctx.store.jobs.list())[0]!
    for (const q of ['0', '201', 'x', '1.5']) {
      const e = await thrown(() => serialLog.handle(req('GET', `/migrations/${job.id}/serial-log?lines=${q}`), ctx, { id: job.id }))
      expect([q, e.code]).toEqual([q, 'E_MIG_BAD_REQUEST'])
    }
    const id = crypto.randomUUID()
    expect((await thrown(() => serialLog.handle(req('GET', `/migrations/${id}/serial-log`), ctx, { id }))).code).toBe('E_MIG_NOT_FOUND')
  })
})
