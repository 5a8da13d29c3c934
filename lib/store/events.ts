/**
 * Job events kept for SSE replay (DESIGN.md section 3): every `migration` and `progress` event
 * gets an increasing sequence number, which is the SSE `id:`. A bounded window is kept.
 */
import type { Kysely } from 'kysely'
import { persist } from './persist.ts'
import type { Database } from './schema.ts'

/** One stored event; `data` is the JSON payload as sent. */
export interface StoredEvent {
  seq: number
  job_id: string
  event: string
  data: string
}

/** Job events table access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class EventsRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** Appends an event; returns it with its sequence number. */
  append(jobId: string, event: string, data: unknown, now: string): Promise<StoredEvent> {
    const json = JSON.stringify(data)
    return persist('append job event', async () => {
      const r = await this.db.insertInto('job_events').values({ job_id: jobId, event, data: json, created_at: now }).returning('seq').executeTakeFirstOrThrow()
      return { seq: Number(r.seq), job_id: jobId, event, data: json }
    })
  }

  /** Events after `seq` (optionally of one job), oldest first, at most `limit`. */
  since(seq: number, limit: number, jobId?: string): Promise<StoredEvent[]> {
    return persist('replay job events', async () => {
      let q = this.db.selectFrom('job_events').select(['seq', 'job_id', 'event', 'data']).where('seq', '>', seq)
      if (jobId !== undefined) q = q.where('job_id', '=', jobId)
      return (await q.orderBy('seq').limit(limit).execute()).map((r) => ({ ...r, seq: Number(r.seq) }))
    })
  }

  /** Deletes all but the newest `keep` events. */
  prune(keep: number): Promise<void> {
    return persist('prune job events', async () => {
      const edge = await this.db.selectFrom('job_events').select('seq').orderBy('seq', 'desc').offset(keep).limit(1).executeTakeFirst()
      if (edge) await this.db.deleteFrom('job_events').where('seq', '<=', edge.seq).execute()
    })
  }
}
