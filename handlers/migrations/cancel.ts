// POST /migrations/:id/cancel: request cancellation (spec 4, 3 rule 3).
import { z } from 'zod'
import { MigError } from '../../lib/errors.ts'
import { LIVE_GUEST_ON_CANCEL } from '../../lib/job.ts'
import { json, readJson } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'POST'
export const path = '/migrations/:id/cancel'

/** The optional body: what to do with the guest of a live import that already runs. */
const Body = z.strictObject({ live_guest: z.enum(LIVE_GUEST_ON_CANCEL).optional() })

/**
 * Optional body `{"live_guest": "finish" | "destroy"}` (no body, an empty one or `{}`: `finish`;
 * only a live import whose guest runs heeds it, docs/live-import.md). 202 with the job. A queued
 * job ends `Cancelled` with `E_MIG_CANCELLED` at once; a running one is flagged and its worker
 * stops. Throws `E_MIG_BAD_REQUEST` (a body that is not that object, naming the field),
 * `E_MIG_NOT_FOUND`, `E_MIG_CONFLICT` (already ended).
 */
export async function handle(request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  const body = Body.safeParse(await readJson(request, { optional: true }))
  if (!body.success)
    throw new MigError(
      'E_MIG_BAD_REQUEST',
      `invalid cancel body: ${body.error.issues.map((i) => `${i.path.join('.') || (i.code === 'unrecognized_keys' ? i.keys.join(', ') : 'body')}: ${i.message}`).join('; ')}; send {"live_guest": "finish"} or {"live_guest": "destroy"}, or no body`,
    )
  const { job, changed } = await ctx.store.jobs.requestCancel(params.id, ctx.now().toISOString(), body.data.live_guest ?? 'finish')
  if (changed) await ctx.hub.publishJob(job)
  else ctx.runner?.cancel(job.id)
  return json(job, 202)
}
