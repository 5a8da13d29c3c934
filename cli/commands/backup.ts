/**
 * `migrator backup run <job-id>` and `migrator backup restore-points`: the host backup API
 * (spec 4), reached at `--backup-url` (MIGRATOR_BACKUP_URL) with the same Basic credentials.
 */
import { readFileSync } from 'node:fs'
import type { Command } from 'commander'
import { BackupClient } from '../../lib/backup/client.ts'
import { table } from '../output.ts'
import { globals, run } from './common.ts'

function client(cmd: Command): BackupClient {
  const g = globals(cmd) as ReturnType<typeof globals> & { backupUrl?: string; backupCa?: string; backupFingerprint?: string; backupInsecure?: boolean }
  if (!g.backupUrl) throw new Error('no backup API: give --backup-url or MIGRATOR_BACKUP_URL')
  return new BackupClient({
    baseUrl: g.backupUrl,
    username: g.user ?? '',
    password: g.password ?? '',
    tls: { ca_pem: g.backupCa ? readFileSync(g.backupCa, 'utf8') : undefined, fingerprint256: g.backupFingerprint, insecure: g.backupInsecure },
  })
}

/** Registers `backup`. */
export function register(program: Command): void {
  const backup = program
    .command('backup')
    .description('host restore points')
    .option('--backup-url <url>', 'host base URL (the API is under /api/v1)', process.env.MIGRATOR_BACKUP_URL)
    .option('--backup-ca <pem-file>', 'CA certificate to trust')
    .option('--backup-fingerprint <sha256>', 'pinned SHA-256 certificate fingerprint')
    .option('--backup-insecure', 'accept any certificate (self-signed endpoints)')
  backup
    .command('run <job-id>')
    .option('--wait', 'wait until the run registers its restore point')
    .action((jobId: string, o: { wait?: boolean }, cmd: Command) =>
      run(async () => {
        const c = client(cmd)
        try {
          const runId = await c.runJob(jobId)
          const point = o.wait ? await c.waitForRestorePoint(runId) : null
          process.stdout.write(globals(cmd).json ? JSON.stringify({ run_id: runId, restore_point: point }) + '\n' : `run ${runId}${point ? `, restore point ${point.id}${point.quiesced ? ' (quiesced)' : ''}` : ''}\n`)
        } finally {
          await c.close()
        }
      }),
    )
  backup.command('restore-points').action((_o, cmd: Command) =>
    run(async () => {
      const c = client(cmd)
      try {
        table(globals(cmd).json, await c.listRestorePoints(), ['ID', 'RUN', 'JOB', 'QUIESCED', 'CREATED'], (p) => [p.id, p.run_id, p.job_id, p.quiesced ? 'yes' : 'no', p.created_at])
      } finally {
        await c.close()
      }
    }),
  )
}
