/**
 * `migrator doctor [--local]`: the host's pre-flight checks, from the server (`GET /doctor`), or
 * with `--local` run in this process on the configuration of the environment (for a server that
 * cannot start). Prints each check's status, id and finding, then the fixes; `--json` prints the
 * report. Exit status 1 when a check fails (or the server cannot be asked), 0 otherwise.
 */
import type { Command } from 'commander'
import type { DoctorReport } from '../../lib/host/doctor.ts'
import { apiOf, globals, run } from './common.ts'

/** Prints `report` for people: one line per check, then the fixes of those not ok. */
export function printReport(report: DoctorReport): void {
  const width = Math.max(...report.checks.map((c) => c.id.length))
  for (const c of report.checks) process.stdout.write(`${c.status.toUpperCase().padEnd(4)}  ${c.id.padEnd(width)}  ${c.found}\n`)
  const fixes = report.checks.filter((c) => c.fix)
  if (fixes.length) {
    process.stdout.write('\nfixes:\n')
    for (const c of fixes) process.stdout.write(`  ${c.id}: ${c.fix}\n`)
  }
  process.stdout.write(
    `\n${report.status === 'fail' ? 'FAIL: this host cannot run migrations as configured' : report.status === 'warn' ? 'WARN: migrations can run; see the warnings' : 'OK'}\n`,
  )
}

/** Registers `doctor`. */
export function register(program: Command): void {
  program
    .command('doctor')
    .description('pre-flight checks of this host (exit 1 when one fails)')
    .option('--local', 'run the checks here on the MIGRATOR_* environment instead of asking the server')
    .action((o: { local?: boolean }, cmd: Command) =>
      run(async () => {
        let report: DoctorReport
        if (o.local) {
          const { loadConfig } = await import('../../runtime/config.ts')
          const { doctorSettings } = await import('../../runtime/preflight.ts')
          const { runDoctor } = await import('../../lib/host/doctor.ts')
          report = await runDoctor(doctorSettings(loadConfig()))
        } else {
          report = await apiOf(cmd).call('GET', '/doctor')
        }
        if (globals(cmd).json) process.stdout.write(JSON.stringify(report, null, 2) + '\n')
        else printReport(report)
        if (report.status === 'fail') process.exitCode = 1
      }),
    )
}
