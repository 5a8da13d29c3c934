import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import * as path from 'node:path'
import * as create from '../../handlers/uploads/create.ts'
import * as list from '../../handlers/uploads/list.ts'
import * as get from '../../handlers/uploads/get.ts'
import * as del from '../../handlers/uploads/delete.ts'
import * as migrationsCreate from '../../handlers/migrations/create.ts'
import { sweepUploads } from '../../lib/uploads/sweep.ts'
import { req, testCtx, thrown } from '../helpers/env.ts'
import type { Ctx } from '../../runtime/context.ts'

let ctx: Ctx
let cleanup: () => Promise<void>
let clock = new Date('2026-11-22T12:00:00Z')
beforeAll(async () => ({ ctx, cleanup } = await testCtx({ MIGRATOR_UPLOAD_CAP_BYTES: String(1024 * 1024), MIGRATOR_UPLOAD_TTL_SECONDS: '3600' }, () => clock)))
afterAll(() => cleanup())

const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex')
const data = new Uint8Array(300_000).map((_, i) => (i * 7919) % 251)

function upload(bytes: Uint8Array, opts: { sha256Field?: string; query?: string; field?: string } = {}): Request {
  const fd = new FormData()
  if (opts.sha256Field) fd.append('sha256', opts.sha256Field)
  fd.append(opts.field ?? 'file', new Blob([bytes as Uint8Array<ArrayBuffer>]), 'disk.ova')
  return new Request(`http://127.0.0.1/api/v1/migrator/uploads${opts.query ?? ''}`, { method: 'POST', body: fd })
}

/** A multipart request whose body stream fails after `after` bytes of file data (a client abort). */
function abortingUpload(after: number): Request {
  const boundary = 'XbOuNdArY'
  const head = new TextEncoder().encode(
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.ova"\r\nContent-Type: application/octet-stream\r\n\r\n`,
  )
  let sent = 0
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      if (sent === 0) c.enqueue(head)
      if (sent >= after) {
        c.error(new Error('client went away'))
        return
      }
      sent += 65536
      c.enqueue(new Uint8Array(65536).fill(1))
    },
  })
  return new Request('http://127.0.0.1/api/v1/migrator/uploads', {
    method: 'POST',
    body,
    headers: { 'content-type': `multipart/form-data; boundary=${boundary}` },
    duplex: 'half',
  } as RequestInit)
}

const uploadFiles = () => readdirSync(ctx.paths.uploads)

describe('uploads handlers', () => {
  let id = ''
  test('POST /uploads: 201, streamed to .uploads/<id> with its sha256 (form field)', async () => {
    const res = await create.handle(upload(data, { sha256Field: sha(data) }), ctx)
    expect(res.status).toBe(201)
    const u = await res.json()
    id = u.id
    expect(u).toMatchObject({
      filename: 'disk.ova',
      size_bytes: data.length,
      sha256: sha(data),
      status: 'ready',
      created_at: clock.toISOString(),
      expires_at: new Date(clock.getTime() + 3600_000).toISOString(),
    })
    const file = path.join(ctx.paths.uploads, id)
    expect(readFileSync(file).equals(Buffer.from(data))).toBe(true)
    expect(statSync(file).mode & 0o777).toBe(0o640)
  })

  test('POST /uploads?sha256= (query) is checked too', async () => {
    const small = new Uint8Array([1, 2, 3])
    expect((await create.handle(upload(small, { query: `?sha256=${sha(small)}` }), ctx)).status).toBe(201)
  })

  test('sha256 mismatch: E_MIG_UPLOAD_REJECTED 422, no file, no record', async () => {
    const before = uploadFiles().length
    const e = await thrown(() => create.handle(upload(data, { sha256Field: 'a'.repeat(64) }), ctx))
    expect(e.code).toBe('E_MIG_UPLOAD_REJECTED')
    expect(e.status).toBe(422)
    expect(uploadFiles().length).toBe(before)
    expect((await (await list.handle(req('GET', '/uploads'), ctx)).json()).items.length).toBe(2)
  })

  test('cap breach while streaming: 413, no file', async () => {
    const before = uploadFiles().length
    const e = await thrown(() => create.handle(upload(new Uint8Array(1024 * 1024 + 1)), ctx))
    expect(e.code).toBe('E_MIG_UPLOAD_REJECTED')
    expect(e.status).toBe(413)
    expect(uploadFiles().length).toBe(before)
  })

  test('client abort mid-body: E_MIG_UPLOAD_REJECTED, no file', async () => {
    const before = uploadFiles().length
    const e = await thrown(() => create.handle(abortingUpload(256 * 1024), ctx))
    expect(e.code).toBe('E_MIG_UPLOAD_REJECTED')
    expect(uploadFiles().length).toBe(before)
  })

  test('malformed requests: E_MIG_BAD_REQUEST', async () => {
    expect((await thrown(() => create.handle(req('POST', '/uploads', { a: 1 }), ctx))).code).toBe('E_MIG_BAD_REQUEST')
    expect((await thrown(() => create.handle(upload(data, { field: 'other' }), ctx))).code).toBe('E_MIG_BAD_REQUEST')
    expect((await thrown(() => create.handle(upload(data, { sha256Field: 'xyz' }), ctx))).code).toBe('E_MIG_UPLOAD_REJECTED')
  })

  test('GET /uploads/:id, unknown id E_MIG_UPLOAD_NOT_FOUND', async () => {
    expect((await (await get.handle(req('GET', '/x'), ctx, { id })).json()).sha256).toBe(sha(data))
    const e = await thrown(() => get.handle(req('GET', '/x'), ctx, { id: crypto.randomUUID() }))
    expect(e.code).toBe('E_MIG_UPLOAD_NOT_FOUND')
    expect(e.status).toBe(404)
  })

  test('DELETE /uploads/:id: 409 while a queued job uses it, then 204 and the file is gone', async () => {
    const plan = { plan: { source: { Offline: 'ova_archive' }, source_ref: { kind: 'upload', upload_id: id }, mode: 'Cold' } }
    const job = await (await migrationsCreate.handle(req('POST', '/migrations', plan), ctx)).json()
    expect((await thrown(() => del.handle(req('DELETE', '/x'), ctx, { id }))).code).toBe('E_MIG_CONFLICT')
    await ctx.store.jobs.requestCancel(job.id, clock.toISOString())
    expect((await del.handle(req('DELETE', '/x'), ctx, { id })).status).toBe(204)
    expect(existsSync(path.join(ctx.paths.uploads, id))).toBe(false)
    expect((await thrown(() => del.handle(req('DELETE', '/x'), ctx, { id }))).code).toBe('E_MIG_UPLOAD_NOT_FOUND')
  })

  test('expiry: invisible after expires_at, removed by the sweeper', async () => {
    const u = await (await create.handle(upload(new Uint8Array([9, 9])), ctx)).json()
    clock = new Date(clock.getTime() + 3601_000)
    expect((await thrown(() => get.handle(req('GET', '/x'), ctx, { id: u.id }))).code).toBe('E_MIG_UPLOAD_NOT_FOUND')
    const removed = await sweepUploads(ctx.store, ctx.paths.uploads, clock)
    expect(removed).toContain(u.id)
    expect(existsSync(path.join(ctx.paths.uploads, u.id))).toBe(false)
    expect(uploadFiles()).toEqual([])
  })
})
