import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import * as create from '../../handlers/migrations/create.ts'
import * as list from '../../handlers/migrations/list.ts'
import * as get from '../../handlers/migrations/get.ts'
import * as cancel from '../../handlers/migrations/cancel.ts'
import * as sourcesCreate from '../../handlers/sources/create.ts'
import { req, testCtx, thrown } from '../helpers/env.ts'
import type { Ctx } from '../../runtime/context.ts'

let ctx: Ctx
let cleanup: () => Promise<void>
beforeAll(async () => {
  ;({ ctx, cleanup } = await testCtx())
  mkdirSync(path.join(ctx.config.importRoot, 'exports'), { recursive: true })
  writeFileSync(path.join(ctx.config.importRoot, 'exports', 'web01.ova'), 'not really an ova')
  symlinkSync('/etc', path.join(ctx.config.importRoot, 'etc-link'))
})
afterAll(() => cleanup())

const offline = (p: string) => ({ plan: { source: { Offline: 'ova_archive' }, source_ref: { kind: 'offline_host_path', path: p }, mode: 'Cold' } })

describe('migrations handlers', () => {
  let jobId = ''
  test('POST /migrations (offline): 201 with a Queued job and a migration event', async () => {
    const res = await create.handle(req('POST', '/migrations', offline('exports/web01.ova')), ctx)
    expect(res.status).toBe(201)
    const job = await res.json()
    jobId = job.id
    expect(job).toMatchObject({
      state: 'Queued',
      status: 'queued',
      strategy: 'offline',
      effective_mode: 'Cold',
      last_error: null,
      started_at: null,
      finished_at: null,
    })
    expect(job.progress).toEqual({ bytes_total: 0, bytes_done: 0, bytes_zero: 0, rate_bytes_per_s: 0, eta_s: null, disks: [] })
    const events = await ctx.store.events.since(0, 10, jobId)
    expect(events.map((e) => e.event)).toEqual(['migration'])
  })

  test('POST /migrations (live): unknown source 404, kind mismatch 400, known source 201', async () => {
    const live = (source_id: string, kind = 'vim_api') => ({
      plan: { source: { Live: kind }, source_ref: { kind: 'live_vm', source_id, vm_id: 'vm-7' }, mode: 'Warm' },
    })
    expect((await thrown(() => create.handle(req('POST', '/migrations', live('00000000-0000-4000-8000-000000000001')), ctx))).code).toBe('E_MIG_NOT_FOUND')
    const src = await (
      await sourcesCreate.handle(
        req('POST', '/sources', { name: 'pve1', kind: 'pve_api', endpoint: 'https://pve1:8006', username: 'root@pam', password: 'pw' }),
        ctx,
      )
    ).json()
    const mismatch = await thrown(() => create.handle(req('POST', '/migrations', live(src.id)), ctx))
    expect(mismatch.code).toBe('E_MIG_INVALID_PLAN')
    const ok = await (await create.handle(req('POST', '/migrations', live(src.id, 'pve_api')), ctx)).json()
    expect(ok).toMatchObject({ strategy: 'live', effective_mode: 'Warm', state: 'Queued' })
  })

  test('POST /migrations: path escapes are E_MIG_HOST_PATH_REJECTED, missing paths E_MIG_NOT_FOUND', async () => {
    for (const p of ['../../etc/passwd', '/etc/passwd', 'etc-link/passwd', 'exports/%2e%2e/%2e%2e/x', '.uploads/x']) {
      const e = await thrown(() => create.handle(req('POST', '/migrations', offline(p)), ctx))
      expect(e.code).toBe('E_MIG_HOST_PATH_REJECTED')
      expect(e.status).toBe(403)
    }
    expect((await thrown(() => create.handle(req('POST', '/migrations', offline('exports/none.ova')), ctx))).code).toBe('E_MIG_NOT_FOUND')
  })

  test('POST /migrations: an unknown upload is E_MIG_UPLOAD_NOT_FOUND; bad plans E_MIG_INVALID_PLAN; bad JSON E_MIG_BAD_REQUEST', async () => {
    const up = { plan: { source: { Offline: 'ova_archive' }, source_ref: { kind: 'upload', upload_id: '00000000-0000-4000-8000-000000000002' }, mode: 'Cold' } }
    expect((await thrown(() => create.handle(req('POST', '/migrations', up), ctx))).code).toBe('E_MIG_UPLOAD_NOT_FOUND')
    const inv = await thrown(() => create.handle(req('POST', '/migrations', { plan: { mode: 'Cold' } }), ctx))
    expect(inv.code).toBe('E_MIG_INVALID_PLAN')
    expect(inv.details.issues.map((i: any) => i.path)).toEqual(expect.arrayContaining(['plan.source', 'plan.source_ref']))
    expect((await thrown(() => create.handle(req('POST', '/migrations', '[1,2]'), ctx))).code).toBe('E_MIG_BAD_REQUEST')
    expect((await thrown(() => create.handle(req('POST', '/migrations', 'x'.repeat(2 * 1024 * 1024)), ctx))).code).toBe('E_MIG_BAD_REQUEST')
  })

  test('GET /migrations and /migrations/:id', async () => {
    const l = await (await list.handle(req('GET', '/migrations'), ctx)).json()
    expect(l.items.length).toBe(2)
    expect(l.items.map((j: any) => j.id)).toContain(jobId)
    expect((await (await get.handle(req('GET', '/x'), ctx, { id: jobId })).json()).id).toBe(jobId)
    expect((await thrown(() => get.handle(req('GET', '/x'), ctx, { id: 'nope' }))).code).toBe('E_MIG_NOT_FOUND')
  })

  test('POST /migrations/:id/cancel: queued -> Cancelled with E_MIG_CANCELLED (202), then E_MIG_CONFLICT', async () => {
    const res = await cancel.handle(req('POST', '/x'), ctx, { id: jobId })
    expect(res.status).toBe(202)
    const job = await res.json()
    expect(job).toMatchObject({ state: 'Cancelled', status: 'cancelled', last_error: { code: 'E_MIG_CANCELLED', fatal: true } })
    expect(job.finished_at).not.toBeNull()
    expect((await ctx.store.events.since(0, 10, jobId)).map((e) => e.event)).toEqual(['migration', 'migration'])
    const again = await thrown(() => cancel.handle(req('POST', '/x'), ctx, { id: jobId }))
    expect(again.code).toBe('E_MIG_CONFLICT')
    expect(again.status).toBe(409)
    expect((await thrown(() => cancel.handle(req('POST', '/x'), ctx, { id: 'nope' }))).code).toBe('E_MIG_NOT_FOUND')
  })

  test('cancel of a running job flags it for its worker', async () => {
    const j = await ctx.store.jobs.create({
      id: crypto.randomUUID(),
      plan: offline('exports/web01.ova').plan as any,
      strategy: 'offline',
      effective_mode: 'Cold',
      now: new Date().toISOString(),
    })
    await ctx.store.jobs.update(j.id, { state: 'CopyingFull', started_at: new Date().toISOString() }, new Date().toISOString())
    const res = await (await cancel.handle(req('POST', '/x'), ctx, { id: j.id })).json()
    expect(res.state).toBe('CopyingFull')
    expect(await ctx.store.jobs.cancelRequested(j.id)).toBe(true)
  })
})
