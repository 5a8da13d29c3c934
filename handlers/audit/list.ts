// GET /audit: the audit log of state-changing requests, newest first (docs/operations.md).
import { z } from 'zod'
import { MigError } from '../../lib/errors.ts'
import type { Ctx } from '../../runtime/context.ts'
import { json } from '../../runtime/http.ts'

export const method = 'GET'
export const path = '/audit'

/** The query of `GET /audit` (every parameter optional). */
export const AuditListQuery = z.strictObject({
  since: z.iso.datetime({ offset: true }).optional(),
  until: z.iso.datetime({ offset: true }).optional(),
  kind: z
    .string()
    .regex(/^[a-z_]{1,40}(\.[a-z_]{1,40})?$/, 'must be a resource (`migration`) or a kind (`migration.cancel`)')
    .optional(),
  limit: z.coerce.number().int().min(1).max(1000).optional(),
  cursor: z.coerce.number().int().min(1).optional(),
})

/**
 * 200 `{items: [entry], next_cursor}`: entries `{seq, at, client_address, user_agent, request_id,
 * method, route, kind, resource_id, status, error_code}` at or after `since` and before `until`
 * (RFC 3339), of `kind` (`migration` or `migration.cancel`), at most `limit` (default 100, at most
 * 1000), below `cursor` (the previous page's `next_cursor`; null on the last page).
 * Throws `E_MIG_BAD_REQUEST` naming the parameter, `E_MIG_PERSIST_FAILED`.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const params = Object.fromEntries(new URL(request.url).searchParams)
  const q = AuditListQuery.safeParse(params)
  if (!q.success) {
    const issue = q.error.issues[0]!
    const name = issue.path.join('.') || 'query'
    throw new MigError('E_MIG_BAD_REQUEST', `GET /audit: parameter ${name}: ${issue.message}`, { details: { parameter: name } })
  }
  const { since, until, kind, limit, cursor } = q.data
  const iso = (s: string | undefined) => (s === undefined ? undefined : new Date(s).toISOString())
  return json(await ctx.store.audit.list({ since: iso(since), until: iso(until), kind, limit: limit ?? 100, before: cursor }))
}
