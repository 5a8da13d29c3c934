// GET /doctor: the host's pre-flight checks (named after `migrator doctor`, the CLI command that
// shows them, as in `brew doctor`; a GET since it changes nothing).
import type { Ctx } from '../../runtime/context.ts'
import { json } from '../../runtime/http.ts'
import { doctorSettings } from '../../runtime/preflight.ts'
import { runDoctor } from '../../lib/host/doctor.ts'

export const method = 'GET'
export const path = '/doctor'

/**
 * 200 `{status, checks: [{id, status: ok|warn|fail, found, fix}]}` (`status`: the worst check).
 * Always 200: a failing check is an answer about the host, not an error of the request.
 */
export async function handle(_request: Request, ctx: Ctx): Promise<Response> {
  return json(await runDoctor(doctorSettings(ctx.config)))
}
