// GET /sources: list registered sources (spec 4).
import { list } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { publicSource } from '../../lib/store/sources.ts'

export const method = 'GET'
export const path = '/sources'

/** 200 `{items: Source[]}`; sources never include the password. Throws `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx): Promise<Response> {
  return list((await ctx.store.sources.list()).map(publicSource))
}
