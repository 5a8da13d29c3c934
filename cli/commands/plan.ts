/** `migrator plan submit <file.json>`: submits a plan file (`{"plan": {...}}` or the bare plan). */
import { readFileSync } from 'node:fs'
import type { Command } from 'commander'
import { show } from '../output.ts'
import { apiOf, run } from './common.ts'

/** Registers `plan submit`. */
export function register(program: Command): void {
  program
    .command('plan')
    .description('migration plans')
    .command('submit <file>')
    .description('submit a plan from a JSON file')
    .action((file: string, _o, cmd: Command) =>
      run(async () => {
        const body = JSON.parse(readFileSync(file, 'utf8'))
        show(await apiOf(cmd).call('POST', '/migrations', 'plan' in body ? body : { plan: body }))
      }),
    )
}
