// GET /sources/:id/vms/:vm_id: inspect one source VM (spec 4).
import { json } from '../../../runtime/http.ts'
import type { Ctx } from '../../../runtime/context.ts'
import { withSourceSession } from '../../../lib/adapters/session.ts'

export const method = 'GET'
export const path = '/sources/:id/vms/:vm_id'

/**
 * 200 with the VM's manifest (spec 2.5). Throws `E_MIG_NOT_FOUND` (source), `E_MIG_VM_NOT_FOUND`,
 * `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_AUTH_FAILED`.
 */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  return json(await withSourceSession(ctx.store.sources, ctx.sealer, params.id, (s) => s.inspect(params.vm_id)))
}
