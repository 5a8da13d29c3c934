/**
 * `migrator token rotate` and `migrator login-link`: the TCP listener's credential, handled on
 * the server host as root (the token file is 0600 under the data directory, lib/auth/api-token.ts).
 *
 * - `token rotate` writes a new token (atomic rename); the running server reads it on the next
 *   request: the old token, its login links and console sessions are refused from then on.
 * - `login-link [--url URL]` prints a one-time console login link (valid 10 minutes) for the
 *   server at `--url` (default: `MIGRATOR_LISTEN`).
 */
import type { Command } from 'commander'
import * as path from 'node:path'
import { loginLink, mintTicket, readToken, rotateToken, TOKEN_FILE } from '../../lib/auth/api-token.ts'
import { defaultDataDir } from '../../runtime/config.ts'
import { apiBaseUrl, clientToken, globals, run } from './common.ts'

/** The token file of the data directory the environment names (`MIGRATOR_DATA_DIR`, else the server's default). */
export function tokenFileOfEnv(env: NodeJS.ProcessEnv = process.env): string {
  return path.join(path.resolve(env.MIGRATOR_DATA_DIR || defaultDataDir(env.MIGRATOR_APPLIANCE || 'migrator')), TOKEN_FILE)
}

/** Registers `token rotate` and `login-link`. */
export function register(program: Command): void {
  const token = program.command('token').description("the TCP listener's API token (<data dir>/api-token)")
  token
    .command('rotate')
    .description('replace the API token; the old one, its login links and console sessions stop working at once')
    .action(() =>
      run(async () => {
        const file = tokenFileOfEnv()
        if (readToken(file) === null) throw new Error(`no API token at ${file} (set MIGRATOR_DATA_DIR to the server's data directory)`)
        rotateToken(file)
        process.stdout.write(`rotated the API token in ${file}\n`)
      }),
    )
  program
    .command('login-link')
    .description('print a one-time login link to the console on the TCP listener (valid 10 minutes)')
    .action((_o, cmd: Command) =>
      run(async () => {
        const g = globals(cmd)
        const listen = process.env.MIGRATOR_LISTEN
        const url = g.url ?? (listen ? `http://${listen}` : null)
        if (!url) throw new Error('give --url http://host:port of the TCP listener (or MIGRATOR_LISTEN)')
        const t = clientToken()
        if (!t) throw new Error(`cannot read the API token (${tokenFileOfEnv()}): run as root on the server host, or set MIGRATOR_TOKEN`)
        process.stdout.write(`${loginLink(apiBaseUrl(url), mintTicket(t))}\n`)
      }),
    )
}
