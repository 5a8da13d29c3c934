// DELETE /sources/:id: remove a source (spec 4).
import { MigError } from '../../lib/errors.ts'
import { noContent } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'DELETE'
export const path = '/sources/:id'

/** 204. Throws `E_MIG_NOT_FOUND`, `E_MIG_CONFLICT` (a queued or running job uses it), `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  await ctx.store.sources.get(params.id)
  const users = await ctx.store.jobs.activeUsing({ sourceId: params.id })
  if (users.length > 0)
    throw new MigError('E_MIG_CONFLICT', `source ${params.id} is used by active migration(s) ${users.join(', ')}`, { details: { migrations: users } })
  await ctx.store.sources.delete(params.id)
  return noContent()
}
