/**
 * The checks that keep a browser from being used against the migrator (docs/security.md): a
 * page on another site, or a name that DNS-rebinds to this host, must not be able to change
 * state through the operator's browser, whose requests reach the loopback listener (an
 * `ssh -L` tunnel) and carry its cached Basic credentials.
 *
 * - Host: only the names the server is reached by — loopback names and addresses (`localhost`,
 *   127.0.0.0/8, `[::1]`, any port), the `MIGRATOR_LISTEN` address when it is a specific one,
 *   `MIGRATOR_ALLOWED_HOSTS` and the names a host daemon mounting the app in-process adds.
 *   Anything else: 421 on every route.
 * - Origin: a request that carries `Origin` must come from the migrator's own origin (the
 *   `Host` it was sent to) or one of `MIGRATOR_ALLOWED_ORIGINS`; `Origin: null` (sandboxed
 *   frames, `file:`) is refused. Without `Origin`, a `Sec-Fetch-Site` other than `same-origin`
 *   or `none` is refused, except the browser's top-level navigation to a page (a link to the
 *   console from elsewhere). 403 on every route.
 *
 * Host and origin are read with the WHATWG URL parser only (`request.url`, which Bun and
 * @whatwg-node/server build from the `Host` header, and `new URL(origin)`).
 * The per-route content-type rule of state-changing requests lives in `runtime/router.ts`.
 */
import { isIPv4 } from 'node:net'
import { MigError } from '../lib/errors.ts'
import { canonicalHostname, canonicalOrigin } from './config.ts'

/** What the guard accepts besides loopback: extra host names and extra origins (canonical forms of config.ts). */
export interface RequestGuardOptions {
  /** The `MIGRATOR_LISTEN` host (unbracketed IPv6 allowed); a wildcard address (`0.0.0.0`, `::`) adds nothing. */
  listenHost: string
  /** Further host names (any port), e.g. `MIGRATOR_ALLOWED_HOSTS` and the host daemon's own. */
  allowedHosts: readonly string[]
  /** Further origins, e.g. `MIGRATOR_ALLOWED_ORIGINS` and the host daemon's own. */
  allowedOrigins: readonly string[]
}

/** True for a URL hostname (as `URL.hostname` writes it) that names this machine's loopback interface. */
export function isLoopbackHostname(hostname: string): boolean {
  return hostname === 'localhost' || hostname === '[::1]' || (isIPv4(hostname) && hostname.startsWith('127.'))
}

const WILDCARD = new Set(['0.0.0.0', '[::]'])

/**
 * The guard of `opts`: a function that throws `E_MIG_BAD_REQUEST` when a request must not be
 * served (status 421 for a `Host` this server does not answer to, 403 for a cross-site request)
 * and returns nothing otherwise. `createApp` runs it before authentication and routing, so a
 * refused request reaches no handler (and none of the outbound connections some handlers make).
 * Throws a plain Error naming an entry of `opts.allowedHosts` / `opts.allowedOrigins` that is
 * malformed.
 */
export function createRequestGuard(opts: RequestGuardOptions): (request: Request) => void {
  const hosts = new Set<string>()
  const listen = canonicalHostname(opts.listenHost.includes(':') ? `[${opts.listenHost}]` : opts.listenHost)
  if (listen !== null && !WILDCARD.has(listen)) hosts.add(listen)
  for (const h of opts.allowedHosts) {
    const c = canonicalHostname(h)
    if (c === null) throw new Error(`allowed host ${JSON.stringify(h)} is not a host name or address (name, a.b.c.d or [v6], no scheme or path)`)
    hosts.add(c)
  }
  const origins = new Set<string>()
  for (const o of opts.allowedOrigins) {
    const c = canonicalOrigin(o)
    if (c === null) throw new Error(`allowed origin ${JSON.stringify(o)} is not an origin http(s)://host[:port] without path`)
    origins.add(c)
  }

  return (request: Request) => {
    const url = new URL(request.url)
    if (!isLoopbackHostname(url.hostname) && !hosts.has(url.hostname)) {
      throw new MigError(
        'E_MIG_BAD_REQUEST',
        `this server does not answer to the host name ${JSON.stringify(url.hostname)}; reach it by localhost or 127.0.0.1 (e.g. through ssh -L), or add the name to MIGRATOR_ALLOWED_HOSTS`,
        { status: 421, details: { host: url.hostname } },
      )
    }
    const origin = request.headers.get('origin')
    if (origin !== null) {
      let parsed: URL | null = null
      try {
        parsed = new URL(origin)
      } catch {}
      const same = parsed !== null && (parsed.protocol === 'http:' || parsed.protocol === 'https:') && parsed.host === url.host
      if (!same && (parsed === null || !origins.has(parsed.origin))) {
        throw new MigError(
          'E_MIG_BAD_REQUEST',
          `cross-origin request refused: a page from ${JSON.stringify(origin)} may not call the migrator at ${url.origin}; use the migrator's own console or the CLI, or add that origin to MIGRATOR_ALLOWED_ORIGINS`,
          { status: 403, details: { origin } },
        )
      }
      return
    }
    const site = request.headers.get('sec-fetch-site')
    if (site === null || site === 'same-origin' || site === 'none') return
    const navigation =
      (request.method === 'GET' || request.method === 'HEAD') &&
      request.headers.get('sec-fetch-mode') === 'navigate' &&
      request.headers.get('sec-fetch-dest') === 'document'
    if (!navigation) {
      throw new MigError(
        'E_MIG_BAD_REQUEST',
        `cross-site request refused (Sec-Fetch-Site: ${site}): only the migrator's own console may call it from a browser: open it at ${url.origin} directly, or use the CLI`,
        { status: 403, details: { sec_fetch_site: site } },
      )
    }
  }
}
