/**
 * Opening a remote offline input (`source_ref.kind: "offline_url"`, `lib/remote/ref.ts`) for an
 * inspect or a job: the object is opened once ({@link openHttpObject}: size and identity taken),
 * registered in the job's input scope under its URL (`lib/hostpath.ts`), and from then on the
 * importers and disk readers read it by that name through `lib/formats/io.ts` as they read a
 * pinned host file: positioned reads, here ranged requests.
 */
import type { RemoteFile } from '../contracts/remote-file.ts'
import { InputScope } from '../hostpath.ts'
import { inspectInput, type InspectResult } from '../importers/index.ts'
import type { ImporterKind } from '../kinds.ts'
import { openHttpObject, type HttpAuth, type HttpObjectOptions } from './http-object.ts'
import type { OfflineUrlRef } from './ref.ts'

/** Looks up the credential `id` (`E_MIG_NOT_FOUND` when absent) and unseals it. */
export type CredentialLookup = (id: string) => Promise<HttpAuth>

/** Settings of {@link openRemoteInput}: the credential lookup and transport tuning. */
export interface RemoteOpenOptions {
  credentials?: CredentialLookup
  http?: Omit<HttpObjectOptions, 'trust' | 'auth'>
}

/**
 * Opens the object `ref` names. Throws `E_MIG_NOT_FOUND` (no such credential, no such object),
 * `E_MIG_AUTH_FAILED`, `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_UNSUPPORTED_FORMAT` (see
 * `lib/remote/http-object.ts`).
 */
export async function openRemoteInput(ref: OfflineUrlRef, opts: RemoteOpenOptions = {}): Promise<RemoteFile> {
  let auth: HttpAuth | null = null
  if (ref.credential_id) {
    if (!opts.credentials) throw new Error('openRemoteInput: a credential_id without a credential lookup')
    auth = await opts.credentials(ref.credential_id)
  }
  return openHttpObject(ref.url, { ...opts.http, trust: ref.tls ?? {}, auth })
}

/**
 * Inspects the remote input `ref` without copying (the `POST /remote-files/inspect` endpoint):
 * headers, descriptors and tables are read with ranged requests, the object is closed after.
 * `kind` skips detection. Throws what {@link openRemoteInput} and `inspectInput` throw.
 */
export async function inspectRemote(
  ref: OfflineUrlRef,
  importRoot: string,
  kind: ImporterKind | undefined,
  opts: RemoteOpenOptions = {},
): Promise<InspectResult> {
  const scope = new InputScope(importRoot)
  try {
    const remote = await openRemoteInput(ref, opts)
    scope.addRemote(remote)
    return await scope.run(() => inspectInput(remote.name, { importRoot }, kind))
  } finally {
    scope.close()
  }
}
