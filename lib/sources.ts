/**
 * Registration of live sources (spec 2.2; request shape of DESIGN.md section 3).
 */
import { z } from 'zod'
import { validateStubEndpoint } from './adapters/stubs.ts'
import { SourceTlsSchema } from './contracts/source-tls.ts'
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
    else validateStubEndpoint(kind, endpoint)
    return null
  } catch (e) {
    if (isMigError(e)) return e.message
    throw e
  }
}

/** Body of `POST /sources`. The password is sealed before it is stored and never returned. */
export const SourceInput = z.strictObject({
  name: z
    .string()
    .min(1)
    .max(128)
    .regex(/^[^\x00-\x1f]+$/, 'must not contain control characters'),
  kind: z.enum(ADAPTER_KINDS),
  endpoint,
  username: z.string().min(1).max(256),
  password: z.string().min(1).max(4096),
  tls: SourceTlsSchema.optional(),
})
export type SourceInput = z.infer<typeof SourceInput>

/**
 * Validates a `POST /sources` body, the endpoint by the rules of its kind too (vim_api: https and
 * `/sdk`; the stubs: their product's schemes, ports and paths); `E_MIG_BAD_REQUEST` with
 * `details.issues` (never echoing the password).
 */
export function parseSourceInput(body: unknown): SourceInput {
  const r = SourceInput.safeParse(body)
  if (!r.success) {
    const issues = issuesOf(r.error)
    throw new MigError('E_MIG_BAD_REQUEST', `invalid source: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`, { details: { issues } })
  }
  const problem = kindEndpointProblem(r.data.kind, r.data.endpoint)
  if (problem)
    throw new MigError('E_MIG_BAD_REQUEST', `invalid source: endpoint: ${problem}`, { details: { issues: [{ path: 'endpoint', message: problem }] } })
  return r.data
}
