/** `migrator sources add|list|test|vms`: registered live sources. */
import type { Command } from 'commander'
import { show, table } from '../output.ts'
import { apiOf, globals, run } from './common.ts'

/** Registers `sources`. */
export function register(program: Command): void {
  const sources = program.command('sources').description('registered live sources')
  sources
    .command('add <name> <kind> <endpoint>')
    .description('register a source (password from --password-env, default MIGRATOR_SOURCE_PASSWORD)')
    .requiredOption('--username <user>', 'login on the source')
    .option('--password-env <var>', 'environment variable holding the password', 'MIGRATOR_SOURCE_PASSWORD')
    .option('--insecure', 'accept any TLS certificate')
    .option('--thumbprint <sha256>', 'pinned SHA-256 certificate thumbprint')
    .action(
      (name: string, kind: string, endpoint: string, o: { username: string; passwordEnv: string; insecure?: boolean; thumbprint?: string }, cmd: Command) =>
        run(async () => {
          const password = process.env[o.passwordEnv] ?? ''
          const tls = { ...(o.insecure ? { insecure: true } : {}), ...(o.thumbprint ? { thumbprint: o.thumbprint } : {}) }
          show(await apiOf(cmd).call('POST', '/sources', { name, kind, endpoint, username: o.username, password, ...(Object.keys(tls).length ? { tls } : {}) }))
        }),
    )
  sources
    .command('list')
    .description('list registered sources')
    .action((_o, cmd: Command) =>
      run(async () => {
        const { items } = await apiOf(cmd).call('GET', '/sources')
        table(globals(cmd).json, items, ['ID', 'NAME', 'KIND', 'ENDPOINT', 'USER'], (s) => [s.id, s.name, s.kind, s.endpoint, s.username])
      }),
    )
  sources
    .command('test <id>')
    .description('check that the source answers and the credentials work')
    .action((id: string, _o, cmd: Command) => run(async () => show(await apiOf(cmd).call('POST', `/sources/${encodeURIComponent(id)}/test`))))
  sources
    .command('vms <id>')
    .description("list the source's VMs")
    .action((id: string, _o, cmd: Command) =>
      run(async () => {
        const { items } = await apiOf(cmd).call('GET', `/sources/${encodeURIComponent(id)}/vms`)
        table(globals(cmd).json, items, ['VM', 'NAME', 'POWER', 'GUEST'], (v) => [v.vm_id, v.name, v.power_state, v.guest_id])
      }),
    )
}
