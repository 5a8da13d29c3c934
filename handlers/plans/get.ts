// GET /plans/:id: one bulk plan with its aggregate state and VMs (roadmap v0.5).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { loadBulkPlan } from '../../lib/jobs/bulk.ts'

export const method = 'GET'
export const path = '/plans/:id'

/** 200 with the plan resource. Throws `E_MIG_NOT_FOUND`, `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  return json(await loadBulkPlan(ctx.store, params.id))
}
