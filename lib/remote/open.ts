/**
 * Opening a remote offline input (`source_ref.kind: "offline_url"`, `lib/remote/ref.ts`) for an
 * inspect or a job: the object is opened once ({@link openHttpObject}: size and identity taken),
 * registered in the job's input scope under its URL (`lib/hostpath.ts`), and from then on the
 * importers and disk readers read it by that name through `lib/formats/io.ts` as they read a
 * pinned host file: positioned reads, here ranged requests.
 */
import type { RemoteFile } from '../contracts/remote-file.ts'
import { MigError } from '../errors.ts'
import { openHttpObject, type HttpAuth, type HttpObjectOptions } from './http-object.ts'
import { openS3Object, type S3Access } from './s3-object.ts'
import { openSmbObject, type SmbAccess, type SmbObjectOptions } from './smb-object.ts'
import type { OfflineUrlRef } from './ref.ts'
import { withReadAhead } from './read-ahead.ts'

/** A credential, unsealed: HTTP basic or bearer, S3 access keys, or an SMB user. */
export type RemoteAuth = HttpAuth | S3Access | SmbAccess

/** Looks up the credential `id` (`E_MIG_NOT_FOUND` when absent) and unseals it. */
export type CredentialLookup = (id: string) => Promise<RemoteAuth>

/** Settings of {@link openRemoteInput}: the credential lookup and transport tuning. */
export interface RemoteOpenOptions {
  credentials?: CredentialLookup
  http?: Omit<HttpObjectOptions, 'trust' | 'auth'>
  smb?: Omit<SmbObjectOptions, 'auth'>
}

/**
 * Opens the object `ref` names. Throws `E_MIG_NOT_FOUND` (no such credential, no such object),
 * `E_MIG_AUTH_FAILED`, `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_UNSUPPORTED_FORMAT` (see
 * `lib/remote/http-object.ts`).
 */
export async function openRemoteInput(ref: OfflineUrlRef, opts: RemoteOpenOptions = {}): Promise<RemoteFile> {
  let auth: RemoteAuth | null = null
  if (ref.credential_id) {
    if (!opts.credentials) throw new Error('openRemoteInput: a credential_id without a credential lookup')
    auth = await opts.credentials(ref.credential_id)
  }
  const scheme = new URL(ref.url).protocol
  const s3 = scheme === 's3:'
  const problem = credentialProblem(scheme, auth?.kind ?? null)
  if (problem)
    throw new MigError('E_MIG_INVALID_PLAN', `source_ref.credential_id: ${problem}`, {
      details: { issues: [{ path: 'plan.source_ref.credential_id', message: problem }] },
    })
  // small reads in file order (clusters, grains) become one request per window (read-ahead.ts)
  if (scheme === 'smb:') return withReadAhead(await openSmbObject(ref.url, { ...opts.smb, auth: auth as SmbAccess | null }))
  if (s3)
    return withReadAhead(
      await openS3Object(ref.url, {
        endpoint: ref.s3?.endpoint,
        region: ref.s3?.region,
        access: auth as S3Access | null,
        trust: ref.tls ?? {},
        http: opts.http,
      }),
    )
  return withReadAhead(await openHttpObject(ref.url, { ...opts.http, trust: ref.tls ?? {}, auth: auth as HttpAuth | null }))
}

/**
 * Why a credential of kind `kind` (`basic`, `bearer`, `s3`, `smb`; null: none) does not fit an
 * input of URL scheme `scheme` (`http:`, `https:`, `s3:`, `smb:`), or null.
 */
export function credentialProblem(scheme: string, kind: string | null): string | null {
  if (kind === null) return null
  if (scheme === 's3:') return kind === 's3' ? null : 'an s3:// input needs a credential of kind s3'
  if (scheme === 'smb:') return kind === 'smb' ? null : 'an smb:// input needs a credential of kind smb'
  if (kind === 's3' || kind === 'smb') return 'an http(s) input needs a credential of kind http_basic or http_bearer'
  return null
}
