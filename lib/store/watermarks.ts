/**
 * Per-disk watermarks (spec 1.1 "Persistence of ... watermarks"): the byte offset up to which a
 * disk has been durably written (flushed) to the destination. A resumed job continues from it.
 */
import type { Kysely } from 'kysely'
import { persist } from './persist.ts'
import type { Database } from './schema.ts'

/** A disk's watermark and capacity, in bytes. */
export interface Watermark {
  disk_label: string
  watermark_bytes: number
  capacity_bytes: number
}

/** Watermarks table access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class WatermarksRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** Sets (upserts) the watermark of one disk of a job. */
  set(jobId: string, w: Watermark, now: string): Promise<void> {
    return persist('write watermark', async () => {
      await this.db
        .insertInto('watermarks')
        .values({ job_id: jobId, ...w, updated_at: now })
        .onConflict((oc) =>
          oc.columns(['job_id', 'disk_label']).doUpdateSet({ watermark_bytes: w.watermark_bytes, capacity_bytes: w.capacity_bytes, updated_at: now }),
        )
        .execute()
    })
  }

  /** All watermarks of a job. */
  list(jobId: string): Promise<Watermark[]> {
    return persist('read watermarks', () =>
      this.db.selectFrom('watermarks').select(['disk_label', 'watermark_bytes', 'capacity_bytes']).where('job_id', '=', jobId).execute(),
    )
  }

  /** Removes a job's watermarks (after cancel cleanup). */
  clear(jobId: string): Promise<void> {
    return persist('clear watermarks', async () => {
      await this.db.deleteFrom('watermarks').where('job_id', '=', jobId).execute()
    })
  }
}
