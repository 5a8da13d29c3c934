/**
 * Registration of live sources (spec 2.2; request shape of DESIGN.md section 3).
 */
import { z } from 'zod'
import { validateStubEndpoint, type StubKind } from './adapters/stubs.ts'
import { knownHostsProblem, parseLibvirtEndpoint, privateKeyProblem } from './adapters/libvirt/uri.ts'
import { SourceTlsSchema, type SourceTls } from './contracts/source-tls.ts'
import { vimSdkUrl } from './adapters/vim/soap.ts'
import { ADAPTER_KINDS, type AdapterKind } from './kinds.ts'
import { MigError, isMigError } from './errors.ts'
import { issuesOf } from './plan.ts'

/**
 * An endpoint's general shape: an `http(s)://` URL without credentials, a libvirt URI
 * (`qemu+ssh://[user@]host[:port]/system`), or a bare `host[:port]`. The rules of its kind are
 * checked after (see {@link parseSourceInput}).
 */
const endpoint = z
  .string()
  .min(1)
  .max(2048)
  .refine((s) => {
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(s)) {
      try {
        const u = new URL(s)
        if (/^qemu(\+[a-z0-9]+)?:$/.test(u.protocol)) return u.hostname !== '' && u.password === ''
        return (u.protocol === 'https:' || u.protocol === 'http:') && u.hostname !== '' && u.username === '' && u.password === ''
      } catch {
        return false
      }
    }
    return /^(\[[0-9a-f:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$/.test(s)
  }, 'must be an http(s) URL without credentials, a libvirt qemu+<transport>:// URI, or host[:port]')

/** Checks `endpoint` with the rules of its adapter kind; the reason it breaks them, or null. */
function kindEndpointProblem(kind: AdapterKind, endpoint: string): string | null {
  try {
    if (kind === 'vim_api') vimSdkUrl(endpoint)
    else if (kind === 'libvirt_remote') parseLibvirtEndpoint(endpoint)
    else validateStubEndpoint(kind as StubKind, endpoint)
    return null
  } catch (e) {
    if (isMigError(e)) return e.message
    throw e
  }
}

/**
 * Body of `POST /sources`. The secret (`password`, or for `libvirt_remote` the `private_key`) is
 * sealed before it is stored and never returned. `libvirt_remote` (docs/libvirt-source.md):
 * `private_key` (OpenSSH/PEM, no passphrase) instead of a password; over `qemu+ssh` the host's
 * `known_hosts` line(s) unless `tls.insecure`; over `qemu+tls` `tls.ca_pem` and `client_cert`.
 */
export const SourceInput = z.strictObject({
  name: z
    .string()
    .min(1)
    .max(128)
    .regex(/^[^\x00-\x1f]+$/, 'must not contain control characters'),
  kind: z.enum(ADAPTER_KINDS),
  endpoint,
  username: z.string().min(1).max(256),
  password: z.string().min(1).max(4096).optional(),
  private_key: z.string().min(1).max(65536).optional(),
  known_hosts: z.string().min(1).max(65536).optional(),
  client_cert: z
    .string()
    .max(65536)
    .regex(/-----BEGIN CERTIFICATE-----/, 'must be a PEM certificate')
    .optional(),
  tls: SourceTlsSchema.optional(),
})
export type SourceInput = z.infer<typeof SourceInput>

/** A validated source: the secret to seal and the TLS/SSH settings to store. */
export interface ParsedSource {
  name: string
  kind: AdapterKind
  endpoint: string
  username: string
  /** The secret sealed in the store: the password, or the private key. */
  secret: string
  tls: SourceTls
}

/** The problems of a body's credential fields for its kind, as `{path, message}` issues. */
function credentialIssues(d: SourceInput): { path: string; message: string }[] {
  const issues: { path: string; message: string }[] = []
  if (d.kind !== 'libvirt_remote') {
    if (d.password === undefined) issues.push({ path: 'password', message: 'required' })
    for (const f of ['private_key', 'known_hosts', 'client_cert'] as const)
      if (d[f] !== undefined) issues.push({ path: f, message: `only for kind libvirt_remote` })
    return issues
  }
  let transport: 'ssh' | 'tls' | null = null
  try {
    const ep = parseLibvirtEndpoint(d.endpoint)
    transport = ep.transport
    if (ep.user && ep.user !== d.username)
      issues.push({ path: 'username', message: `must be the endpoint's user ${ep.user} (or leave the user out of the endpoint)` })
  } catch {
    // the endpoint's own issue is reported by the caller
  }
  if (d.password !== undefined) issues.push({ path: 'password', message: 'libvirt_remote authenticates with private_key, not a password' })
  if (d.private_key === undefined)
    issues.push({ path: 'private_key', message: 'required (the OpenSSH private key the host authorizes, or the TLS client key)' })
  else {
    const p = privateKeyProblem(d.private_key)
    if (p) issues.push({ path: 'private_key', message: p })
  }
  if (d.tls?.thumbprint) issues.push({ path: 'tls.thumbprint', message: 'not used by libvirt_remote (pin the SSH host key with known_hosts)' })
  if (transport === 'ssh') {
    if (d.client_cert !== undefined) issues.push({ path: 'client_cert', message: 'only for qemu+tls endpoints' })
    if (d.known_hosts === undefined && d.tls?.insecure !== true)
      issues.push({
        path: 'known_hosts',
        message: 'required: the host key line(s) as `ssh-keyscan -p PORT HOST` prints them (or tls.insecure: true to skip the check)',
      })
    else if (d.known_hosts !== undefined) {
      const p = knownHostsProblem(d.known_hosts)
      if (p) issues.push({ path: 'known_hosts', message: p })
    }
  } else if (transport === 'tls') {
    if (d.known_hosts !== undefined) issues.push({ path: 'known_hosts', message: 'only for qemu+ssh endpoints' })
    if (d.client_cert === undefined) issues.push({ path: 'client_cert', message: 'required for qemu+tls (PEM client certificate)' })
    if (!d.tls?.ca_pem && d.tls?.insecure !== true) issues.push({ path: 'tls.ca_pem', message: "required for qemu+tls (the CA of the host's certificate)" })
  }
  return issues
}

/**
 * Validates a `POST /sources` body, the endpoint by the rules of its kind too (vim_api: https and
 * `/sdk`; libvirt_remote: qemu+ssh or qemu+tls URIs and their credential fields; the stubs: their
 * product's schemes, ports and paths); `E_MIG_BAD_REQUEST` with `details.issues` naming each
 * field (never echoing a secret).
 */
export function parseSourceInput(body: unknown): ParsedSource {
  const r = SourceInput.safeParse(body)
  const fail = (issues: { path: string; message: string }[]) =>
    new MigError('E_MIG_BAD_REQUEST', `invalid source: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`, { details: { issues } })
  if (!r.success) throw fail(issuesOf(r.error))
  const problem = kindEndpointProblem(r.data.kind, r.data.endpoint)
  const issues = [...(problem ? [{ path: 'endpoint', message: problem }] : []), ...credentialIssues(r.data)]
  if (issues.length > 0) throw fail(issues)
  const d = r.data
  return {
    name: d.name,
    kind: d.kind,
    endpoint: d.endpoint,
    username: d.username,
    secret: d.kind === 'libvirt_remote' ? d.private_key! : d.password!,
    tls: {
      ...(d.tls ?? {}),
      ...(d.known_hosts !== undefined ? { known_hosts: d.known_hosts } : {}),
      ...(d.client_cert !== undefined ? { client_cert_pem: d.client_cert } : {}),
    },
  }
}
