// GET /host-files?path=: browse inside the import root (spec 4, 2.6).
import { json, query } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { listHostDir } from '../../lib/hostfiles.ts'

export const method = 'GET'
export const path = '/host-files'

/**
 * 200 `{path, items: HostFileEntry[], truncated}` for the directory `path` (relative to the
 * import root; empty = the root). Throws `E_MIG_HOST_PATH_REJECTED`, `E_MIG_NOT_FOUND`,
 * `E_MIG_BAD_REQUEST` (not a directory).
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  return json(await listHostDir(ctx.config.importRoot, query(request).get('path') ?? ''))
}
