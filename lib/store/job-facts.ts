/**
 * Read-only facts about every job, for the metrics exposition (lib/metrics/): one row per job with
 * the JSON fields the metrics count extracted by SQLite's `json_extract`, so a scrape reads
 * a few numbers per job instead of whole job documents.
 */
import { sql, type Kysely } from 'kysely'
import { persist } from './persist.ts'
import type { Database } from './schema.ts'

/**
 * What the metrics read of one job. Bytes are bytes, durations seconds, times ISO-8601 UTC.
 * - `source_kind`: the plan's adapter or importer kind (`vim_api`, `qcow2`, ...);
 * - `bytes_done` / `bytes_zero`: the job's progress (zero bytes are counted in `bytes_done`);
 * - `attempts`: worker starts of the job (the supervisor counts one per launch);
 * - `error_*`: the job's `last_error` (a fatal failure or a non-fatal notice), null when none;
 * - `delta_passes`: the warm job's delta passes so far (`cutover.passes_total`);
 * - `boot_verified` / `boot_seconds`: the boot check's verdict and wait, null when not started;
 * - `test_boot_state` / `test_boot_requested_at`: the job's latest test boot, null when none was asked for.
 */
export interface JobFacts {
  id: string
  state: string
  source_kind: string
  bytes_done: number
  bytes_zero: number
  rate_bytes_per_s: number
  attempts: number
  error_code: string | null
  error_fatal: boolean | null
  error_message: string | null
  delta_passes: number
  boot_verified: boolean | null
  boot_seconds: number | null
  test_boot_state: string | null
  test_boot_requested_at: string | null
  updated_at: string
}

/** Read access to the job facts. Throws `E_MIG_PERSIST_FAILED` on store failure. */
export class JobFactsRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** The facts of every job, oldest first. */
  list(): Promise<JobFacts[]> {
    return persist('read job facts', async () => {
      const { rows } = await sql<Record<string, unknown>>`
        select id, state, attempts, updated_at,
          coalesce(json_extract(plan, '$.source.Live'), json_extract(plan, '$.source.Offline'), 'unknown') as source_kind,
          coalesce(json_extract(progress, '$.bytes_done'), 0) as bytes_done,
          coalesce(json_extract(progress, '$.bytes_zero'), 0) as bytes_zero,
          coalesce(json_extract(progress, '$.rate_bytes_per_s'), 0) as rate_bytes_per_s,
          json_extract(last_error, '$.code') as error_code,
          json_extract(last_error, '$.fatal') as error_fatal,
          json_extract(last_error, '$.message') as error_message,
          coalesce(json_extract(cutover, '$.passes_total'), 0) as delta_passes,
          json_extract(hardware, '$.boot.verified') as boot_verified,
          json_extract(hardware, '$.boot.waited_seconds') as boot_seconds,
          json_extract(test_boot, '$.state') as test_boot_state,
          json_extract(test_boot, '$.requested_at') as test_boot_requested_at
        from jobs order by created_at, rowid`.execute(this.db)
      return rows.map((r) => ({
        id: String(r.id),
        state: String(r.state),
        source_kind: String(r.source_kind),
        bytes_done: Number(r.bytes_done),
        bytes_zero: Number(r.bytes_zero),
        rate_bytes_per_s: Number(r.rate_bytes_per_s),
        attempts: Number(r.attempts),
        error_code: r.error_code == null ? null : String(r.error_code),
        error_fatal: r.error_fatal == null ? null : Boolean(r.error_fatal),
        error_message: r.error_message == null ? null : String(r.error_message),
        delta_passes: Number(r.delta_passes),
        boot_verified: r.boot_verified == null ? null : Boolean(r.boot_verified),
        boot_seconds: r.boot_seconds == null ? null : Number(r.boot_seconds),
        test_boot_state: r.test_boot_state == null ? null : String(r.test_boot_state),
        test_boot_requested_at: r.test_boot_requested_at == null ? null : String(r.test_boot_requested_at),
        updated_at: String(r.updated_at),
      }))
    })
  }
}
