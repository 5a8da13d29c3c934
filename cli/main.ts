/**
 * `migrator`: the operator's command line (issue "Restore points and the operator CLI").
 * Talks to the server over HTTP: `--url` (MIGRATOR_URL, default
 * http://127.0.0.1:8080/api/v1/migrator), Basic credentials `--user`/`--password`
 * (MIGRATOR_USER/MIGRATOR_PASSWORD), `--json` for machine-readable output.
 */
import { Command } from 'commander'
import * as audit from './commands/audit.ts'
import * as backup from './commands/backup.ts'
import * as doctor from './commands/doctor.ts'
import * as imp from './commands/import.ts'
import * as jobs from './commands/jobs.ts'
import * as plan from './commands/plan.ts'
import * as plans from './commands/plans.ts'
import * as serve from './commands/serve.ts'
import * as sources from './commands/sources.ts'
import * as testBoot from './commands/test-boot.ts'
import * as uploads from './commands/uploads.ts'
import * as watch from './commands/watch.ts'

const program = new Command('migrator')
  .description('VM migrator: bring VMs from other hypervisors onto this KVM host')
  .option(
    '--url <url>',
    'migrator API base URL (http://host:port alone gets /api/v1/migrator)',
    process.env.MIGRATOR_URL ?? 'http://127.0.0.1:8080/api/v1/migrator',
  )
  .option('--user <user>', 'Basic-auth user', process.env.MIGRATOR_USER)
  .option('--password <password>', 'Basic-auth password', process.env.MIGRATOR_PASSWORD)
  .option('--json', 'machine-readable output', false)
for (const m of [serve, doctor, imp, plan, plans, jobs, testBoot, watch, sources, uploads, backup, audit]) m.register(program)
await program.parseAsync(process.argv)
