/**
 * The browser guard's configuration and the in-process mount: MIGRATOR_ALLOWED_HOSTS and
 * MIGRATOR_ALLOWED_ORIGINS parsed to the URL parser's canonical forms (malformed items refused
 * by name), the MIGRATOR_LISTEN address answered to, and a host daemon's own names given to
 * `createApp` (an in-process app over a temporary data dir, no job supervisor).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { createApp, type App } from '../../runtime/app.ts'
import { loadConfig } from '../../runtime/config.ts'
import { createRequestGuard, isLoopbackHostname } from '../../runtime/request-guard.ts'
import { errorOf, tempDir, testConfig } from '../helpers/env.ts'

const guardOf = (opts: Partial<Parameters<typeof createRequestGuard>[0]> = {}) =>
  createRequestGuard({ listenHost: '127.0.0.1', allowedHosts: [], allowedOrigins: [], ...opts })
const statusOf = (guard: (r: Request) => void, r: Request): number => {
  try {
    guard(r)
    return 0
  } catch (e) {
    return (e as { status: number }).status
  }
}

describe('MIGRATOR_ALLOWED_HOSTS / MIGRATOR_ALLOWED_ORIGINS', () => {
  test('parsed to canonical forms, blanks ignored, unset is empty', () => {
    const c = loadConfig({
      MIGRATOR_ALLOWED_HOSTS: ' Migrator.Example , 10.0.0.5,[FD00::5]:8443,, 0x7f.1',
      MIGRATOR_ALLOWED_ORIGINS: 'https://Console.Example:443/, http://10.0.0.5:8080',
    })
    expect(c.allowedHosts).toEqual(['migrator.example', '10.0.0.5', '[fd00::5]', '127.0.0.1'])
    expect(c.allowedOrigins).toEqual(['https://console.example', 'http://10.0.0.5:8080'])
    const d = loadConfig({})
    expect([d.allowedHosts, d.allowedOrigins]).toEqual([[], []])
  })

  test.each([
    ['MIGRATOR_ALLOWED_HOSTS', 'ok.example, http://evil.example/x'],
    ['MIGRATOR_ALLOWED_HOSTS', 'user@host.example'],
    ['MIGRATOR_ALLOWED_HOSTS', 'host.example/path'],
    ['MIGRATOR_ALLOWED_ORIGINS', 'console.example'],
    ['MIGRATOR_ALLOWED_ORIGINS', 'https://console.example/ui'],
    ['MIGRATOR_ALLOWED_ORIGINS', 'ftp://console.example'],
    ['MIGRATOR_ALLOWED_ORIGINS', 'null'],
  ])('%s=%s is refused, naming the item', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(`${name}=.*item`))
  })
})

describe('the request guard', () => {
  test('loopback names: localhost, 127.0.0.0/8 in any spelling the URL parser reads, [::1]; nothing else', () => {
    const g = guardOf()
    for (const host of ['localhost', 'LOCALHOST:9', '127.0.0.1:8080', '127.255.0.9', '2130706433', '0x7f.0.0.1', '[::1]:1'])
      expect([host, statusOf(g, new Request(`http://${host}/x`))]).toEqual([host, 0])
    for (const host of ['localhost.evil.example', '128.0.0.1', '[::2]', '[::ffff:7f00:1]', '0.0.0.0', 'evil.example'])
      expect([host, statusOf(g, new Request(`http://${host}/x`))]).toEqual([host, 421])
    expect(isLoopbackHostname('127.0.0.1.nip.io')).toBe(false)
  })

  test('the MIGRATOR_LISTEN address is answered to when it is a specific one, not a wildcard', () => {
    expect(statusOf(guardOf({ listenHost: '192.0.2.7' }), new Request('http://192.0.2.7:8080/x'))).toBe(0)
    expect(statusOf(guardOf({ listenHost: 'fd00::7' }), new Request('http://[fd00::7]:8080/x'))).toBe(0)
    expect(statusOf(guardOf({ listenHost: '0.0.0.0' }), new Request('http://0.0.0.0:8080/x'))).toBe(421)
    expect(statusOf(guardOf({ listenHost: '::' }), new Request('http://[::]:8080/x'))).toBe(421)
  })

  test("an Origin must be the request's own host (any scheme of http/https) or an allowed origin", () => {
    const g = guardOf({ allowedOrigins: ['https://ui.example'] })
    const post = (origin: string, url = 'http://127.0.0.1:8080/x') => statusOf(g, new Request(url, { method: 'POST', headers: { origin } }))
    expect(post('http://127.0.0.1:8080')).toBe(0)
    expect(post('https://127.0.0.1:8080')).toBe(0)
    expect(post('https://ui.example')).toBe(0)
    expect(post('https://ui.example:444')).toBe(403)
    expect(post('http://127.0.0.1:8081')).toBe(403)
    expect(post('http://localhost:8080')).toBe(403)
    expect(post('null')).toBe(403)
    expect(post('file://')).toBe(403)
    expect(post('not a url')).toBe(403)
  })

  test('a malformed name given by a host daemon is refused at start', () => {
    expect(() => guardOf({ allowedHosts: ['https://x.example/'] })).toThrow(/allowed host/)
    expect(() => guardOf({ allowedOrigins: ['x.example'] })).toThrow(/allowed origin/)
  })
})

describe('in-process mount: the host daemon passes its own names to createApp', () => {
  const t = tempDir('i46-mount-')
  let app: App
  afterAll(async () => {
    await app?.close()
    t.cleanup()
  })

  test("the daemon's host and origin are accepted, others refused; content type still enforced", async () => {
    app = await createApp(testConfig(t.dir), { runJobs: false, allowedHosts: ['daemon.example'], allowedOrigins: ['https://portal.example'] })
    const base = 'https://daemon.example/api/v1/migrator'
    expect((await app.fetch(new Request(`${base}/sources`))).status).toBe(200)
    expect((await errorOf(await app.fetch(new Request('https://other.example/api/v1/migrator/sources')))).status).toBe(421)
    const body = JSON.stringify({ name: 'vc', kind: 'vim_api', endpoint: 'https://127.0.0.1:1/sdk', username: 'u', password: 'p' })
    const post = (headers: Record<string, string>) => app.fetch(new Request(`${base}/sources`, { method: 'POST', headers, body }))
    expect((await post({ 'content-type': 'application/json', origin: 'https://daemon.example' })).status).toBe(201)
    expect((await errorOf(await post({ 'content-type': 'application/json', origin: 'https://evil.example' }))).status).toBe(403)
    const plain = await errorOf(await post({ 'content-type': 'text/plain', origin: 'https://portal.example' }))
    expect([plain.status, plain.code]).toEqual([415, 'E_MIG_BAD_REQUEST'])
    expect(plain.message).toContain("'Content-Type: application/json'")
    const fromPortal = await post({ 'content-type': 'Application/JSON; charset=utf-8', origin: 'https://portal.example' })
    expect((await errorOf(fromPortal)).code).toBe('E_MIG_CONFLICT') // passed the guard; the name is taken
  })
})
