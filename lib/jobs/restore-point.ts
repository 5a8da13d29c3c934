/**
 * Step: the restore point of plan `restore_point` (spec 4, 5.2), taken before anything is
 * written to the destination: the host backup API runs the plan's backup job and the step waits
 * for its restore point.
 */
import { readFileSync } from 'node:fs'
import { BackupClient } from '../backup/client.ts'
import type { RestorePointRecord } from '../job.ts'
import type { JobLogger, JobSettings } from './settings.ts'

/** The backup API client of the settings, or null when `MIGRATOR_BACKUP_URL` is unset. Throws when the CA file cannot be read. */
export function backupClientFromConfig(settings: Pick<JobSettings, 'backup'>): BackupClient | null {
  const b = settings.backup
  if (!b) return null
  return new BackupClient({
    baseUrl: b.baseUrl,
    username: b.username,
    password: b.password,
    tls: { ca_pem: b.caFile ? readFileSync(b.caFile, 'utf8') : undefined, fingerprint256: b.fingerprint256 ?? undefined, insecure: b.insecure },
  })
}

/** A job as the restore point step reads it: its plan's `restore_point`. */
export interface RestorePointJob {
  plan: { restore_point?: { backup_job_id: string; require_quiesced?: boolean } }
}

/**
 * The orchestrator's `takeRestorePoint`, or undefined when no backup API is configured (a plan
 * asking for a restore point then fails). It runs the backup job and waits up to
 * `backup.restorePointTimeoutSeconds` for its restore point; throws what lib/backup/client.ts
 * throws (`E_MIG_SNAPSHOT_FAILED`, `E_MIG_AUTH_FAILED`, `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_CANCELLED`
 * on `signal`).
 */
export function restorePointStep(
  settings: Pick<JobSettings, 'backup'>,
  logger: JobLogger,
): ((job: RestorePointJob, signal: AbortSignal) => Promise<RestorePointRecord>) | undefined {
  const backup = backupClientFromConfig(settings)
  if (!backup) return undefined
  const timeoutMs = settings.backup!.restorePointTimeoutSeconds * 1000
  return async (job, signal) => {
    const rp = job.plan.restore_point!
    logger.info({ backup_job_id: rp.backup_job_id }, 'running the backup job for the restore point')
    const runId = await backup.runJob(rp.backup_job_id)
    const point = await backup.waitForRestorePoint(runId, { timeoutMs, requireQuiesced: rp.require_quiesced, signal })
    return { backup_job_id: rp.backup_job_id, run_id: runId, restore_point_id: point.id, quiesced: point.quiesced, created_at: point.created_at }
  }
}
