/**
 * Credentials of remote offline inputs (roadmap v0.3): the body of `POST /remote-credentials`,
 * and the lookup that unseals one for the job or inspect that opens a remote input. Secrets are
 * sealed with AES-256-GCM bound to the credential's id (`lib/crypto/seal.ts`), like a vSphere
 * source's password, and never returned by the API.
 */
import { z } from 'zod'
import type { Sealer } from '../crypto/seal.ts'
import { MigError } from '../errors.ts'
import { issuesOf } from '../plan.ts'
import type { RemoteCredentialsRepo } from '../store/remote-credentials.ts'
import type { CredentialLookup, RemoteAuth } from './open.ts'

const name = z
  .string()
  .min(1)
  .max(128)
  .regex(/^[^\x00-\x1f]+$/, 'must not contain control characters')
// RFC 7617 2: a user-id containing a colon cannot be sent
const username = z
  .string()
  .min(1)
  .max(256)
  .regex(/^[^:\x00-\x1f]+$/, 'must not contain a colon or control characters')
// [MS-NLMP]: the user and domain go separately; a backslash would be read as DOMAIN\user
const smbName = z
  .string()
  .min(1)
  .max(256)
  .regex(/^[^\\/:\x00-\x1f]+$/, 'must not contain a backslash, slash, colon or control characters')
const secret = z
  .string()
  .min(1)
  .max(4096)
  .regex(/^[^\x00-\x1f]+$/, 'must not contain control characters')

/**
 * Body of `POST /remote-credentials`: HTTP basic (`username`, `password`), bearer (`token`), S3
 * access keys, or an SMB user (`username`, `password`, optional `domain`, default `WORKGROUP`).
 */
export const RemoteCredentialInput = z.discriminatedUnion('kind', [
  z.strictObject({ name, kind: z.literal('http_basic'), username, password: secret }),
  z.strictObject({ name, kind: z.literal('http_bearer'), token: secret }),
  z.strictObject({
    name,
    kind: z.literal('s3'),
    access_key_id: z
      .string()
      .min(1)
      .max(256)
      .regex(/^[\x21-\x7e]+$/, 'must be printable ASCII without spaces'),
    secret_access_key: secret,
  }),
  z.strictObject({ name, kind: z.literal('smb'), username: smbName, password: secret, domain: smbName.optional() }),
])
export type RemoteCredentialInput = z.infer<typeof RemoteCredentialInput>

/** Validates a `POST /remote-credentials` body; `E_MIG_BAD_REQUEST` with `details.issues` (never echoing a secret). */
export function parseRemoteCredentialInput(body: unknown): RemoteCredentialInput {
  const r = RemoteCredentialInput.safeParse(body)
  if (!r.success) {
    const issues = issuesOf(r.error)
    throw new MigError('E_MIG_BAD_REQUEST', `invalid remote credential: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`, { details: { issues } })
  }
  return r.data
}

/** The secret of `input` (sealed for storage). */
export function secretOf(input: RemoteCredentialInput): string {
  if (input.kind === 'http_basic' || input.kind === 'smb') return input.password
  return input.kind === 's3' ? input.secret_access_key : input.token
}

/**
 * The non-secret name of `input` stored in clear (`username` column): the user, the S3 access key
 * id, or an SMB `DOMAIN\user` (`user` alone without a domain).
 */
export function publicNameOf(input: RemoteCredentialInput): string | null {
  if (input.kind === 'smb') return input.domain ? `${input.domain}\\${input.username}` : input.username
  return input.kind === 'http_basic' ? input.username : input.kind === 's3' ? input.access_key_id : null
}

/** The lookup `lib/remote/open.ts` uses: the stored credential, unsealed. `E_MIG_NOT_FOUND` when absent. */
export function credentialLookup(repo: RemoteCredentialsRepo, sealer: Sealer): CredentialLookup {
  return async (id: string): Promise<RemoteAuth> => {
    const c = await repo.getSealed(id)
    const plain = sealer.open(c.secret, id)
    if (c.kind === 'http_basic') return { kind: 'basic', username: c.username ?? '', password: plain }
    if (c.kind === 's3') return { kind: 's3', accessKeyId: c.username ?? '', secretAccessKey: plain }
    if (c.kind === 'smb') {
      const name = c.username ?? ''
      const cut = name.indexOf('\\')
      return cut < 0
        ? { kind: 'smb', username: name, password: plain }
        : { kind: 'smb', domain: name.slice(0, cut), username: name.slice(cut + 1), password: plain }
    }
    return { kind: 'bearer', token: plain }
  }
}
