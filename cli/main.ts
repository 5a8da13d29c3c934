/**
 * `migrator`: the operator's command line. Talks to the server over its unix socket
 * (`--socket`, MIGRATOR_SOCKET, default /run/migrator/api.sock), or over TCP with `--url`
 * (MIGRATOR_URL) and the API token (MIGRATOR_TOKEN, or the data directory's api-token file when
 * run as root) or Basic credentials `--user`/`--password` (MIGRATOR_USER/MIGRATOR_PASSWORD);
 * `--json` for machine-readable output.
 */
import { Command } from 'commander'
import { DEFAULT_SOCKET } from './commands/common.ts'
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
import * as token from './commands/token.ts'
import * as uploads from './commands/uploads.ts'
import * as watch from './commands/watch.ts'

const program = new Command('migrator')
  .description('VM migrator: bring VMs from other hypervisors onto this KVM host')
  .option(
    '--url <url>',
    'migrator API base URL over TCP (http://host:port alone gets /api/v1/migrator); unset: the unix socket',
    process.env.MIGRATOR_URL || undefined,
  )
  .option('--socket <path>', "the server's unix socket (used when --url is not given)", process.env.MIGRATOR_SOCKET || DEFAULT_SOCKET)
  .option('--user <user>', 'Basic-auth user', process.env.MIGRATOR_USER)
  .option('--password <password>', 'Basic-auth password', process.env.MIGRATOR_PASSWORD)
  .option('--json', 'machine-readable output', false)
for (const m of [serve, doctor, token, imp, plan, plans, jobs, testBoot, watch, sources, uploads, backup, audit]) m.register(program)
await program.parseAsync(process.argv)
