// POST /sources: register a new source (spec 4, 2.2).
import { randomUUID } from 'node:crypto'
import { json, readJson } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { parseSourceInput } from '../../lib/sources.ts'
import { publicSource } from '../../lib/store/sources.ts'

export const method = 'POST'
export const path = '/sources'

/**
 * Body `{name, kind, endpoint, username, password, tls?}`, for `libvirt_remote`
 * `{..., private_key, known_hosts | client_cert}` instead of the password; 201 with the source (the
 * secret sealed with AES-256-GCM, never returned). Throws `E_MIG_BAD_REQUEST` (invalid body), `E_MIG_CONFLICT`
 * (name taken), `E_MIG_PERSIST_FAILED`.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const input = parseSourceInput(await readJson(request))
  const id = randomUUID()
  const source = await ctx.store.sources.create({
    id,
    name: input.name,
    kind: input.kind,
    endpoint: input.endpoint,
    username: input.username,
    secret: ctx.sealer.seal(input.secret, id),
    tls: input.tls,
    now: ctx.now().toISOString(),
  })
  return json(publicSource(source), 201)
}
