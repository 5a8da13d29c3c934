/** `migrator plans submit|list|show|cutover`: bulk plans of many VMs (roadmap v0.5). */
import { readFileSync } from 'node:fs'
import type { Command } from 'commander'
import { show, table } from '../output.ts'
import { apiOf, globals, run } from './common.ts'

/** Registers `plans` and its subcommands. */
export function register(program: Command): void {
  const plans = program.command('plans').description('bulk plans: many VMs with dependencies, a per-source limit and one shared cutover')
  plans
    .command('submit <file>')
    .description('submit a bulk plan from a JSON file ({vms: [{key, plan, depends_on?}], max_per_source?, cutover?, ...})')
    .action((file: string, _o, cmd: Command) => run(async () => show(await apiOf(cmd).call('POST', '/plans', JSON.parse(readFileSync(file, 'utf8'))))))
  plans
    .command('list')
    .description('list bulk plans, newest first')
    .action((_o, cmd: Command) =>
      run(async () => {
        const { items } = await apiOf(cmd).call('GET', '/plans')
        table(globals(cmd).json, items, ['ID', 'NAME', 'STATE', 'VMS', 'CREATED'], (p) => [p.id, p.name, p.state, p.vms.length, p.created_at])
      }),
    )
  plans
    .command('show <id>')
    .description("a bulk plan's aggregate state and each VM's job")
    .action((id: string, _o, cmd: Command) =>
      run(async () => {
        const p = await apiOf(cmd).call('GET', `/plans/${encodeURIComponent(id)}`)
        if (globals(cmd).json) return show(p)
        process.stdout.write(`plan ${p.id}${p.name ? ` (${p.name})` : ''}: ${p.state}\n`)
        table(false, p.vms, ['KEY', 'JOB', 'STATE', 'DEPENDS ON', 'BLOCKED BY'], (v) => [
          v.key,
          v.job_id,
          v.state,
          v.depends_on.join(','),
          v.blocked_by.join(','),
        ])
      }),
    )
  plans
    .command('cutover <id>')
    .description("cut all the plan's warm VMs over now (the shared cutover)")
    .action((id: string, _o, cmd: Command) => run(async () => show(await apiOf(cmd).call('POST', `/plans/${encodeURIComponent(id)}/cutover`))))
}
