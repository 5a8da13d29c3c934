/**
 * The audit log on the real server under each runtime: state-changing requests (sources, remote
 * credentials, migrations, cancel, deletes; accepted and refused) are recorded with time, client
 * address, user agent, request id, route, kind, resource id and outcome; reads are not; `GET
 * /audit` pages with its cursor and filters by kind and time; the secrets sent never reach the
 * store's files (database and WAL) nor the audit answers; entries past
 * MIGRATOR_AUDIT_RETENTION_DAYS are pruned at start; `migrator audit` shows them.
 */
import { Database } from 'bun:sqlite'
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { runCli } from '../helpers/cli.ts'
import { call } from '../helpers/jobs.ts'
import { ensureNodeBuild, RUNTIMES, startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PASSWORD = 'Audit-Pw-63-q7Zx'
const TOKEN = 'Audit-Token-63-k2Wv'
const AGENT = 'audit-test/1.0'

for (const runtime of RUNTIMES) {
  describe(`audit log under ${runtime}`, () => {
    const t = tempDir(`mig-audit-${runtime}-`)
    const dbDir = path.join(t.dir, 'migrator.db')
    let srv: RunningServer
    let sourceId = ''
    const before = new Date(Date.now() - 1000).toISOString()
    const headers = (id: string) => ({ 'user-agent': AGENT, 'x-request-id': id })

    beforeAll(async () => {
      if (runtime === 'node') await ensureNodeBuild()
      srv = await startServer(runtime, t.dir)
      const s = await call(
        srv.base,
        'POST',
        '/sources',
        { name: 'vc-a63', kind: 'vim_api', endpoint: 'https://127.0.0.1:1/sdk', username: 'admin', password: PASSWORD },
        headers('req-source-1'),
      )
      expect(s.status).toBe(201)
      sourceId = s.body.id
      const c = await call(srv.base, 'POST', '/remote-credentials', { name: 'web-a63', kind: 'http_bearer', token: TOKEN }, headers('req-cred-1'))
      expect(c.status).toBe(201)
      expect((await call(srv.base, 'GET', '/sources', undefined, headers('req-read-1'))).status).toBe(200)
      const bad = await call(srv.base, 'POST', '/migrations', { plan: { mode: 'Cold' } }, headers('req-plan-bad'))
      expect(bad.body.error.code).toBe('E_MIG_INVALID_PLAN')
      const gone = await call(srv.base, 'POST', '/migrations/7d3f1c8e-0000-4000-8000-000000000063/cancel', undefined, headers('req-cancel-404'))
      expect(gone.status).toBe(404)
      expect((await call(srv.base, 'DELETE', `/sources/${sourceId}`, undefined, headers('req-source-del'))).status).toBe(204)
      // a request id that is not a plain token is replaced, never stored as sent
      expect((await call(srv.base, 'DELETE', `/remote-credentials/${c.body.id}`, undefined, headers('bad id; drop'))).status).toBe(204)
    }, 600_000)

    afterAll(async () => {
      await srv?.stop()
      t.cleanup()
    })

    test('each state-changing request is recorded with who, what and the outcome; reads are not', async () => {
      const r = await fetch(`${srv.base}/audit`)
      expect(r.headers.get('x-request-id')).toMatch(/^[0-9a-f-]{36}$/)
      const { items, next_cursor } = (await r.json()) as { items: any[]; next_cursor: number | null }
      expect(next_cursor).toBeNull()
      const loopback = runtime === 'bun' ? '127.0.0.1' : expect.stringMatching(/^(::ffff:)?127\.0\.0\.1$/)
      expect(items.map((e) => [e.request_id, e.method, e.route, e.kind, e.status, e.error_code])).toEqual([
        [expect.stringMatching(/^[0-9a-f-]{36}$/), 'DELETE', '/remote-credentials/:id', 'remote_credential.delete', 204, null],
        ['req-source-del', 'DELETE', '/sources/:id', 'source.delete', 204, null],
        ['req-cancel-404', 'POST', '/migrations/:id/cancel', 'migration.cancel', 404, 'E_MIG_NOT_FOUND'],
        ['req-plan-bad', 'POST', '/migrations', 'migration.create', 400, 'E_MIG_INVALID_PLAN'],
        ['req-cred-1', 'POST', '/remote-credentials', 'remote_credential.create', 201, null],
        ['req-source-1', 'POST', '/sources', 'source.create', 201, null],
      ])
      const created = items.find((e) => e.request_id === 'req-source-1')
      expect(created).toMatchObject({ client_address: loopback, user_agent: AGENT, resource_id: sourceId })
      expect(Date.parse(created.at)).toBeGreaterThanOrEqual(Date.parse(before))
      expect(items.find((e) => e.request_id === 'req-source-del').resource_id).toBe(sourceId)
      expect(items.find((e) => e.request_id === 'req-cancel-404').resource_id).toBe('7d3f1c8e-0000-4000-8000-000000000063')
    })

    test('paging by cursor, filters by kind and time, bad parameters refused naming them', async () => {
      const seen: string[] = []
      let cursor: number | null = null
      let pages = 0
      do {
        const page: { status: number; body: { items: any[]; next_cursor: number | null } } = await call(
          srv.base,
          'GET',
          `/audit?limit=4${cursor === null ? '' : `&cursor=${cursor}`}`,
        )
        expect(page.body.items.length).toBeLessThanOrEqual(4)
        seen.push(...page.body.items.map((e) => e.request_id))
        cursor = page.body.next_cursor
        pages++
      } while (cursor !== null)
      expect([pages, seen.length, new Set(seen).size]).toEqual([2, 6, 6])
      const sources = (await call(srv.base, 'GET', '/audit?kind=source')).body.items.map((e: any) => e.kind)
      expect(sources).toEqual(['source.delete', 'source.create'])
      expect((await call(srv.base, 'GET', '/audit?kind=migration.cancel')).body.items.map((e: any) => e.request_id)).toEqual(['req-cancel-404'])
      const future = new Date(Date.now() + 3600_000).toISOString()
      expect((await call(srv.base, 'GET', `/audit?since=${encodeURIComponent(future)}`)).body.items).toEqual([])
      expect((await call(srv.base, 'GET', `/audit?until=${encodeURIComponent(before)}`)).body.items).toEqual([])
      expect((await call(srv.base, 'GET', `/audit?since=${encodeURIComponent(before)}&until=${encodeURIComponent(future)}`)).body.items.length).toBe(6)
      const bad = await call(srv.base, 'GET', '/audit?limit=0')
      expect([bad.status, bad.body.error.code, bad.body.error.message]).toEqual([400, 'E_MIG_BAD_REQUEST', expect.stringContaining('parameter limit')])
      const badKind = await call(srv.base, 'GET', "/audit?kind=x'%20or%201=1")
      expect([badKind.status, badKind.body.error.details.parameter]).toEqual([400, 'kind'])
    })

    test("the source's password and the credential's token are in no file of the store nor in GET /audit", async () => {
      const answer = await (await fetch(`${srv.base}/audit?limit=1000`)).text()
      expect(answer).toContain('req-source-1')
      const files = readdirSync(dbDir)
      expect(files).toContain('migrator.sqlite')
      for (const secret of [PASSWORD, TOKEN]) {
        expect(answer).not.toContain(secret)
        for (const f of files) expect({ f, found: readFileSync(path.join(dbDir, f)).includes(Buffer.from(secret)) }).toEqual({ f, found: false })
      }
      // the file check can find what is there: the source's user name is stored in the clear
      expect(files.some((f) => readFileSync(path.join(dbDir, f)).includes(Buffer.from('vc-a63')))).toBe(true)
    })

    test('migrator audit lists the entries; entries past the retention are pruned at start', async () => {
      const cli = await runCli(['--url', srv.base, '--json', 'audit', '--kind', 'source'])
      expect(cli.code).toBe(0)
      expect(JSON.parse(cli.stdout).map((e: any) => e.request_id)).toEqual(['req-source-del', 'req-source-1'])
      const text = await runCli(['--url', srv.base, 'audit', '--limit', '2', '--all'])
      expect(text.stdout.split('\n').filter(Boolean).length).toBe(7)
      expect(text.stdout).toMatch(/^TIME +CLIENT +METHOD +ROUTE +KIND/)

      await srv.stop()
      const db = new Database(path.join(dbDir, 'migrator.sqlite'))
      db.run(
        "insert into audit_log (at, client_address, user_agent, request_id, method, route, kind, resource_id, status, error_code) values ('2020-01-01T00:00:00.000Z', '127.0.0.1', 'old', 'req-old', 'POST', '/sources', 'source.create', null, 201, null)",
      )
      db.close()
      srv = await startServer(runtime, t.dir, { MIGRATOR_AUDIT_RETENTION_DAYS: '30' })
      const deadline = Date.now() + 10_000
      let ids: string[] = []
      do {
        ids = (await call(srv.base, 'GET', '/audit')).body.items.map((e: any) => e.request_id)
        if (!ids.includes('req-old')) break
        await Bun.sleep(100)
      } while (Date.now() < deadline)
      expect(ids).not.toContain('req-old')
      expect(ids).toContain('req-source-1')
    }, 60_000)
  })
}
