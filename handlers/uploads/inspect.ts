// POST /uploads/:id/inspect: detect format and manifest (spec 4).
import { join } from 'node:path'
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { inspectInput } from '../../lib/importers/index.ts'

export const method = 'POST'
export const path = '/uploads/:id/inspect'

/**
 * 200 `{detected_kind, manifest}`. Throws `E_MIG_UPLOAD_NOT_FOUND`, `E_MIG_UNSUPPORTED_FORMAT`,
 * `E_MIG_MALFORMED_ARCHIVE`, `E_MIG_HOST_PATH_REJECTED`.
 */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  const upload = await ctx.store.uploads.get(params.id, ctx.now().toISOString())
  return json(await (ctx.inspect ?? inspectInput)(join(ctx.paths.uploads, upload.id), { importRoot: ctx.config.importRoot, allowUploads: true }))
}
