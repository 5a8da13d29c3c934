/**
 * Repository of bulk plans (roadmap v0.5): many jobs submitted together. The jobs themselves are
 * ordinary rows of the jobs table carrying `bulk_plan_id`, `bulk_key` and `depends_on`.
 */
import type { Kysely, Selectable } from 'kysely'
import { MigError } from '../errors.ts'
import { persist } from './persist.ts'
import type { BulkPlansTable, Database } from './schema.ts'

/** A stored bulk plan row (without its jobs). Timestamps ISO-8601 UTC. */
export type BulkPlanRow = Selectable<BulkPlansTable>

/** Bulk plans table access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class BulkPlansRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** Persists a new bulk plan. */
  create(p: { id: string; name: string | null; max_per_source: number | null; now: string }): Promise<BulkPlanRow> {
    const row: BulkPlanRow = { id: p.id, name: p.name, max_per_source: p.max_per_source, cutover_requested_at: null, created_at: p.now, updated_at: p.now }
    return persist('create bulk plan', async () => {
      await this.db.insertInto('bulk_plans').values(row).execute()
      return row
    })
  }

  /** One bulk plan; `E_MIG_NOT_FOUND` when absent. */
  async get(id: string): Promise<BulkPlanRow> {
    const row = await persist('load bulk plan', () => this.db.selectFrom('bulk_plans').selectAll().where('id', '=', id).executeTakeFirst())
    if (!row) throw new MigError('E_MIG_NOT_FOUND', `plan ${id} not found`)
    return row
  }

  /** All bulk plans, newest first. */
  list(): Promise<BulkPlanRow[]> {
    return persist('list bulk plans', () => this.db.selectFrom('bulk_plans').selectAll().orderBy('created_at', 'desc').orderBy('id', 'desc').execute())
  }

  /** Records the shared cutover command (first one wins). */
  async markCutover(id: string, now: string): Promise<void> {
    await persist('request bulk plan cutover', () =>
      this.db
        .updateTable('bulk_plans')
        .set({ cutover_requested_at: now, updated_at: now })
        .where('id', '=', id)
        .where('cutover_requested_at', 'is', null)
        .execute(),
    )
  }
}
