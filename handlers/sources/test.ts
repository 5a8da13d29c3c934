// POST /sources/:id/test: probe connectivity (spec 4).
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { withSourceSession } from '../../lib/adapters/session.ts'

export const method = 'POST'
export const path = '/sources/:id/test'

/**
 * Connects and logs in; 200 `{ok: true, product, version}`. Throws `E_MIG_NOT_FOUND`,
 * `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_AUTH_FAILED`.
 */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  const about = await withSourceSession(ctx.store.sources, ctx.sealer, params.id, (s) => s.describe())
  return json({ ok: true, ...about })
}
