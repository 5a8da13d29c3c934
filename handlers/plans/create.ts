// POST /plans: submit a bulk plan of many VMs (roadmap v0.5).
import { json, readJson } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { submitBulkPlan } from '../../lib/jobs/bulk.ts'

export const method = 'POST'
export const path = '/plans'

/**
 * Body `{name?, max_per_source?, cutover?, precopy_interval_seconds?, vms: [{key, plan, depends_on?}]}`;
 * 201 with the plan resource, its jobs `Queued` (each an ordinary migration). Throws
 * `E_MIG_BAD_REQUEST` (not JSON), `E_MIG_INVALID_PLAN` (every failing field path, unknown or
 * cyclic `depends_on`), and the codes of `POST /migrations` for each VM.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const { plan, jobs } = await submitBulkPlan(await readJson(request), ctx.store, ctx.config.importRoot, ctx.now(), {
    precopyIntervalSeconds: ctx.config.precopyIntervalSeconds,
  })
  for (const j of jobs) await ctx.hub.publishJob(j)
  ctx.runner?.notify()
  return json(plan, 201)
}
