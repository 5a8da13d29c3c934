// GET /plans: the bulk plans, newest first (roadmap v0.5).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { loadBulkPlan } from '../../lib/jobs/bulk.ts'

export const method = 'GET'
export const path = '/plans'

/** 200 `{items: [plan resource]}`. Throws `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx): Promise<Response> {
  const rows = await ctx.store.bulkPlans.list()
  return json({ items: await Promise.all(rows.map((r) => loadBulkPlan(ctx.store, r.id))) })
}
