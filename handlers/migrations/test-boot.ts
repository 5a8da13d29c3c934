// POST /migrations/:id/test-boot: boot a disposable clone of the destination before the cutover (docs/test-boot.md).
import { MigError } from '../../lib/errors.ts'
import { json } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'POST'
export const path = '/migrations/:id/test-boot'

/**
 * 202 with the job, its `test_boot` `requested` (then `running`, `passed`, `failed` or
 * `cancelled`, each change a `migration` SSE event). A warm job waiting in `DeltaSyncing` for a
 * manual or scheduled cutover runs it in its worker at the next pass boundary; a job that ended
 * `Completed` with `plan.start: false` runs it in the server. A test boot already requested or
 * running answers the same. Throws `E_MIG_NOT_FOUND`, `E_MIG_CONFLICT` (any other state, with
 * when a test boot becomes possible; a server that runs no jobs).
 */
export async function handle(_request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response> {
  if (!ctx.testBoots) throw new MigError('E_MIG_CONFLICT', 'this server runs no jobs: it cannot test-boot')
  const { job, runner, changed } = await ctx.store.jobs.requestTestBoot(params.id, ctx.now().toISOString())
  if (changed) await ctx.hub.publishJob(job)
  if (runner === 'server' && job.test_boot?.state === 'requested') await ctx.testBoots.runDefined(job)
  return json(await ctx.store.jobs.get(job.id), 202)
}
