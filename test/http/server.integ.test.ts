/**
 * HTTP integration suite: the real server, started as a child process under each runtime
 * (Bun and Node 20), driven over HTTP on 127.0.0.1.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { chmodSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs'
import { connect } from 'node:net'
import * as path from 'node:path'
import { RUNTIMES, startServer, type RunningServer } from '../helpers/server.ts'
import { tokenFor } from '../helpers/test-auth.ts'
import { tempDir } from '../helpers/tmp.ts'

const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex')

async function call(base: string, method: string, p: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(base + p, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text === '' ? null : JSON.parse(text) }
}

/** Sends a multipart upload over a raw socket and drops the connection mid-body. */
function abortUpload(base: string): Promise<void> {
  const u = new URL(base + '/uploads')
  return new Promise((resolve) => {
    const s = connect(Number(u.port), u.hostname, () => {
      const b = 'bNdRy'
      // the server's token, as every client of a TCP listener sends it: the body is then received and dropped mid-way
      s.write(
        `POST ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nAuthorization: Bearer ${tokenFor(base)}\r\nContent-Type: multipart/form-data; boundary=${b}\r\nContent-Length: 10000000\r\n\r\n`,
      )
      s.write(`--${b}\r\nContent-Disposition: form-data; name="file"; filename="x.ova"\r\n\r\n`)
      s.write(Buffer.alloc(300_000, 3), () => setTimeout(() => (s.destroy(), resolve()), 200))
    })
    s.on('error', () => resolve())
  })
}

for (const runtime of RUNTIMES) {
  describe(`HTTP API under ${runtime}`, () => {
    const t = tempDir(`mig-http-${runtime}-`)
    let srv: RunningServer
    let base = ''
    beforeAll(async () => {
      mkdirSync(path.join(t.dir, 'imports', 'exports'), { recursive: true, mode: 0o750 })
      writeFileSync(path.join(t.dir, 'imports', 'exports', 'a.ova'), 'x')
      srv = await startServer(runtime, t.dir, { MIGRATOR_UPLOAD_CAP_BYTES: String(2 * 1024 * 1024), MIGRATOR_SSE_HEARTBEAT_SECONDS: '1' })
      base = srv.base
    })
    afterAll(async () => {
      await srv?.stop()
      t.cleanup()
    })

    test('sources: create 201, list, get, test 502, vms 502, delete 204, then 404', async () => {
      const c = await call(base, 'POST', '/sources', { name: 'vc', kind: 'vim_api', endpoint: 'https://127.0.0.1:1/sdk', username: 'u', password: 'p4ss' })
      expect(c.status).toBe(201)
      expect(JSON.stringify(c.body)).not.toContain('p4ss')
      const id = c.body.id
      expect((await call(base, 'GET', '/sources')).body.items.length).toBe(1)
      expect((await call(base, 'GET', `/sources/${id}`)).body.name).toBe('vc')
      for (const [m, p] of [
        ['POST', `/sources/${id}/test`],
        ['GET', `/sources/${id}/vms`],
        ['GET', `/sources/${id}/vms/vm-1`],
      ]) {
        const r = await call(base, m, p)
        expect([p, r.status, r.body.error.code]).toEqual([p, 502, 'E_MIG_SOURCE_UNREACHABLE'])
      }
      expect((await call(base, 'POST', '/sources', { name: 'vc' })).body.error.code).toBe('E_MIG_BAD_REQUEST')
      expect((await call(base, 'DELETE', `/sources/${id}`)).status).toBe(204)
      const gone = await call(base, 'GET', `/sources/${id}`)
      expect([gone.status, gone.body.error.code]).toEqual([404, 'E_MIG_NOT_FOUND'])
    })

    test('migrations: submit 201, the worker runs it and the SSE stream shows Queued then Failed; list, get; cancel of a finished job 409', async () => {
      const res = await fetch(`${base}/migrations/stream`)
      expect(res.status).toBe(200)
      expect(res.headers.get('content-type')).toContain('text/event-stream')
      const reader = res.body!.getReader()
      const c = await call(base, 'POST', '/migrations', {
        plan: { source: { Offline: 'ova_archive' }, source_ref: { kind: 'offline_host_path', path: 'exports/a.ova' }, mode: 'Cold' },
      })
      expect(c.status).toBe(201)
      expect(c.body.state).toBe('Queued')
      let text = ''
      const deadline = Date.now() + 60_000
      while (!text.includes('"state":"Failed"') && Date.now() < deadline) text += new TextDecoder().decode((await reader.read()).value)
      await reader.cancel()
      expect(text).toContain(`"id":"${c.body.id}"`)
      expect(text).toMatch(/id: \d+\nevent: migration\ndata: \{/)
      expect(text.indexOf('"state":"Queued"')).toBeLessThan(text.indexOf('"state":"Failed"'))
      expect((await call(base, 'GET', '/migrations')).body.items[0].id).toBe(c.body.id)
      const got = (await call(base, 'GET', `/migrations/${c.body.id}`)).body
      // A one-byte "OVA" is not a tar archive: the worker fails the job naming the file.
      expect([got.state, got.last_error.code, got.last_error.fatal]).toEqual(['Failed', 'E_MIG_MALFORMED_ARCHIVE', true])
      expect(got.last_error.message).toContain('a.ova')
      const x = await call(base, 'POST', `/migrations/${c.body.id}/cancel`)
      expect([x.status, x.body.error.code]).toEqual([409, 'E_MIG_CONFLICT'])
    })

    test('error mapping: 400 bad JSON, 400 invalid plan with field paths, 403 escape, 404 route', async () => {
      const bad = await call(base, 'POST', '/migrations', '{')
      expect([bad.status, bad.body.error.code]).toEqual([400, 'E_MIG_BAD_REQUEST'])
      const inv = await call(base, 'POST', '/migrations', { plan: { source: { Offline: 'ova_archive' }, mode: 'Cold' } })
      expect([inv.status, inv.body.error.code]).toEqual([400, 'E_MIG_INVALID_PLAN'])
      expect(inv.body.error.details.issues[0].path).toBe('plan.source_ref')
      const esc = await call(base, 'POST', '/migrations', {
        plan: { source: { Offline: 'ova_archive' }, source_ref: { kind: 'offline_host_path', path: '../../../etc/passwd' }, mode: 'Cold' },
      })
      expect([esc.status, esc.body.error.code]).toEqual([403, 'E_MIG_HOST_PATH_REJECTED'])
      const br = await call(base, 'GET', '/host-files?path=..%2F..%2Fetc')
      expect([br.status, br.body.error.code]).toEqual([403, 'E_MIG_HOST_PATH_REJECTED'])
      const nf = await call(base, 'GET', '/nothing-here')
      expect([nf.status, nf.body.error.code]).toEqual([404, 'E_MIG_NOT_FOUND'])
      const outside = await fetch(base.replace('/api/v1/migrator', '/other'))
      expect(outside.status).toBe(404)
    })

    test('uploads: multipart 201 with sha256; cap 413, mismatch 422 and client abort leave no file', async () => {
      const data = new Uint8Array(1024 * 1024).map((_, i) => i % 256)
      const fd = new FormData()
      fd.append('file', new Blob([data]), 'disk.img')
      const ok = await fetch(`${base}/uploads?sha256=${sha(data)}`, { method: 'POST', body: fd })
      expect(ok.status).toBe(201)
      const up = await ok.json()
      expect(up).toMatchObject({ size_bytes: data.length, sha256: sha(data), filename: 'disk.img', status: 'ready' })
      expect((await call(base, 'GET', `/uploads/${up.id}`)).body.id).toBe(up.id)
      expect((await call(base, 'GET', '/uploads')).body.items.map((u: any) => u.id)).toEqual([up.id])

      const big = new FormData()
      big.append('file', new Blob([new Uint8Array(3 * 1024 * 1024)]), 'big.img')
      const capped = await fetch(`${base}/uploads`, { method: 'POST', body: big })
      expect(capped.status).toBe(413)
      expect((await capped.json()).error.code).toBe('E_MIG_UPLOAD_REJECTED')
      const wrong = new FormData()
      wrong.append('sha256', '0'.repeat(64))
      wrong.append('file', new Blob([data]), 'disk.img')
      const mism = await fetch(`${base}/uploads`, { method: 'POST', body: wrong })
      expect(mism.status).toBe(422)
      await abortUpload(base)
      const uploadsDir = path.join(t.dir, 'imports', '.uploads')
      const deadline = Date.now() + 5000
      while (readdirSync(uploadsDir).length > 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50))
      expect(readdirSync(uploadsDir)).toEqual([up.id])
      expect((await call(base, 'GET', '/uploads')).body.items.length).toBe(1)

      expect((await call(base, 'DELETE', `/uploads/${up.id}`)).status).toBe(204)
      const gone = await call(base, 'GET', `/uploads/${up.id}`)
      expect([gone.status, gone.body.error.code]).toEqual([404, 'E_MIG_UPLOAD_NOT_FOUND'])
      expect(readdirSync(uploadsDir)).toEqual([])
    })

    test('host-files: browse the root', async () => {
      const r = await call(base, 'GET', '/host-files?path=')
      expect(r.status).toBe(200)
      expect(r.body.items.map((i: any) => i.name)).toEqual(['exports'])
    })

    test('SIGTERM: open SSE streams end, the server exits 0', async () => {
      const res = await fetch(`${base}/migrations/stream`)
      const reader = res.body!.getReader()
      await reader.read()
      const code = await srv.stop()
      expect(code).toBe(0)
      let done = false
      const deadline = Date.now() + 5000
      while (!done && Date.now() < deadline) done = (await reader.read().catch(() => ({ done: true }))).done
      expect(done).toBe(true)
    })
  })

  describe(`start-up refusals under ${runtime}`, () => {
    test('a key file readable by others stops the server with a clear message', async () => {
      const t = tempDir()
      mkdirSync(path.join(t.dir, 'keyring'), { recursive: true })
      writeFileSync(path.join(t.dir, 'keyring', 'migrator.key'), Buffer.alloc(32, 1))
      chmodSync(path.join(t.dir, 'keyring', 'migrator.key'), 0o644)
      const err = await startServer(runtime, t.dir).then(
        () => null,
        (e: Error) => e.message,
      )
      t.cleanup()
      expect(err).toContain('exited with 1')
      expect(err).toContain('must not be accessible by group or others')
    })
  })
}
