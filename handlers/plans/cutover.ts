// POST /plans/:id/cutover: the shared cutover of a bulk plan's warm VMs (roadmap v0.5, v0.6).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { cutoverBulkPlan, loadBulkPlan } from '../../lib/jobs/bulk.ts'

export const method = 'POST'
export const path = '/plans/:id/cutover'

/**
 * 202 with the plan resource: every warm VM of the plan waiting for its cutover (or still to
 * reach the wait) cuts over. Throws `E_MIG_NOT_FOUND`, `E_MIG_CONFLICT` (no warm VM of the plan
 * waits for a cutover).
 */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  const ids = await cutoverBulkPlan(ctx.store, params.id, ctx.now())
  for (const id of ids) await ctx.hub.publishJob(await ctx.store.jobs.get(id))
  return json(await loadBulkPlan(ctx.store, params.id), 202)
}
