// GET /sources/:id/vms: discover VMs on the source (spec 4).
import { list } from '../../../runtime/http.ts'
import type { Ctx } from '../../../runtime/context.ts'
import { withSourceSession } from '../../../lib/adapters/session.ts'

export const method = 'GET'
export const path = '/sources/:id/vms'

/** 200 `{items: VmSummary[]}`. Throws `E_MIG_NOT_FOUND`, `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_AUTH_FAILED`. */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  return list(await withSourceSession(ctx.store.sources, ctx.sealer, params.id, (s) => s.listVms()))
}
