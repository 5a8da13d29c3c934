/**
 * The test servers' credentials. A server started by `startServer` reads its API token from its
 * own data directory and registers it here under its origin (unless it was started with Basic
 * credentials, whose tests send those themselves). Then:
 *
 * - `fetch` (wrapped by test/helpers/preload.ts) adds `Authorization: Bearer <token>` to requests
 *   to a registered origin that carry no `Authorization` of their own; {@link rawFetch} is the
 *   unwrapped fetch, for requests that must go without a credential;
 * - `runCli` passes `MIGRATOR_TOKEN` to a CLI run whose `--url` names a registered origin;
 * - the console tests' browser gets a session cookie for each registered server
 *   ({@link sessionCookies}), as the login link would set.
 */
import { mintSession } from '../../lib/auth/api-token.ts'
import { sessionCookieName } from '../../runtime/auth.ts'

/** The fetch of the runtime, before the preload wrapped it. */
export const rawFetch: typeof fetch = globalThis.fetch

const tokens = new Map<string, string>()

/** Registers the token of the server at `origin` (`http://127.0.0.1:PORT`). */
export function registerServer(origin: string, token: string): void {
  tokens.set(new URL(origin).origin, token)
}

/** Forgets the server at `origin` (its requests go as written). */
export function unregisterServer(origin: string): void {
  tokens.delete(new URL(origin).origin)
}

/** The registered token of the server at `url`'s origin, or null. */
export function tokenFor(url: string | URL): string | null {
  try {
    return tokens.get(new URL(url).origin) ?? null
  } catch {
    return null
  }
}

function urlOf(input: string | URL | Request): string {
  return typeof input === 'string' ? input : input instanceof URL ? input.href : input.url
}

/** `fetch` that adds the registered token to requests for a registered test server (see the module comment). */
export const authFetch = Object.assign(
  (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const token = tokenFor(urlOf(input))
    if (token === null) return rawFetch(input, init)
    const headers = new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined))
    if (headers.has('authorization')) return rawFetch(input, init)
    headers.set('authorization', `Bearer ${token}`)
    return rawFetch(input, { ...init, headers })
  },
  { preconnect: rawFetch.preconnect },
) as typeof fetch

/** Makes `globalThis.fetch` the {@link authFetch} (once; the preload and `startServer`'s module call it, so benches run outside `bun test` get it too). */
export function installAuthFetch(): void {
  if (globalThis.fetch !== authFetch) globalThis.fetch = authFetch
}

/** Session cookies (Playwright's `addCookies` shape) for every registered server, valid as the login link's. */
export function sessionCookies(): Array<{ name: string; value: string; domain: string; path: string; httpOnly: boolean; sameSite: 'Strict' }> {
  return [...tokens].map(([origin, token]) => {
    const u = new URL(origin)
    return { name: sessionCookieName(u), value: mintSession(token), domain: u.hostname, path: '/api/v1/migrator', httpOnly: true, sameSite: 'Strict' as const }
  })
}
