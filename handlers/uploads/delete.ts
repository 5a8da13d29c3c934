// DELETE /uploads/:id: drop an upload (spec 4).
import { unlink } from 'node:fs/promises'
import { join } from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { noContent } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'DELETE'
export const path = '/uploads/:id'

/** 204; the file is removed. Throws `E_MIG_UPLOAD_NOT_FOUND`, `E_MIG_CONFLICT` (a queued or running job uses it). */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  await ctx.store.uploads.get(params.id, ctx.now().toISOString())
  const users = await ctx.store.jobs.activeUsing({ uploadId: params.id })
  if (users.length > 0)
    throw new MigError('E_MIG_CONFLICT', `upload ${params.id} is used by active migration(s) ${users.join(', ')}`, { details: { migrations: users } })
  await ctx.store.uploads.remove(params.id)
  await unlink(join(ctx.paths.uploads, params.id)).catch(() => {})
  return noContent()
}
