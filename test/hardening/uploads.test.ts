/**
 * Upload request guards: a second `file` part is refused (400) instead of silently dropped,
 * and a non-ASCII file name (UTF-8 in the part's Content-Disposition) is stored as sent.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { readdirSync } from 'node:fs'
import * as create from '../../handlers/uploads/create.ts'
import type { Ctx } from '../../runtime/context.ts'
import { testCtx, thrown } from '../helpers/env.ts'

let ctx: Ctx
let cleanup: () => Promise<void>
beforeAll(async () => ({ ctx, cleanup } = await testCtx()))
afterAll(() => cleanup())

/** A raw multipart body: `parts` as [field name, file name (raw header text), bytes]. */
function multipart(parts: Array<[string, string, string]>): Request {
  const b = 'i12BoUnDaRy'
  const body = Buffer.concat([
    ...parts.map(([name, filename, data]) =>
      Buffer.from(
        `--${b}\r\nContent-Disposition: form-data; name="${name}"; filename="${filename}"\r\nContent-Type: application/octet-stream\r\n\r\n${data}\r\n`,
        'utf8',
      ),
    ),
    Buffer.from(`--${b}--\r\n`),
  ])
  return new Request('http://127.0.0.1/api/v1/migrator/uploads', { method: 'POST', headers: { 'content-type': `multipart/form-data; boundary=${b}` }, body })
}

test('a second "file" part is 400 E_MIG_BAD_REQUEST and leaves nothing behind', async () => {
  const before = readdirSync(ctx.paths.uploads).length
  const e = await thrown(() =>
    create.handle(
      multipart([
        ['file', 'a.ova', 'first'],
        ['file', 'b.ova', 'second'],
      ]),
      ctx,
    ),
  )
  expect([e.code, e.status]).toEqual(['E_MIG_BAD_REQUEST', 400])
  expect(e.message).toContain('only one "file" part')
  expect(readdirSync(ctx.paths.uploads).length).toBe(before)
  expect((await ctx.store.uploads.list(new Date().toISOString())).length).toBe(0)
})

test('a non-ASCII file name is stored as sent (UTF-8)', async () => {
  const res = await create.handle(multipart([['file', 'Server-Übersicht-日本.ova', 'data']]), ctx)
  expect(res.status).toBe(201)
  expect(((await res.json()) as { filename: string }).filename).toBe('Server-Übersicht-日本.ova')
})
