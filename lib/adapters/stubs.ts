/**
 * The four live adapter stubs of spec 1.1: `wmi_api` (Hyper-V over WinRM/WMI), `pve_api`
 * (Proxmox VE REST API), `xen_api` (XenServer/XCP-ng XAPI) and `prism_api` (Nutanix Prism). Each validates the endpoint on connect with the rules of its
 * product (scheme, default port, API path), then checks that something accepts a TCP connection
 * there; it has no control-plane client, so listing and inspecting fail with `E_MIG_INTERNAL`,
 * every data-plane method fails with `E_MIG_INTERNAL` (snapshots with `E_MIG_SNAPSHOT_FAILED`),
 * and `supportsWarm()` is false (a warm plan is downgraded, spec 1.4).
 */
import { connect as tcpConnect } from 'node:net'
import { MigError } from '../errors.ts'
import type { AdapterKind } from '../kinds.ts'
import type { LiveSession, SourceAdapter, SourceConnection } from './types.ts'

/** The kinds served by stubs. */
export const STUB_KINDS = ['wmi_api', 'pve_api', 'xen_api', 'prism_api'] as const
export type StubKind = (typeof STUB_KINDS)[number]

/** A validated endpoint: the normalized URL and the TCP address a probe connects to. */
export interface StubEndpoint {
  url: string
  host: string
  port: number
}

interface Rules {
  product: string
  /** Allowed schemes -> default port. The first is used for a bare `host[:port]`. */
  schemes: Record<string, number>
  /** Allowed paths ('' is no path); the first non-empty one is the canonical path. */
  paths: string[]
}

const RULES: Record<StubKind, Rules> = {
  wmi_api: { product: 'Microsoft Hyper-V (WinRM/WMI)', schemes: { https: 5986, http: 5985 }, paths: ['/wsman', ''] },
  pve_api: { product: 'Proxmox VE', schemes: { https: 8006 }, paths: ['/api2/json', ''] },
  xen_api: { product: 'XenServer/XCP-ng XAPI', schemes: { https: 443, http: 80 }, paths: ['/', ''] },
  prism_api: { product: 'Nutanix Prism', schemes: { https: 9440 }, paths: ['/api/nutanix/v3', '/PrismGateway/services/rest/v2.0', ''] },
}

const HOST = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*)$/

/**
 * Validates `endpoint` for `kind`: a URL with one of the product's schemes, a host, an optional
 * port 1-65535, one of its API paths, no credentials, no query
 * (except none) or fragment; or a bare `host[:port]` (the product's first scheme and default
 * port). Returns the normalized URL. Throws `E_MIG_BAD_REQUEST` naming the rule broken.
 */
export function validateStubEndpoint(kind: StubKind, endpoint: string): StubEndpoint {
  const r = RULES[kind]
  const bad = (why: string) => new MigError('E_MIG_BAD_REQUEST', `${kind} endpoint ${JSON.stringify(endpoint.slice(0, 200))}: ${why}`, { details: { kind } })
  const raw = endpoint.trim()
  if (raw === '' || raw.length > 2048) throw bad('empty or too long')
  const schemes = Object.keys(r.schemes)
  const m = /^([a-z][a-z0-9+.-]*):\/\/(.*)$/i.exec(raw)
  let scheme: string
  let rest: string
  if (m) {
    scheme = m[1].toLowerCase()
    rest = m[2]
    if (!(scheme in r.schemes)) throw bad(`scheme must be one of ${schemes.join(', ')}`)
  } else {
    scheme = schemes[0]
    rest = raw
    if (/[/?#@]/.test(rest)) throw bad('a bare endpoint is host[:port]')
  }
  if (/[?#]/.test(rest)) throw bad('no query or fragment')
  const slash = rest.indexOf('/')
  let authority = slash < 0 ? rest : rest.slice(0, slash)
  const rawPath = slash < 0 ? '' : rest.slice(slash)
  const path = rawPath === '' || /^\/+$/.test(rawPath) ? (rawPath === '' ? '' : '/') : rawPath.replace(/\/+$/, '')
  const at = authority.lastIndexOf('@')
  let user = ''
  if (at >= 0) {
    user = authority.slice(0, at)
    authority = authority.slice(at + 1)
    if (!scheme.includes('ssh')) throw bad('credentials belong in the username/password fields, not the endpoint')
    if (!/^[A-Za-z0-9._-]{1,64}$/.test(user)) throw bad('invalid SSH user name')
  }
  const hp = /^(\[[^\]]+\]|[^:]+)(?::(\d{1,5}))?$/.exec(authority)
  if (!hp || !HOST.test(hp[1])) throw bad('invalid host')
  const port = hp[2] === undefined ? r.schemes[scheme] : Number(hp[2])
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw bad('port must be 1-65535')
  const normPath = path === '/' && !r.paths.includes('/') ? '' : path
  if (!(normPath === '' && !m) && !r.paths.includes(normPath))
    throw bad(`path must be ${r.paths.filter((p) => p !== '').join(' or ')}${r.paths.includes('') ? ' or empty' : ''}`)
  const canonical = normPath === '' ? (r.paths.find((p) => p !== '') ?? '') : normPath
  const host = hp[1].replace(/^\[|\]$/g, '')
  return { url: `${scheme}://${user ? `${user}@` : ''}${hp[1]}:${port}${canonical}`, host, port }
}

/** Resolves when a TCP connection to `host:port` opens within `timeoutMs`; `E_MIG_SOURCE_UNREACHABLE` otherwise. */
export function probeTcp(host: string, port: number, label: string, timeoutMs = 5000): Promise<void> {
  return new Promise((resolve, reject) => {
    const s = tcpConnect({ host, port })
    const fail = (why: string) => {
      s.destroy()
      reject(new MigError('E_MIG_SOURCE_UNREACHABLE', `${label}: ${why}`, { details: { endpoint: label } }))
    }
    s.setTimeout(timeoutMs, () => fail(`no answer within ${Math.round(timeoutMs / 1000)} s`))
    s.once('error', (e) => fail((e as NodeJS.ErrnoException).code ?? e.message))
    s.once('connect', () => {
      s.destroy()
      resolve()
    })
  })
}

function stubSession(kind: StubKind, ep: StubEndpoint): LiveSession {
  const r = RULES[kind]
  const internal = (what: string) =>
    Promise.reject(new MigError('E_MIG_INTERNAL', `${kind}: ${what} is not implemented by the ${r.product} stub adapter (spec 1.1: v0.1 ships only vim_api)`))
  return {
    supportsWarm: () => false,
    describe: async () => ({ product: `${r.product} at ${ep.url} (stub adapter: no control-plane client in this build)`, version: null }),
    listVms: () => internal('listing VMs'),
    inspect: () => internal('inspecting a VM'),
    close: async () => {},
    enableCbt: () => internal('enabling changed block tracking'),
    createSnapshot: () => Promise.reject(new MigError('E_MIG_SNAPSHOT_FAILED', `${kind}: the ${r.product} stub adapter cannot take snapshots`)),
    openDisk: () => internal('reading a disk'),
    changedAreas: () => internal('querying changed areas'),
    removeSnapshot: () => internal('removing a snapshot'),
    shutdown: () => internal('shutting a VM down'),
    powerOn: () => internal('powering a VM on'),
    mark: () => internal('marking a VM'),
    cleanup: async () => {},
  }
}

/**
 * The stub adapter of `kind`. `connect`: `E_MIG_BAD_REQUEST` for an endpoint its product cannot
 * have, `E_MIG_SOURCE_UNREACHABLE` when nothing accepts a TCP connection there (5 s), else a
 * connection whose control-plane listing/inspection and data plane fail as described above.
 */
export function stubAdapter(kind: StubKind, opts: { probeTimeoutMs?: number } = {}): SourceAdapter {
  return {
    kind: kind as AdapterKind,
    supportsWarm: () => false,
    async connect(conn: SourceConnection) {
      const ep = validateStubEndpoint(kind, conn.endpoint)
      await probeTcp(ep.host, ep.port, `${kind} ${ep.url}`, opts.probeTimeoutMs ?? 5000)
      return stubSession(kind, ep)
    },
  }
}
