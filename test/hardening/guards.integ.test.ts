/**
 * Guards, each test able to fail: a non-loopback
 * listen address needs the Basic guard, the default upload cap is 20 GiB, `GET /host-files`
 * stops at 10 000 entries, uploads left `receiving` by a crash are removed at start, and an
 * offline plan submitted in Warm mode runs cold.
 */
import { afterAll, expect, test } from 'bun:test'
import { closeSync, existsSync, mkdirSync, openSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import * as browse from '../../handlers/host-files/browse.ts'
import * as migrationsCreate from '../../handlers/migrations/create.ts'
import { MAX_ENTRIES } from '../../lib/hostfiles.ts'
import { createApp } from '../../runtime/app.ts'
import { createContext } from '../../runtime/context.ts'
import { loadConfig } from '../../runtime/config.ts'
import { req, testConfig, testCtx } from '../helpers/env.ts'
import { tempDir } from '../helpers/tmp.ts'

const dirs: Array<{ cleanup(): void }> = []
afterAll(() => {
  for (const d of dirs) d.cleanup()
})

test('a non-loopback listen address requires MIGRATOR_BASIC_AUTH', () => {
  expect(() => loadConfig({ MIGRATOR_LISTEN: '0.0.0.0:8080' })).toThrow(/MIGRATOR_BASIC_AUTH/)
  expect(() => loadConfig({ MIGRATOR_LISTEN: '192.0.2.7:8080' })).toThrow(/MIGRATOR_BASIC_AUTH/)
  expect(loadConfig({ MIGRATOR_LISTEN: '0.0.0.0:8080', MIGRATOR_BASIC_AUTH: 'op:secret' }).basicAuth).toBe('op:secret')
  expect(loadConfig({ MIGRATOR_LISTEN: '127.0.0.1:8080' }).basicAuth).toBeNull()
})

test('the default upload cap is 20 GiB (spec 8)', () => {
  expect(loadConfig({}).uploadCapBytes).toBe(20 * 1024 ** 3)
})

test('GET /host-files lists at most 10 000 entries and says truncated', async () => {
  const { ctx, cleanup } = await testCtx()
  try {
    const dir = path.join(ctx.config.importRoot, 'many')
    mkdirSync(dir)
    for (let i = 0; i < MAX_ENTRIES + 5; i++) closeSync(openSync(path.join(dir, `f${i}`), 'w'))
    const res = await browse.handle(req('GET', '/host-files?path=many'), ctx)
    const body = (await res.json()) as { items: unknown[]; truncated: boolean }
    expect(MAX_ENTRIES).toBe(10_000)
    expect([body.items.length, body.truncated]).toEqual([10_000, true])
  } finally {
    await cleanup()
  }
}, 60_000)

test('uploads left receiving by a crash are removed when the server starts', async () => {
  const t = tempDir()
  dirs.push(t)
  const config = testConfig(t.dir)
  const ctx = await createContext(config)
  const id = '0b7c1e52-8f43-4f0e-9d5a-6a1f2b3c4d5e'
  await ctx.store.uploads.begin({
    id,
    filename: 'half.ova',
    now: new Date(Date.now() - 1000).toISOString(),
    expires_at: new Date(Date.now() + 3600_000).toISOString(),
  })
  writeFileSync(path.join(ctx.paths.uploads, id), 'half a body')
  await ctx.store.close()
  const app = await createApp(config, { runJobs: false })
  try {
    expect(existsSync(path.join(app.ctx.paths.uploads, id))).toBe(false)
    expect(await app.ctx.store.uploads.list(new Date().toISOString())).toEqual([])
  } finally {
    await app.close()
  }
})

test('an offline plan submitted in Warm mode runs cold', async () => {
  const { ctx, cleanup } = await testCtx()
  try {
    writeFileSync(path.join(ctx.config.importRoot, 'w.qcow2'), 'x')
    const res = await migrationsCreate.handle(
      req('POST', '/migrations', { plan: { source: { Offline: 'qcow2' }, source_ref: { kind: 'offline_host_path', path: 'w.qcow2' }, mode: 'Warm' } }),
      ctx,
    )
    expect(res.status).toBe(201)
    const job = (await res.json()) as { plan: { mode: string }; effective_mode: string; strategy: string }
    expect([job.plan.mode, job.effective_mode, job.strategy]).toEqual(['Warm', 'Cold', 'offline'])
  } finally {
    await cleanup()
  }
})

test('lease exclusivity: a second server never claims a job whose lease is live', async () => {
  const t = tempDir()
  dirs.push(t)
  const { openStore } = await import('../../lib/store/index.ts')
  const { parseSubmitBody } = await import('../../lib/plan.ts')
  const file = path.join(t.dir, 'migrator.sqlite')
  const a = await openStore(file)
  const b = await openStore(file)
  try {
    const now = new Date('2026-11-24T00:00:00Z')
    const plan = parseSubmitBody({ plan: { source: { Offline: 'qcow2' }, source_ref: { kind: 'offline_host_path', path: 'x.qcow2' }, mode: 'Cold' } })
    const job = await a.jobs.create({ id: '5f0c3a1e-0b1d-4c2e-9f3a-7b6c5d4e3f21', plan, strategy: 'offline', effective_mode: 'Cold', now: now.toISOString() })
    expect(await a.jobs.claimNext('server-a', 30, now)).toBe(job.id)
    // Server b, one second and 29 seconds later: the lease is live.
    expect(await b.jobs.claimNext('server-b', 30, new Date(now.getTime() + 1000))).toBeNull()
    expect(await b.jobs.claimNext('server-b', 30, new Date(now.getTime() + 29_000))).toBeNull()
    // a renews; b still cannot take it; once a's lease expired, b does, and a's renewal fails.
    expect(await a.jobs.renewLease(job.id, 'server-a', 30, new Date(now.getTime() + 20_000))).toBe(true)
    expect(await b.jobs.claimNext('server-b', 30, new Date(now.getTime() + 49_000))).toBeNull()
    expect(await b.jobs.claimNext('server-b', 30, new Date(now.getTime() + 51_000))).toBe(job.id)
    expect(await a.jobs.renewLease(job.id, 'server-a', 30, new Date(now.getTime() + 52_000))).toBe(false)
  } finally {
    await a.close()
    await b.close()
  }
})
