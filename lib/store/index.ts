/**
 * The persistent store (spec 1.5 `migrator.db`): one SQLite database with a repository per table.
 */
import type { Kysely } from 'kysely'
import { AuditRepo } from './audit.ts'
import { BulkPlansRepo } from './bulk-plans.ts'
import { openDatabase } from './db.ts'
import { setStoreFile } from './persist.ts'
import { EventsRepo } from './events.ts'
import { JobFactsRepo } from './job-facts.ts'
import { JobsRepo } from './jobs.ts'
import type { Database } from './schema.ts'
import { RemoteCredentialsRepo } from './remote-credentials.ts'
import { SourcesRepo } from './sources.ts'
import { UploadsRepo } from './uploads.ts'
import { WatermarksRepo } from './watermarks.ts'

/** The opened store. `close()` waits for pending queries and closes the database. */
export interface Store {
  db: Kysely<Database>
  sources: SourcesRepo
  uploads: UploadsRepo
  jobs: JobsRepo
  /** Read-only per-job figures for the metrics (lib/metrics/). */
  jobFacts: JobFactsRepo
  events: EventsRepo
  watermarks: WatermarksRepo
  bulkPlans: BulkPlansRepo
  remoteCredentials: RemoteCredentialsRepo
  /** The audit log of state-changing requests. */
  audit: AuditRepo
  close(): Promise<void>
}

/**
 * Opens the store at `file` (see {@link openDatabase}) and makes its space reserve (lib/store/persist.ts);
 * throws `E_MIG_PERSIST_FAILED`.
 */
export async function openStore(file: string): Promise<Store> {
  const db = await openDatabase(file)
  setStoreFile(file)
  return {
    db,
    sources: new SourcesRepo(db),
    uploads: new UploadsRepo(db),
    jobs: new JobsRepo(db),
    jobFacts: new JobFactsRepo(db),
    events: new EventsRepo(db),
    watermarks: new WatermarksRepo(db),
    bulkPlans: new BulkPlansRepo(db),
    remoteCredentials: new RemoteCredentialsRepo(db),
    audit: new AuditRepo(db),
    close: () => db.destroy(),
  }
}
