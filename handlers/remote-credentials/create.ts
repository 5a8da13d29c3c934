// POST /remote-credentials: register the credentials of remote offline inputs (roadmap v0.3).
import { randomUUID } from 'node:crypto'
import { parseRemoteCredentialInput, secretOf } from '../../lib/remote/credentials.ts'
import { json, readJson } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'POST'
export const path = '/remote-credentials'

/**
 * Body `{name, kind: "http_basic", username, password}` or `{name, kind: "http_bearer", token}`;
 * 201 `{id, name, kind, username, created_at, updated_at}` (the secret sealed with AES-256-GCM,
 * never returned). Throws `E_MIG_BAD_REQUEST`, `E_MIG_CONFLICT` (name taken), `E_MIG_PERSIST_FAILED`.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const input = parseRemoteCredentialInput(await readJson(request))
  const id = randomUUID()
  const created = await ctx.store.remoteCredentials.create({
    id,
    name: input.name,
    kind: input.kind,
    username: input.kind === 'http_basic' ? input.username : null,
    secret: ctx.sealer.seal(secretOf(input), id),
    now: ctx.now().toISOString(),
  })
  return json(created, 201)
}
