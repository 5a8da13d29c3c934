/**
 * `migrator backup run <job-id> [--wait]` and `migrator backup restore-points`: the host backup
 * API (spec 4 "Backup endpoints used by operators", 5.2) through `lib/backup/client.ts`.
 * Options (flags, else environment): `--backup-url` (MIGRATOR_BACKUP_URL, the host `{base_url}`),
 * `--backup-user`/`--backup-password` (MIGRATOR_BACKUP_USER/_PASSWORD, else the global
 * `--user`/`--password`: spec 5.2 uses the same Basic scheme), TLS `--backup-ca <pem-file>`
 * (MIGRATOR_BACKUP_CA_FILE), `--backup-fingerprint` (MIGRATOR_BACKUP_FINGERPRINT),
 * `--backup-insecure` (MIGRATOR_BACKUP_INSECURE=1). Errors print the client's `E_MIG_*` code.
 */
import { readFileSync } from 'node:fs'
import type { Command } from 'commander'
import { BackupClient } from '../../lib/backup/client.ts'
import { table } from '../output.ts'
import { globals, run } from './common.ts'

interface BackupOpts {
  backupUrl?: string
  backupUser?: string
  backupPassword?: string
  backupCa?: string
  backupFingerprint?: string
  backupInsecure?: boolean
}

function client(cmd: Command): BackupClient {
  const g = globals(cmd) as ReturnType<typeof globals> & BackupOpts
  if (!g.backupUrl) throw new Error('no backup API: give --backup-url or MIGRATOR_BACKUP_URL')
  let ca: string | undefined
  if (g.backupCa) {
    try {
      ca = readFileSync(g.backupCa, 'utf8')
    } catch (e) {
      throw new Error(`cannot read the CA file ${g.backupCa}: ${(e as Error).message}`)
    }
  }
  return new BackupClient({
    baseUrl: g.backupUrl,
    username: g.backupUser ?? g.user ?? '',
    password: g.backupPassword ?? g.password ?? '',
    tls: { ca_pem: ca, fingerprint256: g.backupFingerprint, insecure: g.backupInsecure === true },
  })
}

/** Registers `backup`. */
export function register(program: Command): void {
  const env = process.env
  const backup = program
    .command('backup')
    .description('host restore points (the host backup API)')
    .option('--backup-url <url>', 'host base URL (the API is under /api/v1)', env.MIGRATOR_BACKUP_URL)
    .option('--backup-user <user>', 'Basic-auth user of the backup API (default: --user)', env.MIGRATOR_BACKUP_USER)
    .option('--backup-password <password>', 'Basic-auth password of the backup API (default: --password)', env.MIGRATOR_BACKUP_PASSWORD)
    .option('--backup-ca <pem-file>', 'CA certificate to trust', env.MIGRATOR_BACKUP_CA_FILE)
    .option('--backup-fingerprint <sha256>', 'pinned SHA-256 certificate fingerprint', env.MIGRATOR_BACKUP_FINGERPRINT)
    .option('--backup-insecure', 'accept any certificate (self-signed endpoints)', env.MIGRATOR_BACKUP_INSECURE === '1')
  backup
    .command('run <job-id>')
    .description('run a backup job (a UUID); --wait for its restore point')
    .option('--wait', 'wait until the run registers its restore point')
    .option('--timeout <seconds>', 'how long --wait waits', '600')
    .action((jobId: string, o: { wait?: boolean; timeout: string }, cmd: Command) =>
      run(async () => {
        const timeout = Number(o.timeout)
        if (!Number.isFinite(timeout) || timeout <= 0) throw new Error(`--timeout must be a positive number of seconds, got ${JSON.stringify(o.timeout)}`)
        const c = client(cmd)
        try {
          const runId = await c.runJob(jobId)
          const point = o.wait ? await c.waitForRestorePoint(runId, { timeoutMs: timeout * 1000, pollMs: 500 }) : null
          process.stdout.write(
            globals(cmd).json
              ? JSON.stringify({ run_id: runId, restore_point: point }) + '\n'
              : `run ${runId}${point ? `, restore point ${point.id}${point.quiesced ? ' (quiesced)' : ''}` : ''}\n`,
          )
        } finally {
          await c.close()
        }
      }),
    )
  backup
    .command('restore-points')
    .description('list the registered restore points')
    .action((_o, cmd: Command) =>
      run(async () => {
        const c = client(cmd)
        try {
          table(globals(cmd).json, await c.listRestorePoints(), ['ID', 'RUN', 'JOB', 'QUIESCED', 'CREATED'], (p) => [
            p.id,
            p.run_id,
            p.job_id,
            p.quiesced ? 'yes' : 'no',
            p.created_at,
          ])
        } finally {
          await c.close()
        }
      }),
    )
}
