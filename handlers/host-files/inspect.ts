// POST /host-files/inspect: detect format and manifest on a host file (spec 4).
import { MigError } from '../../lib/errors.ts'
import { HostFileInspectBody as Body } from '../../lib/hostfiles.ts'
import { resolveInRoot } from '../../lib/hostpath.ts'
import { inspectInput } from '../../lib/importers/index.ts'
import { json, readJson } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'POST'
export const path = '/host-files/inspect'

/**
 * Body `{path, kind?}` (path relative to, or absolute inside, the import root; `kind` skips
 * detection). 200 `{detected_kind, manifest}`. Throws `E_MIG_BAD_REQUEST`,
 * `E_MIG_HOST_PATH_REJECTED`, `E_MIG_NOT_FOUND`, `E_MIG_UNSUPPORTED_FORMAT`, `E_MIG_MALFORMED_ARCHIVE`.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const body = Body.safeParse(await readJson(request))
  if (!body.success) throw new MigError('E_MIG_BAD_REQUEST', `invalid body: ${body.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`)
  const abs = resolveInRoot(ctx.config.importRoot, body.data.path)
  return json(await (ctx.inspect ?? inspectInput)(abs, { importRoot: ctx.config.importRoot }, body.data.kind))
}
