/**
 * A client of the vSphere Web Services API (SOAP 1.1 over HTTPS, namespace `urn:vim25`), native
 * TypeScript over undici and fast-xml-parser (DESIGN.md section 7; VMware "vSphere Web Services
 * SDK Programming Guide": service content, login, property collector, tasks).
 *
 * - Login: `RetrieveServiceContent`, then `SessionManager.Login`; the `vmware_soap_session`
 *   cookie rides on every later request over a keep-alive connection pool. A call answered with
 *   a `NotAuthenticated` fault (login expired or terminated) logs in again once and is retried.
 * - TLS: trust by a CA (PEM), by a pinned SHA-256 certificate thumbprint (self-signed vCenter
 *   or ESXi), or an explicit insecure flag; otherwise the system trust store.
 * - Timeouts on connect and on every request; bounded retries with exponential backoff for
 *   transient failures (read-only calls on any network failure, every call when the connection
 *   was refused before anything was sent, HTTP 503).
 * - Errors: network, DNS, TLS, timeouts and non-SOAP answers are `E_MIG_SOURCE_UNREACHABLE`;
 *   `InvalidLogin` is `E_MIG_AUTH_FAILED`; every other SOAP fault is a {@link VimFault} for the
 *   caller to classify.
 * - Hostile answers are bounded: at most `maxResponseBytes` read, no DOCTYPE or entity
 *   declarations, at most 64 nested elements, no entity expansion beyond XML's five.
 *
 * Requests are built by hand with {@link x}: every parameter in the WSDL's schema order (the
 * server rejects or misreads parameters out of order).
 */
// The package file, not the bare 'undici' specifier: Bun substitutes a built-in shim for that
// specifier whose connector ignores `ca` and certificate pinning.
import { Agent, request } from 'undici/index.js'
import { XMLParser } from 'fast-xml-parser'
import { MigError } from '../../errors.ts'
import { sleep } from '../../retry.ts'
import type { SourceTls } from '../../contracts/source-tls.ts'
import { tlsConnector } from '../../tls.ts'
import { RangeHttp } from '../../http/range-http.ts'

/** A managed object reference: `type` (e.g. `VirtualMachine`) and `value` (e.g. `vm-42`). */
export interface MoRef {
  type: string
  value: string
}

/** A parsed XML node: a string for text-only elements, else an object of children (`@_attr`, `#text`). */
// biome-ignore lint/suspicious/noExplicitAny: fast-xml-parser output is untyped; the vim code narrows every use with txt/int/bool/arr
export type XNode = any

/** The `about` block of the service content (vSphere `AboutInfo`). */
export interface AboutInfo {
  name: string
  fullName: string
  version: string
  build: string
  apiType: string
  apiVersion: string
}

/** The managed objects of the service content the adapter uses. */
export interface ServiceContent {
  rootFolder: MoRef
  propertyCollector: MoRef
  viewManager: MoRef
  sessionManager: MoRef
  customFieldsManager: MoRef | null
  about: AboutInfo
}

/** Options of {@link VimClient}. Times in milliseconds, sizes in bytes. */
export interface VimClientOptions {
  /** `https://host[:port]/sdk`, already validated. */
  sdkUrl: string
  tls: SourceTls
  /** Per-request timeout (default 60 000). */
  timeoutMs?: number
  /** TCP + TLS connect timeout (default 10 000). */
  connectTimeoutMs?: number
  /** Retries of a transient failure (default 3), with backoff `retryBaseMs * 2^n` (default 250). */
  retries?: number
  retryBaseMs?: number
  /** Largest SOAP answer read (default 64 MiB). */
  maxResponseBytes?: number
}

/** A SOAP fault answered by the server: `faultType` is the vSphere fault (`InvalidLogin`, `NotAuthenticated`, ...). */
export class VimFault extends Error {
  constructor(
    readonly method: string,
    readonly faultType: string,
    readonly faultString: string,
    readonly detail: XNode,
  ) {
    super(`${method}: ${faultType}${faultString ? `: ${faultString}` : ''}`)
    this.name = 'VimFault'
  }
}

/** Escapes text for an XML element or attribute. */
export function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c]!)
}

/**
 * XML fragment builders for request bodies. Each returns a string; `undefined`/`null` values are
 * omitted (optional parameters), so call sites list parameters in schema order.
 */
export const x = {
  /** `<name>text</name>` (text escaped); omitted when `v` is undefined or null. */
  text(name: string, v: string | number | boolean | undefined | null): string {
    return v === undefined || v === null ? '' : `<${name}>${esc(String(v))}</${name}>`
  },
  /** `<name type="T">value</name>` for a managed object reference. */
  ref(name: string, r: MoRef | undefined | null): string {
    return r ? `<${name} type="${esc(r.type)}">${esc(r.value)}</${name}>` : ''
  },
  /** `<name xsi:type="T">children</name>`; `xsiType` optional. */
  node(name: string, children: string[], xsiType?: string): string {
    return `<${name}${xsiType ? ` xsi:type="${esc(xsiType)}"` : ''}>${children.join('')}</${name}>`
  },
  /** Repeats `<name>` for each item. */
  list(name: string, items: readonly (string | number)[]): string {
    return items.map((i) => `<${name}>${esc(String(i))}</${name}>`).join('')
  },
}

/** Always an array: `undefined` -> `[]`, a single node -> `[node]`. */
export function arr<T = XNode>(v: T | T[] | undefined | null): T[] {
  return v === undefined || v === null ? [] : Array.isArray(v) ? v : [v]
}

/** The text of a node (`#text` of an element with attributes, or the string itself). */
export function txt(v: XNode): string | undefined {
  if (v === undefined || v === null) return undefined
  if (typeof v === 'string') return v
  if (typeof v === 'number' || typeof v === 'boolean') return String(v)
  if (typeof v === 'object' && '#text' in v) return String(v['#text'])
  if (typeof v === 'object' && Object.keys(v).every((k) => k.startsWith('@_'))) return ''
  return undefined
}

/** A node as a managed object reference, or null. */
export function moref(v: XNode): MoRef | null {
  if (!v || typeof v !== 'object' || typeof v['@_type'] !== 'string') return null
  const value = txt(v)
  return value ? { type: v['@_type'], value } : null
}

/** The `xsi:type` of a node, or null. */
export function xsiType(v: XNode): string | null {
  return v && typeof v === 'object' && typeof v['@_xsi:type'] === 'string' ? v['@_xsi:type'].replace(/^[^:]+:/, '') : null
}

/** A node as an integer (bytes, keys), or null when absent or not a safe integer. */
export function int(v: XNode): number | null {
  const s = txt(v)
  if (s === undefined || !/^-?\d+$/.test(s.trim())) return null
  const n = Number(s)
  return Number.isSafeInteger(n) ? n : null
}

/** A node as a boolean, or null. */
export function bool(v: XNode): boolean | null {
  const s = txt(v)?.trim()
  return s === 'true' || s === '1' ? true : s === 'false' || s === '0' ? false : null
}

const READ_ONLY = new Set([
  'RetrieveServiceContent',
  'RetrievePropertiesEx',
  'ContinueRetrievePropertiesEx',
  'CancelRetrievePropertiesEx',
  'QueryChangedDiskAreas',
  'CurrentTime',
  'Login',
  'Logout',
  'CreateContainerView',
  'DestroyView',
])

/** Error codes of Node/undici that mean the request never reached the server. */
const NOT_SENT = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT'])

function errCode(e: unknown): string {
  let cur: unknown = e
  for (let i = 0; i < 5 && cur; i++) {
    const c = (cur as { code?: unknown }).code
    if (typeof c === 'string') return c
    cur = (cur as { cause?: unknown }).cause
  }
  return (e as Error)?.name ?? 'error'
}

function errText(e: unknown): string {
  const parts: string[] = []
  let cur: unknown = e
  for (let i = 0; i < 4 && cur; i++) {
    const m = (cur as Error).message
    if (m && !parts.includes(m)) parts.push(m)
    cur = (cur as { cause?: unknown }).cause
  }
  return parts.join(': ') || String(e)
}

const parser = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: '@_',
  parseTagValue: false,
  parseAttributeValue: false,
  trimValues: true,
  processEntities: true,
  htmlEntities: false,
  transformTagName: (t: string) => t.replace(/^[^:]+:/, ''),
  // Any prefixed `type` attribute is the XML Schema instance type (vCenter spells the prefix
  // `xsi`, others bind another prefix to the same namespace); the reference `type` is unprefixed.
  transformAttributeName: (a: string) => (/^(@_)?[^:]+:type$/.test(a) && !/^(@_)?xmlns/.test(a) ? '@_xsi:type' : a),
  maxNestedTags: 64,
})

/**
 * Parses a SOAP envelope and returns its `Body` node. Throws `E_MIG_SOURCE_UNREACHABLE` for a
 * DOCTYPE/ENTITY declaration, unparsable XML or no envelope (the peer is not a vSphere SDK).
 */
export function parseEnvelope(xml: string, what: string): XNode {
  if (/<!DOCTYPE|<!ENTITY/i.test(xml)) throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: the answer carries a DOCTYPE or entity declaration; refused`)
  let doc: XNode
  try {
    doc = parser.parse(xml)
  } catch (e) {
    throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: the answer is not well-formed XML: ${(e as Error).message}`.slice(0, 400), { cause: e })
  }
  const body = doc?.Envelope?.Body
  if (body === undefined || body === null || typeof body !== 'object')
    throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: the answer is not a SOAP envelope (is this a vSphere SDK endpoint?)`)
  return body
}

/**
 * A vSphere SOAP client bound to one endpoint. `connect()` then `login()`; `call()` for
 * everything else; `close()` logs out and releases the connection pool.
 */
export class VimClient {
  readonly sdkUrl: string
  private readonly agent: Agent
  /** The datastore HTTP transport: same origin and TLS trust, its own keep-alive pool (8 connections). */
  readonly ranges: RangeHttp
  private readonly timeoutMs: number
  private readonly retries: number
  private readonly retryBaseMs: number
  private readonly maxResponseBytes: number
  private cookie: string | null = null
  private credentials: { username: string; password: string } | null = null
  private content: ServiceContent | null = null
  private closed = false
  /** The key of the current login (vSphere's `UserSession.key`), set by {@link login}. */
  loginKey: string | null = null

  constructor(opts: VimClientOptions) {
    this.sdkUrl = opts.sdkUrl
    this.timeoutMs = opts.timeoutMs ?? 60_000
    this.retries = opts.retries ?? 3
    this.retryBaseMs = opts.retryBaseMs ?? 250
    this.maxResponseBytes = opts.maxResponseBytes ?? 64 * 1024 * 1024
    const connectTimeoutMs = opts.connectTimeoutMs ?? 10_000
    this.agent = new Agent({
      connect: tlsConnector(opts.tls, connectTimeoutMs),
      keepAliveTimeout: 30_000,
      headersTimeout: this.timeoutMs,
      bodyTimeout: this.timeoutMs,
      connections: 8,
    })
    this.ranges = new RangeHttp({ origin: new URL(opts.sdkUrl).origin, trust: opts.tls, connectTimeoutMs, connections: 8 })
  }

  /** The service content (after {@link connect}). */
  get serviceContent(): ServiceContent {
    if (!this.content) throw new MigError('E_MIG_INTERNAL', 'vim client: not connected')
    return this.content
  }

  /** The login cookie header value (`vmware_soap_session=...`), for datastore HTTP requests. */
  get loginCookie(): string | null {
    return this.cookie
  }

  /** `RetrieveServiceContent`. Throws `E_MIG_SOURCE_UNREACHABLE` when nothing (or no vSphere SDK) answers. */
  async connect(): Promise<ServiceContent> {
    const r = await this.invoke('RetrieveServiceContent', x.ref('_this', { type: 'ServiceInstance', value: 'ServiceInstance' }))
    const ref = (n: string) => {
      const m = moref(r[n])
      if (!m) throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${this.sdkUrl}: the service content has no ${n} (is this a vSphere SDK endpoint?)`)
      return m
    }
    const a = r.about ?? {}
    this.content = {
      rootFolder: ref('rootFolder'),
      propertyCollector: ref('propertyCollector'),
      viewManager: ref('viewManager'),
      sessionManager: ref('sessionManager'),
      customFieldsManager: moref(r.customFieldsManager),
      about: {
        name: txt(a.name) ?? 'VMware vSphere',
        fullName: txt(a.fullName) ?? txt(a.name) ?? 'VMware vSphere',
        version: txt(a.version) ?? '',
        build: txt(a.build) ?? '',
        apiType: txt(a.apiType) ?? '',
        apiVersion: txt(a.apiVersion) ?? '',
      },
    }
    return this.content
  }

  /**
   * `SessionManager.Login`; keeps the credentials for re-login on `NotAuthenticated`.
   * Throws `E_MIG_AUTH_FAILED` (`InvalidLogin`), `E_MIG_SOURCE_UNREACHABLE`.
   */
  async login(username: string, password: string): Promise<void> {
    this.credentials = { username, password }
    await this.doLogin()
  }

  private async doLogin(): Promise<void> {
    const { username, password } = this.credentials!
    this.cookie = null
    try {
      const r = await this.invoke('Login', x.ref('_this', this.serviceContent.sessionManager) + x.text('userName', username) + x.text('password', password))
      this.loginKey = txt(r?.key) ?? null
    } catch (e) {
      if (e instanceof VimFault && (e.faultType === 'InvalidLogin' || e.faultType === 'NoPermission' || e.faultType === 'InvalidLocale')) {
        throw new MigError('E_MIG_AUTH_FAILED', `${this.sdkUrl}: login of ${username} rejected (${e.faultType})`, { details: { endpoint: this.sdkUrl } })
      }
      throw e
    }
    if (!this.cookie) throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${this.sdkUrl}: login answered without a login cookie`)
  }

  /**
   * Calls `method` with the parameter XML `params` (starting with `_this`, in schema order) and
   * returns the `returnval` node (undefined for void methods). A `NotAuthenticated` fault after a
   * login triggers one re-login and retry. Throws {@link VimFault} for other faults,
   * `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_AUTH_FAILED` (re-login refused).
   */
  async call(method: string, params: string): Promise<XNode> {
    try {
      return await this.invoke(method, params)
    } catch (e) {
      if (e instanceof VimFault && e.faultType === 'NotAuthenticated' && this.credentials && !this.closed) {
        await this.doLogin()
        return await this.invoke(method, params)
      }
      throw e
    }
  }

  /** Logs out (best effort) and closes the pool; never throws; idempotent. */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    if (this.cookie && this.content) {
      await this.invoke('Logout', x.ref('_this', this.content.sessionManager), { retries: 0, timeoutMs: 5000 }).catch(() => {})
    }
    this.ranges.close()
    await this.agent.close().catch(() => {})
  }

  private async invoke(method: string, params: string, o: { retries?: number; timeoutMs?: number } = {}): Promise<XNode> {
    const envelope =
      '<?xml version="1.0" encoding="UTF-8"?>' +
      '<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">' +
      `<soapenv:Body><${method} xmlns="urn:vim25">${params}</${method}></soapenv:Body></soapenv:Envelope>`
    const retries = o.retries ?? this.retries
    for (let attempt = 0; ; attempt++) {
      let status: number
      let text: string
      try {
        ;({ status, text } = await this.post(envelope, method, o.timeoutMs ?? this.timeoutMs))
      } catch (e) {
        if (e instanceof MigError) throw e
        const code = errCode(e)
        const transient =
          NOT_SENT.has(code) && code !== 'ENOTFOUND' ? true : READ_ONLY.has(method) && !/CERT|TLS|SSL|THUMBPRINT/i.test(code) && code !== 'ENOTFOUND'
        if (transient && attempt < retries && !this.closed) {
          await sleep(this.retryBaseMs * 2 ** attempt)
          continue
        }
        throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${this.sdkUrl}: ${method}: ${code}: ${errText(e)}`.slice(0, 500), {
          cause: e,
          details: { endpoint: this.sdkUrl, code },
        })
      }
      if (status === 503 && attempt < retries && !this.closed) {
        await sleep(this.retryBaseMs * 2 ** attempt)
        continue
      }
      const what = `${this.sdkUrl}: ${method}`
      if (status !== 200 && status !== 500)
        throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: HTTP ${status} (is this a vSphere SDK endpoint?)`, {
          details: { endpoint: this.sdkUrl, status },
        })
      const body = parseEnvelope(text, what)
      if (body.Fault !== undefined) {
        const f = body.Fault
        const detail = f.detail && typeof f.detail === 'object' ? f.detail : {}
        const key = Object.keys(detail).find((k) => !k.startsWith('@_') && k !== '#text')
        const node = key ? detail[key] : undefined
        const type = xsiType(node) ?? (key ? key.replace(/Fault$/, '') : 'SystemError')
        throw new VimFault(method, type, (txt(f.faultstring) ?? '').slice(0, 500), node ?? null)
      }
      if (status !== 200) throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: HTTP ${status} without a SOAP fault`)
      const resp = body[`${method}Response`]
      if (resp === undefined) throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${what}: the answer has no ${method}Response`)
      return typeof resp === 'object' ? resp.returnval : undefined
    }
  }

  private async post(envelope: string, method: string, timeoutMs: number): Promise<{ status: number; text: string }> {
    const headers: Record<string, string> = { 'content-type': 'text/xml; charset=utf-8', soapaction: 'urn:vim25/6.5', accept: 'text/xml' }
    if (this.cookie) headers.cookie = this.cookie
    const res = await request(this.sdkUrl, { method: 'POST', body: envelope, headers, dispatcher: this.agent, signal: AbortSignal.timeout(timeoutMs) })
    const setCookie = res.headers['set-cookie']
    for (const c of arr(setCookie as string | string[] | undefined)) {
      const m = /^\s*(vmware_soap_session=[^;]*)/.exec(c)
      if (m) this.cookie = m[1]
    }
    const chunks: Buffer[] = []
    let total = 0
    for await (const chunk of res.body) {
      total += (chunk as Buffer).length
      if (total > this.maxResponseBytes) {
        res.body.destroy()
        throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${this.sdkUrl}: ${method}: the answer exceeds ${this.maxResponseBytes} bytes; refused`)
      }
      chunks.push(chunk as Buffer)
    }
    return { status: res.statusCode, text: Buffer.concat(chunks).toString('utf8') }
  }
}

/**
 * The SDK URL of a `vim_api` endpoint: `https://host[:port][/sdk]` or a bare `host[:port]`
 * (port 443 by default) -> `https://host[:port]/sdk`. Throws `E_MIG_BAD_REQUEST` for another
 * scheme (vCenter and ESXi serve the SDK over https only), credentials in the URL, a path other
 * than `/` or `/sdk`, a query or fragment, or a port outside 1-65535.
 */
export function vimSdkUrl(endpoint: string): string {
  const raw = endpoint.trim()
  let u: URL
  try {
    u = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(raw) ? raw : `https://${raw}`)
  } catch {
    throw new MigError('E_MIG_BAD_REQUEST', `vim_api endpoint ${JSON.stringify(endpoint)} is not a URL or host[:port]`)
  }
  if (u.protocol !== 'https:')
    throw new MigError('E_MIG_BAD_REQUEST', `vim_api endpoint ${JSON.stringify(endpoint)}: vCenter and ESXi serve the SDK over https only`)
  if (u.username || u.password) throw new MigError('E_MIG_BAD_REQUEST', `vim_api endpoint must not carry credentials`)
  if (!u.hostname) throw new MigError('E_MIG_BAD_REQUEST', `vim_api endpoint ${JSON.stringify(endpoint)} has no host`)
  if (u.search || u.hash) throw new MigError('E_MIG_BAD_REQUEST', `vim_api endpoint ${JSON.stringify(endpoint)} must not have a query or fragment`)
  const p = u.pathname.replace(/\/+$/, '')
  if (p !== '' && p !== '/sdk') throw new MigError('E_MIG_BAD_REQUEST', `vim_api endpoint ${JSON.stringify(endpoint)}: the SDK path is /sdk, not ${u.pathname}`)
  const port = u.port === '' ? 443 : Number(u.port)
  if (!Number.isInteger(port) || port < 1 || port > 65535)
    throw new MigError('E_MIG_BAD_REQUEST', `vim_api endpoint ${JSON.stringify(endpoint)}: port out of range`)
  return `https://${u.host}/sdk`
}
