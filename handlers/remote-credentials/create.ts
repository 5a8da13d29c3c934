// POST /remote-credentials: register the credentials of remote offline inputs (roadmap v0.3).
import { randomUUID } from 'node:crypto'
import { parseRemoteCredentialInput, publicNameOf, secretOf } from '../../lib/remote/credentials.ts'
import { json, readJson } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'POST'
export const path = '/remote-credentials'

/**
 * Body `{name, kind: "http_basic", username, password}`, `{name, kind: "http_bearer", token}`,
 * `{name, kind: "s3", access_key_id, secret_access_key}` or `{name, kind: "smb", username,
 * password, domain?}`; 201 `{id, name, kind, username (the user, the access key id, or an SMB
 * `DOMAIN\user`), created_at, updated_at}` (the secret sealed with AES-256-GCM, never returned).
 * Throws `E_MIG_BAD_REQUEST`, `E_MIG_CONFLICT` (name taken), `E_MIG_PERSIST_FAILED`.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const input = parseRemoteCredentialInput(await readJson(request))
  const id = randomUUID()
  const created = await ctx.store.remoteCredentials.create({
    id,
    name: input.name,
    kind: input.kind,
    username: publicNameOf(input),
    secret: ctx.sealer.seal(secretOf(input), id),
    now: ctx.now().toISOString(),
  })
  return json(created, 201)
}
