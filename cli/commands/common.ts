/**
 * What every CLI command shares: global options, the API client built from them, and error
 * reporting (`E_MIG_*` code and message on stderr, exit status 1).
 */
import type { Command } from 'commander'
import * as path from 'node:path'
import { readToken, TOKEN_FILE } from '../../lib/auth/api-token.ts'
import { defaultDataDir, defaultSocket } from '../../runtime/config.ts'
import { Api } from '../api.ts'

/** The server's unix socket when `MIGRATOR_SOCKET` is unset (runtime/config.ts): `/run/<MIGRATOR_APPLIANCE>/api.sock`. */
export const DEFAULT_SOCKET = defaultSocket(process.env.MIGRATOR_APPLIANCE || 'migrator')

/**
 * Global options (flags, else environment: MIGRATOR_URL, MIGRATOR_SOCKET, MIGRATOR_USER,
 * MIGRATOR_PASSWORD). Without `url` the CLI talks to the unix socket `socket`.
 */
export interface Globals {
  url?: string
  socket: string
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

/**
 * The API token a TCP client sends: `MIGRATOR_TOKEN`, else the `api-token` file of the data
 * directory (`MIGRATOR_DATA_DIR`, else the server's default), readable by root only; undefined
 * when neither is there or readable.
 */
export function clientToken(env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (env.MIGRATOR_TOKEN) return env.MIGRATOR_TOKEN.trim()
  const dataDir = path.resolve(env.MIGRATOR_DATA_DIR || defaultDataDir(env.MIGRATOR_APPLIANCE || 'migrator'))
  try {
    return readToken(path.join(dataDir, TOKEN_FILE)) ?? undefined
  } catch {
    return undefined
  }
}

/** An API client for the server the global options name: `--url` over TCP (with {@link clientToken}), else the unix socket. */
export function apiOf(cmd: Command): Api {
  const g = globals(cmd)
  if (!g.url) return new Api({ baseUrl: `http://localhost${DEFAULT_BASE_PATH}`, socketPath: g.socket, user: g.user, password: g.password })
  return new Api({ baseUrl: apiBaseUrl(g.url), user: g.user, password: g.password, token: g.user ? undefined : clientToken() })
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
