/**
 * What every CLI command shares: global options, the API client built from them, and error
 * reporting (`E_MIG_*` code and message on stderr, exit status 1).
 */
import type { Command } from 'commander'
import { Api } from '../api.ts'

/** Global options (flags, else environment: MIGRATOR_URL, MIGRATOR_USER, MIGRATOR_PASSWORD). */
export interface Globals {
  url: string
  user?: string
  password?: string
  json: boolean
}

/** The global options of the program `cmd` belongs to. */
export function globals(cmd: Command): Globals {
  return cmd.optsWithGlobals() as Globals
}

/** The API's default mount point (MIGRATOR_BASE_PATH's default). */
export const DEFAULT_BASE_PATH = '/api/v1/migrator'

/**
 * The API base URL of `--url`: a URL with no path (`http://host:port`, `http://host:port/`)
 * gets the default base path; one with a path is used as given. Throws on a URL that is not
 * http(s).
 */
export function apiBaseUrl(url: string): string {
  let u: URL
  try {
    u = new URL(url)
  } catch {
    throw new Error(`--url ${JSON.stringify(url)} is not a URL (example: http://127.0.0.1:8080)`)
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new Error(`--url ${JSON.stringify(url)}: only http and https are supported`)
  if (u.pathname === '/' || u.pathname === '') u.pathname = DEFAULT_BASE_PATH
  return u.toString().replace(/\/+$/, '')
}

/** An API client for the server the global options name. */
export function apiOf(cmd: Command): Api {
  const g = globals(cmd)
  return new Api({ baseUrl: apiBaseUrl(g.url), user: g.user, password: g.password })
}

/**
 * Runs an action; an error prints `E_MIG_<CODE>: message` (an API error or a `MigError` of the
 * backup client) or `error: message` on stderr and exits 1.
 */
export async function run(fn: () => Promise<void>): Promise<void> {
  try {
    await fn()
  } catch (e) {
    const c = (e as { code?: unknown })?.code
    const code = typeof c === 'string' && c.startsWith('E_MIG_') ? `${c}: ` : 'error: '
    process.stderr.write(`${code}${(e as Error)?.message ?? String(e)}\n`)
    process.exit(1)
  }
}
