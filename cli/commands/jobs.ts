/** `migrator jobs`, `migrator cancel <id>` and `migrator cutover <id>`: list migrations, request a cancellation or a warm job's cutover. */
import type { Command } from 'commander'
import { bytes, show, table } from '../output.ts'
import { apiOf, globals, run } from './common.ts'

/** Registers `jobs`, `cancel` and `cutover`. */
export function register(program: Command): void {
  program
    .command('jobs')
    .description('list migrations, newest first')
    .action((_o, cmd: Command) =>
      run(async () => {
        const { items } = await apiOf(cmd).call('GET', '/migrations')
        table(globals(cmd).json, items, ['ID', 'STATE', 'DONE', 'TOTAL', 'ERROR', 'CREATED'], (j) => [
          j.id,
          j.state,
          bytes(j.progress?.bytes_done),
          bytes(j.progress?.bytes_total),
          j.last_error?.code,
          j.created_at,
        ])
      }),
    )
  program
    .command('cancel <id>')
    .description('request cancellation of a migration')
    .option(
      '--live-guest <what>',
      'a live import whose guest runs: finish (default: the copy ends, the job completes, the guest keeps running) or destroy (the guest and its writes are removed)',
    )
    .action((id: string, o: { liveGuest?: string }, cmd: Command) =>
      run(async () =>
        show(
          await apiOf(cmd).call('POST', `/migrations/${encodeURIComponent(id)}/cancel`, o.liveGuest === undefined ? undefined : { live_guest: o.liveGuest }),
        ),
      ),
    )
  program
    .command('cutover <id>')
    .description('cut a warm migration over now (it waits in DeltaSyncing for the command or its time)')
    .action((id: string, _o, cmd: Command) => run(async () => show(await apiOf(cmd).call('POST', `/migrations/${encodeURIComponent(id)}/cutover`))))
}
