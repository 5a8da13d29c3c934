/**
 * `migrator test-boot <id>`: boot a disposable clone of a migration's destination before its
 * cutover (docs/test-boot.md). Without `--wait` it prints the job as the server answers (test boot
 * `requested`); with `--wait` it follows the test boot to its end, prints one summary line (the
 * job with `--json`) and exits 0 when it passed, 1 when it failed, 2 when it was cancelled.
 */
import type { Command } from 'commander'
import { show } from '../output.ts'
import { apiOf, globals, run } from './common.ts'

/** Exit status of a test boot's final state: 0 `passed`, 2 `cancelled`, 1 `failed`. */
export function testBootExitCode(state: string): number {
  return state === 'passed' ? 0 : state === 'cancelled' ? 2 : 1
}

/** One line about a finished test boot record (the API's `test_boot`). */
export function testBootSummary(tb: any): string {
  const hw = tb.hardware ? `; hardware ${tb.hardware.disk_bus}, ${tb.hardware.firmware}` : ''
  const head = `test boot ${tb.state} in ${tb.seconds ?? '?'} s on ${tb.clone ?? 'no clone'} (domain ${tb.domain ?? '-'}, removed)`
  if (tb.state === 'passed') return `${head}: ${tb.verified ? 'boot verified' : 'boot NOT verified'}: ${tb.evidence}${hw}`
  return `${head}: ${tb.error ?? ''}${hw}`
}

/** Registers `test-boot`. */
export function register(program: Command): void {
  program
    .command('test-boot <id>')
    .description(
      'boot a disposable clone of the destination on no network while the source keeps running (warm job in DeltaSyncing, or Completed with start: false)',
    )
    .option('--wait', 'wait for the test boot to end; exit 0 passed, 1 failed, 2 cancelled')
    .action((id: string, o: { wait?: boolean }, cmd: Command) =>
      run(async () => {
        const api = apiOf(cmd)
        const p = `/migrations/${encodeURIComponent(id)}`
        const job = await api.call('POST', `${p}/test-boot`)
        if (!o.wait) return show(job)
        for (;;) {
          const j = await api.call('GET', p)
          const tb = j.test_boot
          if (tb && tb.state !== 'requested' && tb.state !== 'running') {
            if (globals(cmd).json) show(j)
            else process.stdout.write(`${testBootSummary(tb)}\n`)
            process.exit(testBootExitCode(tb.state))
          }
          await new Promise((r) => setTimeout(r, 1000))
        }
      }),
    )
}
