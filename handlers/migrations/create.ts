// POST /migrations: submit a live or offline plan (spec 4).
import { json, readJson } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { submitPlan } from '../../lib/jobs/submit.ts'

export const method = 'POST'
export const path = '/migrations'

/**
 * Body `{plan}`; 201 with the `Queued` job, at once. Throws `E_MIG_BAD_REQUEST` (not JSON),
 * `E_MIG_INVALID_PLAN` (with every failing field path), `E_MIG_HOST_PATH_REJECTED`,
 * `E_MIG_NOT_FOUND` (unknown source or missing path), `E_MIG_UPLOAD_NOT_FOUND`, `E_MIG_PERSIST_FAILED`.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const job = await submitPlan(await readJson(request), ctx.store, ctx.config.importRoot, ctx.now(), {
    precopyIntervalSeconds: ctx.config.precopyIntervalSeconds,
  })
  await ctx.hub.publishJob(job)
  ctx.runner?.notify()
  return json(job, 201)
}
