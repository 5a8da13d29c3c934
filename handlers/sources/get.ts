// GET /sources/:id: load one source (spec 4).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { publicSource } from '../../lib/store/sources.ts'

export const method = 'GET'
export const path = '/sources/:id'

/** 200 with the source. Throws `E_MIG_NOT_FOUND`, `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  return json(publicSource(await ctx.store.sources.get(params.id)))
}
