/**
 * What `npm start` prints once it listens: how to reach the API and open the console, on the
 * socket (an `ssh -L` tunnel to it) and on the TCP listener (a one-time login link). Plain lines
 * on stdout for the operator, beside the JSON log.
 */
import { loginLink, mintTicket, readToken, TICKET_SECONDS } from '../lib/auth/api-token.ts'
import type { Config } from './config.ts'

/** The lines telling how to open the console; `tcpPort` is the bound port of the TCP listener. */
export function consoleInstructions(config: Config, tokenFile: string, tcpPort: number | null): string {
  const lines: string[] = []
  if (config.socket) {
    lines.push(
      `migrator: API on the unix socket ${config.socket.path} (owner root, group ${config.socket.group}, mode 0660): the CLI uses it as root`,
      `migrator: console from your machine: ssh -L 8080:${config.socket.path} root@<this host>, then open http://localhost:8080${config.basePath}/ui/`,
    )
  }
  if (config.listen && tcpPort !== null) {
    const host = config.listen.host.includes(':') ? `[${config.listen.host}]` : config.listen.host
    const shown = host === '0.0.0.0' || host === '[::]' ? '127.0.0.1' : host
    const base = `http://${shown}:${tcpPort}${config.basePath}`
    const token = readToken(tokenFile)
    lines.push(
      `migrator: API on ${base}: every request needs Authorization: Bearer <${tokenFile}>${config.basicAuth ? ' or the MIGRATOR_BASIC_AUTH credentials' : ''}`,
    )
    if (token !== null) {
      lines.push(
        `migrator: console: open ${loginLink(base, mintTicket(token))} (single use, valid ${TICKET_SECONDS / 60} minutes; a new one: migrator login-link --url ${base})`,
      )
    }
  }
  return `${lines.join('\n')}\n`
}
