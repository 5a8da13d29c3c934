// GET /uploads: list uploads (spec 4).
import { list } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'GET'
export const path = '/uploads'

/** 200 `{items: Upload[]}` (complete, unexpired uploads). Throws `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx): Promise<Response> {
  return list(await ctx.store.uploads.list(ctx.now().toISOString()))
}
