// GET /metrics: the migrator's metrics for Prometheus (docs/operations.md).
import type { Ctx } from '../../runtime/context.ts'

export const method = 'GET'
export const path = '/metrics'

/**
 * 200 with the metrics in the Prometheus text exposition format 0.0.4 (lib/metrics/registry.ts).
 * Throws `E_MIG_PERSIST_FAILED` (503) when the store cannot be read.
 */
export async function handle(_request: Request, ctx: Ctx): Promise<Response> {
  const body = await ctx.metrics.render()
  return new Response(body, { status: 200, headers: { 'content-type': ctx.metrics.contentType, 'cache-control': 'no-store' } })
}
