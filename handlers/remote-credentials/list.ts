// GET /remote-credentials: the registered credentials of remote inputs, without their secrets.
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'GET'
export const path = '/remote-credentials'

/** 200 `{items: [{id, name, kind, username, created_at, updated_at}]}`. Throws `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx): Promise<Response> {
  return json({ items: await ctx.store.remoteCredentials.list() })
}
