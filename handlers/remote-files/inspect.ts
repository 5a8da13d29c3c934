// POST /remote-files/inspect: detect format and manifest of a remote input without copying it (roadmap v0.3).
import { MigError } from '../../lib/errors.ts'
import { issuesOf } from '../../lib/plan.ts'
import { credentialLookup } from '../../lib/remote/credentials.ts'
import { inspectRemote } from '../../lib/remote/folder.ts'
import { RemoteInspectBody } from '../../lib/remote/ref.ts'
import { json, readJson } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'POST'
export const path = '/remote-files/inspect'

/**
 * Body `{url, credential_id?, tls?, s3?, kind?}` (the fields of an `offline_url` source_ref; `kind`
 * skips detection). Reads headers, descriptors and tables with ranged requests, never the disks.
 * 200 `{detected_kind, manifest}`. Throws `E_MIG_BAD_REQUEST` (with `details.issues`),
 * `E_MIG_NOT_FOUND` (credential or object), `E_MIG_AUTH_FAILED`, `E_MIG_SOURCE_UNREACHABLE`,
 * `E_MIG_UNSUPPORTED_FORMAT`, `E_MIG_MALFORMED_ARCHIVE`.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const body = RemoteInspectBody.safeParse(await readJson(request))
  if (!body.success) {
    const issues = issuesOf(body.error)
    throw new MigError('E_MIG_BAD_REQUEST', `invalid body: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`, { details: { issues } })
  }
  const { kind, ...ref } = body.data
  const result = await inspectRemote({ kind: 'offline_url', ...ref }, ctx.config.importRoot, kind, {
    credentials: credentialLookup(ctx.store.remoteCredentials, ctx.sealer),
  })
  return json(result)
}
