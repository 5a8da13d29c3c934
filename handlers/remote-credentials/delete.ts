// DELETE /remote-credentials/:id: remove a credential of remote inputs.
import { noContent } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'DELETE'
export const path = '/remote-credentials/:id'

/** 204. Throws `E_MIG_NOT_FOUND`, `E_MIG_PERSIST_FAILED`. A job that needs it later fails with `E_MIG_NOT_FOUND` naming it. */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  await ctx.store.remoteCredentials.delete(params.id!)
  return noContent()
}
