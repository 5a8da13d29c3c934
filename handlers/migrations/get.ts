// GET /migrations/:id: load one migration (spec 4).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'GET'
export const path = '/migrations/:id'

/** 200 with the job. Throws `E_MIG_NOT_FOUND`, `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  return json(await ctx.store.jobs.get(params.id))
}
