/**
 * Who may use the API, by the way a request arrived (docs/security.md "Local users"):
 *
 * - `socket` (the unix socket): nothing more; the socket's owner, group and mode (root, 0660)
 *   decide who can connect at all.
 * - `tcp` (the `MIGRATOR_LISTEN` listener, loopback included): `Authorization: Bearer <token of
 *   <data dir>/api-token>`, the `MIGRATOR_BASIC_AUTH` credentials, or the console's session
 *   cookie. Anything else: 401 `E_MIG_AUTH_FAILED` before any handler runs.
 * - in-process (a host daemon calling `app.fetch(request)`): the daemon's own authentication;
 *   the `MIGRATOR_BASIC_AUTH` guard applies when it is set.
 *
 * `GET {base}/ui/login?ticket=` is answered here on every transport: a valid, unused ticket
 * sets the session cookie (`HttpOnly; SameSite=Strict; Path={base}`) and redirects (303) to the
 * console; anything else is 401.
 */
import { timingSafeEqual } from 'node:crypto'
import { mintSession, sameSecret, tokenWatcher, verifySession, verifyTicket } from '../lib/auth/api-token.ts'
import { MigError } from '../lib/errors.ts'
import type { Config } from './config.ts'

/** How a request reached the app: the unix socket, the TCP listener, or a direct call (undefined). */
export type Via = 'socket' | 'tcp' | undefined

/** Cookie names start with this; the rest is the port the console was opened on (cookies do not separate ports). */
export const SESSION_COOKIE = 'migrator_session'

/** The session cookie's name for a request to `url` (one per port, so consoles of servers on one host do not overwrite each other). */
export function sessionCookieName(url: URL): string {
  return `${SESSION_COOKIE}_${url.port || (url.protocol === 'https:' ? '443' : '80')}`
}

function checkBasic(expected: string, header: string | null): boolean {
  if (!header?.startsWith('Basic ')) return false
  const got = Buffer.from(Buffer.from(header.slice(6), 'base64').toString('utf8'))
  const want = Buffer.from(expected)
  return got.length === want.length && timingSafeEqual(got, want)
}

function cookies(header: string | null): Array<[string, string]> {
  if (!header) return []
  return header.split(';').flatMap((part) => {
    const i = part.indexOf('=')
    return i > 0 ? [[part.slice(0, i).trim(), part.slice(i + 1).trim()] as [string, string]] : []
  })
}

function refusal(message: string, challenge: string): Response {
  const body = new MigError('E_MIG_AUTH_FAILED', message, { status: 401 }).toBody()
  return new Response(JSON.stringify(body), {
    status: 401,
    headers: { 'content-type': 'application/json; charset=utf-8', 'www-authenticate': challenge, 'cache-control': 'no-store' },
  })
}

/** The authentication step of `createApp`: `check(request, via)` is null to go on, or the response to answer instead. */
export interface AuthStep {
  check(request: Request, via: Via): Response | null
}

/**
 * The step for `config`, reading the token from `tokenFile` (re-read when it changes). `now` is
 * the clock. Used login tickets are remembered until they expire, so each opens one session.
 */
export function createAuthStep(config: Config, tokenFile: string, now: () => Date): AuthStep {
  const tokens = tokenWatcher(tokenFile)
  const usedTickets = new Map<string, number>()
  const loginPath = `${config.basePath}/ui/login`
  const challenge = config.basicAuth !== null ? 'Basic realm="migrator"' : 'Bearer realm="migrator"'
  const how =
    config.basicAuth !== null
      ? 'send the Basic credentials of MIGRATOR_BASIC_AUTH or Authorization: Bearer <the api-token file of the data directory>'
      : 'send Authorization: Bearer <the api-token file of the data directory> (the CLI does when run as root), or open the console through its login link (migrator login-link)'

  function credentialed(request: Request, url: URL): boolean {
    const header = request.headers.get('authorization')
    if (config.basicAuth !== null && checkBasic(config.basicAuth, header)) return true
    const token = tokens.current()
    if (token === null) return false
    if (header?.startsWith('Bearer ') && sameSecret(header.slice(7).trim(), token)) return true
    const name = sessionCookieName(url)
    return cookies(request.headers.get('cookie')).some(([k, v]) => k === name && verifySession(token, v, now()))
  }

  function login(url: URL): Response {
    const ticket = url.searchParams.get('ticket') ?? ''
    const token = tokens.current()
    const t = now()
    for (const [nonce, expiry] of usedTickets) if (expiry * 1000 <= t.getTime()) usedTickets.delete(nonce)
    const signed = token === null ? null : verifyTicket(token, ticket, t)
    if (token === null || signed === null || usedTickets.has(signed.nonce)) {
      return refusal(
        'this login link is not valid: it was used already, has expired, or belongs to another server; print a new one with migrator login-link',
        challenge,
      )
    }
    usedTickets.set(signed.nonce, signed.expiry)
    const cookie = `${sessionCookieName(url)}=${mintSession(token, t)}; HttpOnly; SameSite=Strict; Path=${config.basePath || '/'}`
    return new Response(null, { status: 303, headers: { location: `${config.basePath}/ui/`, 'set-cookie': cookie, 'cache-control': 'no-store' } })
  }

  return {
    check(request, via) {
      const url = new URL(request.url)
      if (url.pathname === loginPath && (request.method === 'GET' || request.method === 'HEAD')) return login(url)
      if (via === 'socket') return null
      if (via === undefined && config.basicAuth === null) return null
      if (credentialed(request, url)) return null
      // with Basic configured the message stays the one Basic clients (and their prompts) know
      return config.basicAuth !== null ? refusal('authentication required', challenge) : refusal(`authentication required: ${how}`, challenge)
    },
  }
}
