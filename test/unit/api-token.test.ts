// The API token file, login tickets and sessions (lib/auth/api-token.ts), the auth step of the
// in-process app (runtime/auth.ts), and the listener variables (runtime/config.ts).
import { afterAll, describe, expect, test } from 'bun:test'
import { chmodSync, statSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import {
  loadOrCreateToken,
  mintSession,
  mintTicket,
  readToken,
  rotateToken,
  TokenFileError,
  tokenWatcher,
  verifySession,
  verifyTicket,
} from '../../lib/auth/api-token.ts'
import { createAuthStep } from '../../runtime/auth.ts'
import { loadConfig } from '../../runtime/config.ts'
import { tempDir, testConfig, thrown } from '../helpers/env.ts'

const t = tempDir('lu-token-')
afterAll(() => t.cleanup())

describe('the token file', () => {
  test('created once, 0600, 43 base64url characters; read back; rotation replaces it', () => {
    const file = path.join(t.dir, 'api-token')
    const a = loadOrCreateToken(file)
    expect(a).toMatch(/^[A-Za-z0-9_-]{43}$/)
    expect(statSync(file).mode & 0o777).toBe(0o600)
    expect(loadOrCreateToken(file)).toBe(a)
    const b = rotateToken(file)
    expect(b).not.toBe(a)
    expect(readToken(file)).toBe(b)
    expect(statSync(file).mode & 0o777).toBe(0o600)
  })

  test('refused when readable by others or not a token; missing is null', async () => {
    const file = path.join(t.dir, 'loose')
    writeFileSync(file, `${'a'.repeat(43)}\n`, { mode: 0o644 })
    chmodSync(file, 0o644)
    const e = await thrown(() => readToken(file))
    expect(e).toBeInstanceOf(TokenFileError)
    expect(e.message).toContain('chmod 600')
    writeFileSync(path.join(t.dir, 'short'), 'abc\n', { mode: 0o600 })
    expect((await thrown(() => readToken(path.join(t.dir, 'short')))).message).toContain('does not hold a token')
    expect(readToken(path.join(t.dir, 'none'))).toBeNull()
  })

  test('the watcher sees a rotation at once and a removal as no token', () => {
    const file = path.join(t.dir, 'watched')
    const w = tokenWatcher(file)
    expect(w.current()).toBeNull()
    const a = loadOrCreateToken(file)
    expect(w.current()).toBe(a)
    const b = rotateToken(file)
    expect(w.current()).toBe(b)
  })
})

describe('tickets and sessions', () => {
  const token = 'k'.repeat(43)
  const other = 'j'.repeat(43)
  const now = new Date('2026-12-07T12:00:00Z')

  test('valid with their token until they expire; never with another token or as the other kind', () => {
    const ticket = mintTicket(token, now)
    expect(verifyTicket(token, ticket, now)).not.toBeNull()
    expect(verifyTicket(token, ticket, new Date(now.getTime() + 599_000))).not.toBeNull()
    expect(verifyTicket(token, ticket, new Date(now.getTime() + 600_000))).toBeNull()
    expect(verifyTicket(other, ticket, now)).toBeNull()
    expect(verifySession(token, ticket, now)).toBe(false)
    const session = mintSession(token, now)
    expect(verifySession(token, session, now)).toBe(true)
    expect(verifySession(other, session, now)).toBe(false)
    expect(verifyTicket(token, session, now)).toBeNull()
    expect(verifySession(token, session, new Date(now.getTime() + 12 * 3600_000))).toBe(false)
  })

  test('a changed expiry, nonce or MAC is refused', () => {
    const [exp, nonce, mac] = mintTicket(token, now).split('.') as [string, string, string]
    expect(verifyTicket(token, `${Number(exp) + 3600}.${nonce}.${mac}`, now)).toBeNull()
    expect(verifyTicket(token, `${exp}.${nonce.replace(/^./, nonce[0] === 'A' ? 'B' : 'A')}.${mac}`, now)).toBeNull()
    expect(verifyTicket(token, `${exp}.${nonce}.${mac.replace(/^./, mac[0] === 'A' ? 'B' : 'A')}`, now)).toBeNull()
    expect(verifyTicket(token, '', now)).toBeNull()
  })
})

describe('the auth step', () => {
  const config = testConfig(t.dir, { MIGRATOR_LISTEN: '127.0.0.1:8080' })
  const file = path.join(t.dir, 'step-token')
  const token = loadOrCreateToken(file)
  const step = createAuthStep(config, file, () => new Date())
  const req = (headers: Record<string, string> = {}, p = '/migrations') => new Request(`http://127.0.0.1:8080/api/v1/migrator${p}`, { headers })

  test('tcp needs the token or a session; the socket and an in-process call without Basic need nothing', async () => {
    const refused = step.check(req(), 'tcp')!
    expect(refused.status).toBe(401)
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe('E_MIG_AUTH_FAILED')
    expect(step.check(req({ authorization: `Bearer ${token}` }), 'tcp')).toBeNull()
    expect(step.check(req({ authorization: `Bearer ${token}x` }), 'tcp')?.status).toBe(401)
    expect(step.check(req({ cookie: `migrator_session_8080=${mintSession(token)}` }), 'tcp')).toBeNull()
    expect(step.check(req({ cookie: `migrator_session_9090=${mintSession(token)}` }), 'tcp')?.status).toBe(401)
    expect(step.check(req(), 'socket')).toBeNull()
    expect(step.check(req(), undefined)).toBeNull()
  })

  test('the login link: 303 to the console with an HttpOnly SameSite=Strict cookie, once', () => {
    const ticket = mintTicket(token)
    const first = step.check(req({}, `/ui/login?ticket=${ticket}`), 'tcp')!
    expect(first.status).toBe(303)
    expect(first.headers.get('location')).toBe('/api/v1/migrator/ui/')
    expect(first.headers.get('set-cookie')).toMatch(/^migrator_session_8080=[\w.-]+; HttpOnly; SameSite=Strict; Path=\/api\/v1\/migrator$/)
    expect(step.check(req({}, `/ui/login?ticket=${ticket}`), 'tcp')!.status).toBe(401)
  })
})

describe('listener variables', () => {
  test('no TCP by default; the socket follows the appliance; none needs a TCP listener; a relative socket path is refused', () => {
    expect(loadConfig({}).listen).toBeNull()
    expect(loadConfig({ MIGRATOR_APPLIANCE: 'lab' }).socket).toEqual({ path: '/run/lab/api.sock', group: 'root' })
    expect(() => loadConfig({ MIGRATOR_SOCKET: 'none' })).toThrow('MIGRATOR_SOCKET=none needs a MIGRATOR_LISTEN')
    expect(loadConfig({ MIGRATOR_SOCKET: 'none', MIGRATOR_LISTEN: '127.0.0.1:9000' }).socket).toBeNull()
    expect(() => loadConfig({ MIGRATOR_SOCKET: 'run/api.sock' })).toThrow('MIGRATOR_SOCKET="run/api.sock" must be an absolute path')
    expect(() => loadConfig({ MIGRATOR_SOCKET_GROUP: 'a b' })).toThrow('MIGRATOR_SOCKET_GROUP="a b" must be a group name')
  })
})
