// GET /migrations: list all migrations (spec 4).
import { list } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'GET'
export const path = '/migrations'

/** 200 `{items: Job[]}`, newest first. Throws `E_MIG_PERSIST_FAILED`. */
export async function handle(_request: Request, ctx: Ctx): Promise<Response> {
  return list(await ctx.store.jobs.list())
}
