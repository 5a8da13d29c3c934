// GET /uploads/:id: load one upload (spec 4).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'GET'
export const path = '/uploads/:id'

/** 200 with the upload. Throws `E_MIG_UPLOAD_NOT_FOUND` (absent, expired or removed). */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  return json(await ctx.store.uploads.get(params.id, ctx.now().toISOString()))
}
