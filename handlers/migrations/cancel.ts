// POST /migrations/:id/cancel: request cancellation (spec 4, 3 rule 3).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'POST'
export const path = '/migrations/:id/cancel'

/**
 * 202 with the job. A queued job ends `Cancelled` with `E_MIG_CANCELLED` at once; a running one
 * is flagged and its worker stops. Throws `E_MIG_NOT_FOUND`, `E_MIG_CONFLICT` (already ended).
 */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  const { job, changed } = await ctx.store.jobs.requestCancel(params.id, ctx.now().toISOString())
  if (changed) await ctx.hub.publishJob(job)
  else ctx.runner?.cancel(job.id)
  return json(job, 202)
}
