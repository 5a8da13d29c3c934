/**
 * The wire shape of a remote offline input (roadmap v0.3): `source_ref` of kind `offline_url`,
 * validated with zod like the rest of the plan (`lib/plan.ts`).
 *
 * ```json
 * {"kind": "offline_url", "url": "https://files.example/vm.ova",   (or "s3://bucket/key" with "s3": {"endpoint", "region"},
 *   or "smb://server[:port]/share/dir/vm.ova")
 *  "credential_id": "<uuid of POST /remote-credentials>", "tls": {"ca_pem": "-----BEGIN CERTIFICATE-----..."}}
 * ```
 */
import { z } from 'zod'
import { SourceTlsSchema } from '../contracts/source-tls.ts'
import { IMPORTER_KINDS, type ImporterKind } from '../kinds.ts'

/** URL schemes a remote input may use. */
export const REMOTE_SCHEMES = ['http:', 'https:', 's3:', 'smb:'] as const

/**
 * Importer kinds read remotely: one file read in place through ranged reads, or a folder export
 * named by its descriptor's URL (`.ovf`, `.vmx`) whose companions are sibling URLs
 * (`lib/remote/folder.ts`).
 */
export const REMOTE_IMPORTERS: readonly ImporterKind[] = ['ova_archive', 'qcow2', 'vmdk', 'vhdx', 'ovf_folder', 'vmx_folder']

/** The descriptor extension a folder kind's URL must end with. */
export const REMOTE_FOLDER_DESCRIPTORS: Partial<Record<ImporterKind, string>> = { ovf_folder: '.ovf', vmx_folder: '.vmx' }

/** Why `s` is not an acceptable remote URL, or null. */
export function remoteUrlProblem(s: string): string | null {
  let u: URL
  try {
    u = new URL(s)
  } catch {
    return 'must be an absolute URL (https://host/path/file.ova)'
  }
  if (!(REMOTE_SCHEMES as readonly string[]).includes(u.protocol))
    return `scheme ${u.protocol.replace(/:$/, '')} is not supported: use https://, http://, s3://bucket/key or smb://server/share/file`
  if (u.username !== '' || u.password !== '')
    return 'must not carry credentials (user:password@); register them (POST /remote-credentials) and give credential_id'
  if (u.hostname === '') return u.protocol === 's3:' ? 'must name a bucket (s3://bucket/key)' : 'must name a host'
  if (u.protocol === 's3:' && (u.port !== '' || u.search !== '')) return 'an s3:// URL is s3://bucket/key (the server goes in s3.endpoint)'
  if (u.hash !== '') return 'must not have a #fragment'
  if (u.protocol === 'smb:') {
    if (u.search !== '') return 'an smb:// URL is smb://server[:port]/share/path/file, without a query'
    const parts = u.pathname.split('/').slice(1)
    if (parts.length < 2 || parts[0] === '') return 'must name a share and a file in it (smb://server/share/dir/file.ova)'
    if (parts.some((p) => /%5c|%00|\\/i.test(p))) return 'must not hold a backslash or NUL in a path segment'
  }
  if (u.pathname === '/' || u.pathname.endsWith('/')) return 'must name a file, not a folder'
  return null
}

/** `tls` of a remote input: trust by a CA (PEM), a pinned SHA-256 thumbprint, or insecure (`lib/tls.ts`). */
export const RemoteTls = SourceTlsSchema

/**
 * The `url` field: one file, without credentials: `http(s)://host/path`, `s3://bucket/key`, or
 * `smb://server[:port]/share/dir/file` (SMB 2, port default 445; `lib/remote/smb-object.ts`).
 */
export const RemoteUrl = z
  .string()
  .min(1)
  .max(4096)
  .superRefine((s, c) => {
    const why = remoteUrlProblem(s)
    if (why) c.addIssue({ code: 'custom', message: why })
  })

/** `s3` of an `s3://` input: the server (default Amazon S3 of the region) and the signature's region. */
export const RemoteS3 = z.strictObject({
  endpoint: z
    .string()
    .max(2048)
    .refine((s) => {
      try {
        const u = new URL(s)
        return (u.protocol === 'http:' || u.protocol === 'https:') && u.username === '' && u.password === '' && u.search === '' && u.hash === ''
      } catch {
        return false
      }
    }, 'must be an http(s) URL without credentials, query or fragment (https://s3.example.org)')
    .optional(),
  region: z
    .string()
    .regex(/^[a-z0-9-]{1,64}$/, 'must be a region name (us-east-1)')
    .optional(),
})

/** `source_ref` of kind `offline_url`. */
export const OfflineUrlRef = z.strictObject({
  kind: z.literal('offline_url'),
  url: RemoteUrl,
  s3: RemoteS3.optional(),
  credential_id: z
    .string()
    .regex(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i, 'must be a UUID')
    .optional(),
  tls: RemoteTls.optional(),
})
export type OfflineUrlRef = z.infer<typeof OfflineUrlRef>

/**
 * Body of `POST /remote-files/inspect`: the fields of an `offline_url` source_ref, and `kind`
 * (one of the importer kinds) to skip detection.
 */
export const RemoteInspectBody = z.strictObject({
  url: RemoteUrl,
  credential_id: z.uuid().optional(),
  tls: RemoteTls.optional(),
  s3: RemoteS3.optional(),
  kind: z.enum(IMPORTER_KINDS).optional(),
})
