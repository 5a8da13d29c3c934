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

/** An API client for the server the global options name. */
export function apiOf(cmd: Command): Api {
  const g = globals(cmd)
  return new Api({ baseUrl: g.url, user: g.user, password: g.password })
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
