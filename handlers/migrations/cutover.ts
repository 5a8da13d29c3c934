// POST /migrations/:id/cutover: the operator's cutover command for a warm job (roadmap v0.6).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'POST'
export const path = '/migrations/:id/cutover'

/**
 * 202 with the job, its `cutover.requested_at` set: the job, waiting in `DeltaSyncing` for a
 * `manual` or `scheduled` cutover, goes `CuttingOver` within a second (guest shutdown, power-off
 * after the timeout, final delta, then V2V/Starting). Repeating the command answers the same.
 * Throws `E_MIG_NOT_FOUND`, `E_MIG_CONFLICT` (not waiting for a cutover: another state, a cold
 * or offline job, or a plan that cuts over automatically).
 */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  const job = await ctx.store.jobs.requestCutover(params.id, ctx.now().toISOString())
  await ctx.hub.publishJob(job)
  return json(job, 202)
}
