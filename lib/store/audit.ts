/**
 * Repository of the audit log (docs/operations.md "Audit log"): who asked the migrator to change
 * what, and what it answered. Rows hold request metadata only, never a request or response
 * body, so no password, key or token reaches them. Kept `MIGRATOR_AUDIT_RETENTION_DAYS` days.
 */
import { sql, type Insertable, type Kysely, type Selectable } from 'kysely'
import { persist } from './persist.ts'
import type { AuditLogTable, Database } from './schema.ts'

/** One audit entry as stored and listed (see `AuditLogTable` for the fields). */
export type AuditEntry = Selectable<AuditLogTable>

/** A new audit entry (without its `seq`). */
export type NewAuditEntry = Omit<Insertable<AuditLogTable>, 'seq'>

/**
 * A page query: entries with `seq` below `before` (the previous page's `next_cursor`), at or
 * after `since` and before `until` (ISO-8601 UTC), whose `kind` is `kind` or starts with
 * `kind.` (`migration` matches `migration.cancel`), newest first, at most `limit`.
 */
export interface AuditQuery {
  before?: number
  since?: string
  until?: string
  kind?: string
  limit: number
}

/** Audit log access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class AuditRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** Appends an entry; returns its `seq`. */
  append(e: NewAuditEntry): Promise<number> {
    return persist('write audit entry', async () => {
      const r = await this.db.insertInto('audit_log').values(e).returning('seq').executeTakeFirstOrThrow()
      return r.seq
    })
  }

  /** One page of entries (see {@link AuditQuery}) and the cursor of the next page (null: no more). */
  list(q: AuditQuery): Promise<{ items: AuditEntry[]; next_cursor: number | null }> {
    return persist('read audit log', async () => {
      let s = this.db.selectFrom('audit_log').selectAll()
      if (q.before !== undefined) s = s.where('seq', '<', q.before)
      if (q.since !== undefined) s = s.where('at', '>=', q.since)
      if (q.until !== undefined) s = s.where('at', '<', q.until)
      if (q.kind !== undefined) {
        const prefix = `${q.kind}.`
        s = s.where((eb) => eb.or([eb('kind', '=', q.kind!), eb(sql<string>`substr(kind, 1, ${prefix.length})`, '=', prefix)]))
      }
      const rows = await s
        .orderBy('seq', 'desc')
        .limit(q.limit + 1)
        .execute()
      const items = rows.slice(0, q.limit)
      return { items, next_cursor: rows.length > q.limit ? items[items.length - 1]!.seq : null }
    })
  }

  /** Removes the entries older than `before` (ISO-8601 UTC); returns how many. */
  prune(before: string): Promise<number> {
    return persist('prune audit log', async () => {
      const r = await this.db.deleteFrom('audit_log').where('at', '<', before).executeTakeFirst()
      return Number(r.numDeletedRows)
    })
  }
}
