// GET /migrations/:id/serial-log: the tail of the serial console log of the job's domain
// (read-only; what the web console shows for a failed boot).
import { join } from 'node:path'
import { serialTail } from '../../lib/domain/boot-check.ts'
import { MigError } from '../../lib/errors.ts'
import { json, query } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'GET'
export const path = '/migrations/:id/serial-log'

/** Most lines one request returns. */
const MAX_LINES = 200

/**
 * 200 `{id, domain, lines}`: the last `?lines=` (default 50, at most 200) lines of
 * `<data dir>/logs/<job-id>.serial.log`, control characters removed; `lines` is empty while the
 * job has no domain or its guest printed nothing. Throws `E_MIG_NOT_FOUND` (unknown job),
 * `E_MIG_BAD_REQUEST` (`lines` not an integer in 1..200).
 */
export async function handle(request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  const raw = query(request).get('lines')
  const count = raw === null ? 50 : Number(raw)
  if (!Number.isInteger(count) || count < 1 || count > MAX_LINES) throw new MigError('E_MIG_BAD_REQUEST', `lines must be an integer from 1 to ${MAX_LINES}`)
  const job = await ctx.store.jobs.get(params.id)
  const lines = job.domain ? await serialTail(join(ctx.config.dataDir, 'logs', `${job.id}.serial.log`), count) : []
  return json({ id: job.id, domain: job.domain, lines })
}
