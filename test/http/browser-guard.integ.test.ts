/**
 * The request guard against a real server under each runtime (Bun, Node 20), driven as a hostile
 * browser would drive it but without one: every state-changing route of the router (enumerated
 * from `HANDLERS`, so a new route cannot escape) sent with the "simple" content types a page
 * may post cross-site, with a foreign `Origin`, `Origin: null`, a cross-site `Sec-Fetch-Site`
 * or a rebound `Host`; every GET route with a foreign `Host`. Each is refused with the guard's
 * status, the API's listing does not change, and the server never connects to the source's
 * endpoint. Every request carries the operator's valid Basic credentials: cached credentials
 * do not help. Then what must keep working: loopback names, the allowed host and origin, the
 * migrator's own origin, JSON without Origin (curl, the CLI).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { HANDLERS } from '../../runtime/handlers.ts'
import { CONSOLE_CSP } from '../../runtime/security-headers.ts'
import { RUNTIMES } from '../helpers/server.ts'
import { offlinePlan } from '../helpers/jobs.ts'
import { send, sourceBody, startVictim, VICTIM_PREFIX, type Victim } from '../helpers/victim.ts'

const ALLOWED_ORIGIN = 'https://console.example:8443'
const ALLOWED_HOST = 'migrator.example'
const BOUNDARY = 'i46boundary'

/** A multipart body with a `file` part: what a cross-site `<form enctype="multipart/form-data">` posts. */
const MULTIPART = `--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="evil.img"\r\nContent-Type: application/octet-stream\r\n\r\n${'A'.repeat(512)}\r\n--${BOUNDARY}--\r\n`

const STATE_CHANGING = HANDLERS.filter((m) => m.method !== 'GET')
const READS = HANDLERS.filter((m) => m.method === 'GET')

for (const runtime of RUNTIMES) {
  describe(`browser guard under ${runtime}`, () => {
    let v: Victim
    let before = ''
    const port = () => new URL(v.base).port
    /** After refused requests: 1.5 s on, the victim's state is as before the suite and it connected nowhere. */
    const expectNothingChanged = async () => {
      await new Promise((r) => setTimeout(r, 1500))
      expect(await v.snapshot()).toBe(before)
      expect(v.outbound()).toBe(0)
    }

    /** `path` of a handler with its parameters filled with the victim's ids. */
    function concrete(p: string): string {
      const id = p.startsWith('/sources')
        ? v.ids.source
        : p.startsWith('/uploads')
          ? v.ids.upload
          : p.startsWith('/plans')
            ? v.ids.plan
            : p === '/migrations/:id/cancel'
              ? v.ids.queued
              : v.ids.running
      return p.replace(':id', id).replace(':vm_id', 'vm-1').replace('*', 'index.html')
    }

    /** A body the route would accept from a legitimate client, so a refusal is the guard's and not the handler's. */
    function validBody(method: string, p: string): { type: string; body: string } {
      if (method === 'POST' && p === '/uploads') return { type: `multipart/form-data; boundary=${BOUNDARY}`, body: MULTIPART }
      const bodies: Record<string, unknown> = {
        'POST /sources': sourceBody(`${VICTIM_PREFIX}evil`, 1),
        'POST /migrations': { plan: offlinePlan('qcow2', 'big/big.qcow2', { name: `${VICTIM_PREFIX}evil`, start: false }) },
        'POST /plans': { vms: [{ key: 'e', plan: offlinePlan('qcow2', 'big/big.qcow2', { name: `${VICTIM_PREFIX}evil-bulk`, start: false }) }] },
        'POST /host-files/inspect': { path: 'big/big.qcow2' },
      }
      return { type: 'application/json', body: JSON.stringify(bodies[`${method} ${p}`] ?? {}) }
    }

    beforeAll(async () => {
      v = await startVictim(runtime, { MIGRATOR_ALLOWED_ORIGINS: `${ALLOWED_ORIGIN}, http://other.example`, MIGRATOR_ALLOWED_HOSTS: ALLOWED_HOST })
      before = await v.snapshot()
    }, 180_000)
    afterAll(async () => {
      await v?.close()
    }, 60_000)

    test('the router has the routes this suite enumerates (state-changing and GET)', () => {
      expect(STATE_CHANGING.length).toBeGreaterThanOrEqual(12)
      expect(READS.length).toBeGreaterThanOrEqual(14)
      expect(before).toContain(v.ids.running)
    })

    test('every state-changing route refuses text/plain, form and bodies without Content-Type: 415, nothing changes', async () => {
      let refused = 0
      for (const m of STATE_CHANGING) {
        const p = concrete(m.path)
        const json = validBody(m.method, m.path).body
        const attempts: Array<[string, Record<string, string>, string]> = [
          ['text/plain', { 'content-type': 'text/plain;charset=UTF-8' }, json],
          ['urlencoded', { 'content-type': 'application/x-www-form-urlencoded' }, 'name=x&kind=vim_api&endpoint=https%3A%2F%2F127.0.0.1%3A1'],
          ['no type', {}, json],
        ]
        if (m.accepts !== 'multipart/form-data') attempts.push(['multipart', { 'content-type': `multipart/form-data; boundary=${BOUNDARY}` }, MULTIPART])
        for (const [what, headers, body] of attempts) {
          const r = await send(v.base, m.method, p, { ...v.auth, ...headers }, body)
          expect([m.method, m.path, what, r.status, r.body?.error?.code]).toEqual([m.method, m.path, what, 415, 'E_MIG_BAD_REQUEST'])
          expect(r.body.error.message).toContain(m.accepts ?? 'application/json')
          refused++
        }
      }
      expect(refused).toBeGreaterThanOrEqual(STATE_CHANGING.length * 3)
      await expectNothingChanged()
    }, 60_000)

    test('every state-changing route refuses a foreign Origin, Origin: null, a cross-site Sec-Fetch-Site and a rebound Host, even with credentials and the right content type', async () => {
      for (const m of STATE_CHANGING) {
        const p = concrete(m.path)
        const { type, body } = validBody(m.method, m.path)
        const attempts: Array<[Record<string, string>, number]> = [
          [{ origin: 'http://evil.example' }, 403],
          [{ origin: `http://127.0.0.1:${Number(port()) + 1}` }, 403], // another local server: same site, other origin
          [{ origin: `https://127.0.0.1:${port()}.evil.example` }, 403],
          [{ origin: 'null' }, 403],
          [{ 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'no-cors' }, 403],
          [{ 'sec-fetch-site': 'same-site', 'sec-fetch-mode': 'navigate', 'sec-fetch-dest': 'iframe' }, 403],
          [{ host: `attacker.example:${port()}` }, 421],
          [{ host: `attacker.example:${port()}`, origin: `http://attacker.example:${port()}` }, 421],
        ]
        for (const [headers, status] of attempts) {
          const r = await send(v.base, m.method, p, { ...v.auth, 'content-type': type, ...headers }, body)
          expect([m.method, m.path, headers, r.status, r.body?.error?.code]).toEqual([m.method, m.path, headers, status, 'E_MIG_BAD_REQUEST'])
        }
      }
      await expectNothingChanged()
    }, 60_000)

    test('every GET route (SSE stream and console included) refuses a rebound Host with 421, and cross-site subresource reads with 403', async () => {
      for (const m of READS) {
        const p = concrete(m.path)
        for (const host of [`attacker.example:${port()}`, 'attacker.example', '10.20.30.40', '[fd00::1]:8080', `127.0.0.1.evil.example:${port()}`]) {
          const r = await send(v.base, 'GET', p, { ...v.auth, host })
          expect([m.path, host, r.status, r.body?.error?.code]).toEqual([m.path, host, 421, 'E_MIG_BAD_REQUEST'])
          expect(r.body.error.message).toContain('MIGRATOR_ALLOWED_HOSTS')
        }
        const cors = await send(v.base, 'GET', p, { ...v.auth, origin: 'http://evil.example', 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'cors' })
        expect([m.path, cors.status]).toEqual([m.path, 403])
        const img = await send(v.base, 'GET', p, { ...v.auth, 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'no-cors', 'sec-fetch-dest': 'image' })
        expect([m.path, img.status]).toEqual([m.path, 403])
      }
      // GET /sources/:id/vms would connect to the source: it never did
      expect(v.outbound()).toBe(0)
    }, 60_000)

    test('what keeps working: loopback names, the allowed host and origins, the own origin, JSON without Origin, a link from elsewhere to the console', async () => {
      for (const host of [
        `localhost:${port()}`,
        `127.0.0.1:${port()}`,
        '127.1.2.3',
        `[::1]:${port()}`,
        `${ALLOWED_HOST}:${port()}`,
        ALLOWED_HOST.toUpperCase(),
      ]) {
        const r = await send(v.base, 'GET', '/sources', { ...v.auth, host })
        expect([host, r.status]).toEqual([host, 200])
      }
      const created: string[] = []
      const cases: Array<Record<string, string>> = [
        {}, // curl -H 'Content-Type: application/json', the CLI
        { origin: `http://127.0.0.1:${port()}`, 'sec-fetch-site': 'same-origin' }, // the console
        { host: `localhost:${port()}`, origin: `http://localhost:${port()}` }, // the console through ssh -L
        { host: `${ALLOWED_HOST}:${port()}`, origin: `http://${ALLOWED_HOST}:${port()}` },
        { origin: ALLOWED_ORIGIN, 'sec-fetch-site': 'cross-site' }, // MIGRATOR_ALLOWED_ORIGINS
        { origin: 'http://other.example' },
        { 'sec-fetch-site': 'none' }, // typed in the address bar
      ]
      for (const [i, headers] of cases.entries()) {
        const r = await send(
          v.base,
          'POST',
          '/sources',
          { ...v.auth, 'content-type': 'application/json; charset=utf-8', ...headers },
          JSON.stringify(sourceBody(`${VICTIM_PREFIX}ok-${i}`, 1)),
        )
        expect([headers, r.status]).toEqual([headers, 201])
        created.push(r.body.id)
      }
      const nav = await send(v.base, 'GET', '/ui/', { ...v.auth, 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'navigate', 'sec-fetch-dest': 'document' })
      expect(nav.status).toBe(200)
      // a bodyless command without Content-Type (the CLI's cancel) is fine
      const cancel = await send(v.base, 'POST', `/migrations/${v.ids.planJob}/cancel`, { ...v.auth })
      expect(cancel.status).toBe(202)
      for (const id of created) expect((await send(v.base, 'DELETE', `/sources/${id}`, v.auth)).status).toBe(204)
      // the counter of outbound connections works: a legitimate test of the source reaches it
      const probe = await v.call('POST', `/sources/${v.ids.source}/test`)
      expect(probe.body.error.code).toBe('E_MIG_SOURCE_UNREACHABLE')
      expect(v.outbound()).toBeGreaterThan(0)
    }, 60_000)

    test('Basic auth still guards, after the browser checks: no credentials 401, a cross-site request 403 either way', async () => {
      const body = JSON.stringify(sourceBody(`${VICTIM_PREFIX}noauth`, 1))
      const none = await send(v.base, 'POST', '/sources', { 'content-type': 'application/json' }, body)
      expect([none.status, none.headers['www-authenticate']]).toEqual([401, 'Basic realm="migrator"'])
      const wrong = await send(v.base, 'GET', '/sources', { authorization: `Basic ${Buffer.from('operator:nope').toString('base64')}` })
      expect(wrong.status).toBe(401)
      const crossNoAuth = await send(v.base, 'POST', '/sources', { 'content-type': 'application/json', origin: 'http://evil.example' }, body)
      expect([crossNoAuth.status, crossNoAuth.headers['www-authenticate']]).toEqual([403, undefined])
      const rebound = await send(v.base, 'GET', '/sources', { host: 'attacker.example' })
      expect([rebound.status, rebound.headers['www-authenticate']]).toEqual([421, undefined])
    })

    test('browser headers: API answers (errors too) forbid framing and sniffing; the console has its strict CSP', async () => {
      for (const r of [await v.call('GET', '/sources'), await send(v.base, 'GET', '/sources', { host: 'attacker.example' }), await v.call('GET', '/nope')]) {
        expect(r.headers['content-security-policy']).toBe("default-src 'none'; frame-ancestors 'none'")
        expect([r.headers['x-frame-options'], r.headers['x-content-type-options'], r.headers['referrer-policy']]).toEqual(['DENY', 'nosniff', 'no-referrer'])
      }
      const ui = await send(v.base, 'GET', '/ui/', v.auth)
      expect(ui.status).toBe(200)
      expect(ui.headers['content-security-policy']).toBe(CONSOLE_CSP)
      expect(CONSOLE_CSP).toContain("frame-ancestors 'none'")
      expect(CONSOLE_CSP).toContain("script-src 'self' 'wasm-unsafe-eval';")
      expect(CONSOLE_CSP).not.toContain('unsafe-inline')
      expect(CONSOLE_CSP).not.toContain("'unsafe-eval'")
      expect([ui.headers['x-frame-options'], ui.headers['x-content-type-options'], ui.headers['referrer-policy']]).toEqual(['DENY', 'nosniff', 'no-referrer'])
    })
  })
}
