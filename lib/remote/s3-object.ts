/**
 * An S3 object (`s3://bucket/key`) read in place as a {@link RemoteFile}: the HTTP object of
 * `lib/remote/http-object.ts` over the bucket's path-style URL
 * (`<endpoint>/<bucket>/<key>`, Amazon S3 API "GetObject" with `Range`), every request signed
 * with AWS Signature Version 4 (`aws4fetch`'s `AwsV4Signer`: signing only; the requests go
 * through the same ranged transport, identity checks, retries and TLS trust as HTTP inputs).
 *
 * The object's identity is its `ETag`; every range answer must carry the same one (a server that
 * ignores `If-Match` is still caught by that comparison). S3 errors map as HTTP ones: `403`
 * (`SignatureDoesNotMatch`, `InvalidAccessKeyId`, `AccessDenied`) -> `E_MIG_AUTH_FAILED`, `404`
 * (`NoSuchKey`, `NoSuchBucket`) -> `E_MIG_NOT_FOUND` naming the `s3://` URL.
 */
import { AwsV4Signer } from 'aws4fetch'
import type { RemoteFile } from '../contracts/remote-file.ts'
import type { TlsTrust } from '../tls.ts'
import { openHttpObject, type HttpObjectOptions } from './http-object.ts'

/** S3 access keys. */
export interface S3Access {
  kind: 's3'
  accessKeyId: string
  secretAccessKey: string
}

/** Default region (the signature's scope; `us-east-1` is what S3-compatible servers expect when unset). */
export const DEFAULT_S3_REGION = 'us-east-1'

/**
 * The path-style HTTP URL of `s3://bucket/key` at `endpoint` (default
 * `https://s3.<region>.amazonaws.com`): `<endpoint>/<bucket>/<key>`, the key as the URL spells it.
 */
export function s3HttpUrl(s3url: string, endpoint: string | undefined, region: string): string {
  const u = new URL(s3url)
  const base = (endpoint ?? `https://s3.${region}.amazonaws.com`).replace(/\/+$/, '')
  return `${base}/${u.hostname}${u.pathname}`
}

/**
 * Opens `s3url` (`s3://bucket/key`) at `endpoint`/`region`, signed with `access` (anonymous
 * without). Throws what `openHttpObject` throws, named by the `s3://` URL.
 */
export function openS3Object(
  s3url: string,
  opts: { endpoint?: string; region?: string; access?: S3Access | null; trust?: TlsTrust; http?: Omit<HttpObjectOptions, 'trust' | 'auth' | 'name' | 'sign'> },
): Promise<RemoteFile> {
  const region = opts.region ?? DEFAULT_S3_REGION
  const access = opts.access
  const sign = access
    ? async (url: string, headers: Record<string, string>): Promise<Record<string, string>> => {
        const signed = await new AwsV4Signer({
          url,
          method: 'GET',
          headers,
          accessKeyId: access.accessKeyId,
          secretAccessKey: access.secretAccessKey,
          service: 's3',
          region,
        }).sign()
        const out: Record<string, string> = {}
        signed.headers.forEach((v, k) => {
          if (k !== 'host') out[k] = v // RangeHttp sends the host it connects to (the one signed)
        })
        return out
      }
    : undefined
  return openHttpObject(s3HttpUrl(s3url, opts.endpoint, region), { ...opts.http, trust: opts.trust ?? {}, name: s3url, sign })
}
