/**
 * An object on an HTTP(S) server read in place as a {@link RemoteFile} (roadmap v0.3 "HTTP
 * remote offline inputs"; RFC 9110 section 14 range requests, section 13 preconditions).
 *
 * Open: one `GET` with `Range: bytes=0-65535` (RFC 9110 14.2). A `206` answer gives the size
 * (`Content-Range: bytes 0-N/<size>`) and the object's identity: its strong `ETag`, else its
 * `Last-Modified`. Every later read is a ranged `GET` with `If-Match: <etag>` (else
 * `If-Unmodified-Since`), and the answer must be `206` with exactly the `Content-Range` asked,
 * the same `ETag`/`Last-Modified` and the size of the open: an object replaced between two reads
 * is `E_MIG_DISK_READ_FAILED` (`412`, or a changed validator or size), never a disk mixed of two
 * versions. A read larger than {@link HttpObjectOptions.pieceBytes} is cut into pieces fetched at
 * once over the connection pool (several ranges in flight, not one round trip per block).
 *
 * A server that answers `200` to the ranged open (ranges disabled, nginx `max_ranges 0`) is read
 * once front to back into memory when the object is at most `wholeObjectLimit` bytes; a larger
 * one is `E_MIG_UNSUPPORTED_FORMAT` (random access is needed and nothing is staged on the host).
 *
 * Failures: DNS, refused or unreachable host, TLS trust -> `E_MIG_SOURCE_UNREACHABLE` naming the
 * cause; `401`/`403` -> `E_MIG_AUTH_FAILED`; `404`/`410` -> `E_MIG_NOT_FOUND` naming the URL; a
 * redirect -> `E_MIG_NOT_FOUND` naming its `Location` (not followed: credentials would follow).
 * A connection cut or a `5xx` during a read is retried with exponential backoff `retries` times,
 * then `E_MIG_DISK_READ_FAILED` with the offset reached (`details.offset`).
 */
import type { RemoteFile } from '../contracts/remote-file.ts'
import { MigError, type ErrorCode } from '../errors.ts'
import { retry, sleep } from '../retry.ts'
import { RangeHttp, type RangeAnswer, type RangeGetOptions } from '../http/range-http.ts'
import type { TlsTrust } from '../tls.ts'

/** HTTP authentication: `basic` (RFC 7617) or `bearer` (RFC 6750). */
export type HttpAuth = { kind: 'basic'; username: string; password: string } | { kind: 'bearer'; token: string }

/** Options of {@link openHttpObject}; times in milliseconds, sizes in bytes. */
export interface HttpObjectOptions {
  trust?: TlsTrust
  auth?: HttpAuth | null
  /** TCP + TLS connect timeout (default 10 s). */
  connectTimeoutMs?: number
  /** Bound of one request, head and body (default 120 s). */
  requestTimeoutMs?: number
  /** Connections of the pool (default 4): ranges in flight at once. */
  connections?: number
  /** Retries of one range after a transport failure or a 5xx (default 5). */
  retries?: number
  /** First backoff; doubled at every retry (default 250 ms). */
  retryBaseMs?: number
  /** Largest range of one request (default 4 MiB). */
  pieceBytes?: number
  /** Largest object read whole into memory from a server without ranges (default 256 MiB). */
  wholeObjectLimit?: number
  /** How messages and the scope name the object (default the URL): an `s3://bucket/key`. */
  name?: string
  /**
   * Signs each request (S3 SigV4, `lib/remote/s3-object.ts`): the header fields to send for a
   * `GET` of the URL with `headers`; called for every request, retries included.
   */
  sign?: (url: string, headers: Record<string, string>) => Promise<Record<string, string>>
}

/** Bytes asked by the open's ranged GET. */
const PROBE_BYTES = 64 * 1024

const UNREACHABLE = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT', 'ECONNRESET', 'EPIPE'])
const DNS = new Set(['ENOTFOUND', 'EAI_AGAIN', 'EAI_NONAME', 'EAI_FAIL'])

function errCode(e: unknown): string {
  return String((e as { code?: unknown }).code ?? '')
}

/** A failure of the transport (no answer), as the error the caller sees. */
function transportError(name: string, e: unknown, host: string): MigError {
  if (e instanceof MigError) return e
  const code = errCode(e)
  const msg = (e as Error).message
  if (DNS.has(code))
    return new MigError('E_MIG_SOURCE_UNREACHABLE', `${name}: cannot resolve ${host} (DNS, ${code})`, { cause: e, details: { url: name, code } })
  if (/CERT|TLS|SSL|THUMBPRINT|SELF_SIGNED|UNABLE_TO/i.test(code))
    return new MigError(
      'E_MIG_SOURCE_UNREACHABLE',
      `${name}: TLS: the server's certificate is not trusted (${code}: ${msg}); give source_ref.tls.ca_pem or tls.thumbprint`,
      { cause: e, details: { url: name, code } },
    )
  if (UNREACHABLE.has(code))
    return new MigError('E_MIG_SOURCE_UNREACHABLE', `${name}: ${host} unreachable (${code})`, { cause: e, details: { url: name, code } })
  return new MigError('E_MIG_SOURCE_UNREACHABLE', `${name}: ${msg}`, { cause: e, details: { url: name, code: code || null } })
}

/** The error of an answer that is not a success; null for 2xx and 5xx (the caller decides). */
function statusError(name: string, a: RangeAnswer): MigError | null {
  const s = a.status
  const at = (code: ErrorCode, why: string) => new MigError(code, `${name}: ${why}`, { details: { url: name, status: s } })
  if (s === 401 || s === 403) return at('E_MIG_AUTH_FAILED', `HTTP ${s}: the server refused the credentials${s === 401 ? ' (none given, or wrong)' : ''}`)
  if (s === 404 || s === 410) return at('E_MIG_NOT_FOUND', `HTTP ${s}: no such object on the server`)
  if (s >= 300 && s < 400)
    return at('E_MIG_NOT_FOUND', `HTTP ${s}: redirected to ${a.headers.location ?? '(no Location)'}; give that URL (redirects are not followed)`)
  if (s >= 400 && s < 500 && s !== 412 && s !== 416) return at('E_MIG_DISK_READ_FAILED', `HTTP ${s}`)
  return null
}

/** `bytes a-b/size` of a `Content-Range` header, or null. */
function parseContentRange(v: string | undefined): { first: number; last: number; size: number | null } | null {
  const m = /^bytes (\d{1,15})-(\d{1,15})\/(\d{1,15}|\*)$/.exec((v ?? '').trim())
  if (!m) return null
  return { first: Number(m[1]), last: Number(m[2]), size: m[3] === '*' ? null : Number(m[3]) }
}

/**
 * Opens the object at `url` (http or https, no credentials in it). Throws as described in the
 * module comment; `E_MIG_UNSUPPORTED_FORMAT` for a server without ranges and a larger object than
 * `wholeObjectLimit`, or an answer without a size.
 */
export async function openHttpObject(url: string, opts: HttpObjectOptions = {}): Promise<RemoteFile> {
  const u = new URL(url)
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new MigError('E_MIG_INVALID_PLAN', `${url}: not an http(s) URL`)
  const pool = new RangeHttp({
    origin: u.origin,
    trust: opts.trust ?? {},
    connectTimeoutMs: opts.connectTimeoutMs ?? 10_000,
    connections: opts.connections ?? 4,
  })
  try {
    return await HttpObject.open(pool, u, opts)
  } catch (e) {
    pool.close()
    throw e
  }
}

/** `pool.get` with the request signed when `opts.sign` is set. */
async function signedGet(
  pool: RangeHttp,
  origin: string,
  path: string,
  headers: Record<string, string>,
  o: RangeGetOptions,
  opts: HttpObjectOptions,
): Promise<RangeAnswer> {
  return pool.get(path, opts.sign ? await opts.sign(`${origin}${path}`, headers) : headers, o)
}

class HttpObject implements RemoteFile {
  private closed = false

  private constructor(
    private readonly pool: RangeHttp,
    private readonly origin: string,
    private readonly path: string,
    readonly name: string,
    readonly size: number,
    private readonly validators: { etag: string | null; lastModified: string | null },
    private readonly head: Buffer,
    private readonly opts: HttpObjectOptions,
    private readonly auth: Record<string, string>,
  ) {}

  static async open(pool: RangeHttp, u: URL, opts: HttpObjectOptions): Promise<RemoteFile> {
    const name = opts.name ?? u.href
    const path = `${u.pathname}${u.search}`
    const auth: Record<string, string> = {}
    if (opts.auth?.kind === 'basic') auth.authorization = `Basic ${Buffer.from(`${opts.auth.username}:${opts.auth.password}`).toString('base64')}`
    else if (opts.auth?.kind === 'bearer') auth.authorization = `Bearer ${opts.auth.token}`
    const timeoutMs = opts.requestTimeoutMs ?? 120_000
    // transport failures: `retries` more tries, the waits doubling from `retryBaseMs`
    const backoff = { attempts: (opts.retries ?? 5) + 1, delayMs: (n: number) => (opts.retryBaseMs ?? 250) * 2 ** n }
    let a: RangeAnswer
    try {
      a = await retry(
        () => pool.get(path, { ...auth, range: `bytes=0-${PROBE_BYTES - 1}`, 'accept-encoding': 'identity' }, { max: PROBE_BYTES, timeoutMs, partial: true }),
        {
          ...backoff,
          // a refused connection, DNS or TLS failure is the answer; a reset may pass
          shouldRetry: (e) => {
            const code = errCode(e)
            return !(e instanceof MigError || DNS.has(code) || code === 'ECONNREFUSED' || /CERT|TLS|SSL|THUMBPRINT|SELF_SIGNED|UNABLE_TO/i.test(code))
          },
        },
      )
    } catch (e) {
      throw transportError(name, e, u.host)
    }
    const refused = statusError(name, a)
    if (refused) throw refused
    if (a.status >= 500)
      throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${name}: HTTP ${a.status} from the server`, { details: { url: name, status: a.status } })
    if (a.headers['content-encoding'] && a.headers['content-encoding'] !== 'identity')
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${name}: the server sends it with Content-Encoding ${a.headers['content-encoding']}; serve it unencoded`)
    const etag = a.headers.etag && !a.headers.etag.startsWith('W/') ? a.headers.etag : null
    const validators = { etag, lastModified: etag ? null : (a.headers['last-modified'] ?? null) }
    if (a.status === 416) {
      // RFC 9110 15.5.17: no byte of the range exists: an empty object
      const cr = /^bytes \*\/(\d{1,15})$/.exec(a.headers['content-range'] ?? '')
      return new HttpObject(pool, u.origin, path, name, cr ? Number(cr[1]) : 0, validators, Buffer.alloc(0), opts, auth)
    }
    if (a.status === 206) {
      const cr = parseContentRange(a.headers['content-range'])
      if (cr?.first !== 0 || cr.size === null || cr.last !== a.body.length - 1)
        throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: a 206 answer without a usable Content-Range (${a.headers['content-range'] ?? 'none'})`)
      return new HttpObject(pool, u.origin, path, name, cr.size, validators, Buffer.from(a.body), opts, auth)
    }
    // 200: the server ignores ranges; its Content-Length is the object's size
    const cl = a.headers['content-length']
    if (cl === undefined || !/^\d{1,15}$/.test(cl))
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${name}: the server neither serves ranges nor says the object's size`)
    const size = Number(cl)
    const limit = opts.wholeObjectLimit ?? 256 * 1024 * 1024
    if (size > limit)
      throw new MigError(
        'E_MIG_UNSUPPORTED_FORMAT',
        `${name}: the server does not serve byte ranges (it answered HTTP 200 to a Range request) and the object is ${size} bytes, more than the ${limit} bytes read whole into memory; enable ranges on the server (nginx: max_ranges), or copy it into the import root`,
        { details: { url: name, size, limit } },
      )
    if (!a.cut && a.body.length === size) return new HttpObject(pool, u.origin, path, name, size, validators, Buffer.from(a.body), opts, auth)
    const whole = Buffer.allocUnsafe(size)
    let all: RangeAnswer
    try {
      all = await retry(
        () =>
          signedGet(
            pool,
            u.origin,
            path,
            { ...auth, 'accept-encoding': 'identity' },
            { max: size, into: whole, timeoutMs: Math.max(timeoutMs, size / 1000) },
            opts,
          ),
        { ...backoff, shouldRetry: (e) => !(e instanceof MigError) },
      )
    } catch (e) {
      throw transportError(name, e, u.host)
    }
    const again = statusError(name, all)
    if (again) throw again
    if (
      all.status !== 200 ||
      all.body.length !== size ||
      (etag && all.headers.etag !== etag) ||
      (!etag && validators.lastModified && all.headers['last-modified'] !== validators.lastModified)
    )
      throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: the object changed while it was read (HTTP ${all.status}, ${all.body.length} of ${size} bytes)`, {
        details: { url: name },
      })
    return new HttpObject(pool, u.origin, path, name, size, validators, whole, opts, auth)
  }

  async read(into: Buffer, pos: number): Promise<number> {
    if (this.closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${this.name}: read at offset ${pos} after close`)
    const n = Math.max(0, Math.min(into.length, this.size - pos))
    if (n === 0) return 0
    // the open's first bytes (headers and descriptors), or the whole object of a server without ranges
    if (pos + n <= this.head.length) {
      this.head.copy(into, 0, pos, pos + n)
      return n
    }
    const piece = this.opts.pieceBytes ?? 4 * 1024 * 1024
    const parts: Promise<void>[] = []
    for (let o = 0; o < n; o += piece) parts.push(this.readRange(into.subarray(o, Math.min(n, o + piece)), pos + o))
    const settled = await Promise.allSettled(parts)
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected')
    if (failed) throw failed.reason
    return n
  }

  /** Fills `into` (all of it) from the range at `pos`, retrying transport failures and 5xx. */
  private async readRange(into: Buffer, pos: number): Promise<void> {
    const last = pos + into.length - 1
    const headers: Record<string, string> = { ...this.auth, range: `bytes=${pos}-${last}`, 'accept-encoding': 'identity' }
    if (this.validators.etag) headers['if-match'] = this.validators.etag
    else if (this.validators.lastModified) headers['if-unmodified-since'] = this.validators.lastModified
    const retries = this.opts.retries ?? 5
    let why = ''
    for (let attempt = 0; attempt <= retries; attempt++) {
      if (attempt > 0) await sleep((this.opts.retryBaseMs ?? 250) * 2 ** (attempt - 1))
      if (this.closed) break
      let a: RangeAnswer
      try {
        a = await signedGet(this.pool, this.origin, this.path, headers, { max: into.length, into, timeoutMs: this.opts.requestTimeoutMs ?? 120_000 }, this.opts)
      } catch (e) {
        if (e instanceof MigError) throw e
        why = `${errCode(e) || 'transport'}: ${(e as Error).message}`
        continue
      }
      if (a.status >= 500) {
        why = `HTTP ${a.status}`
        continue
      }
      this.check(a, pos, into)
      return
    }
    throw new MigError(
      'E_MIG_DISK_READ_FAILED',
      `${this.name}: reading ${into.length} bytes at offset ${pos} failed ${retries + 1} times (${why}); the copy stopped at offset ${pos}`,
      { details: { url: this.name, offset: pos } },
    )
  }

  /** Checks a range answer: the exact range of the object opened, never another version. */
  private check(a: RangeAnswer, pos: number, into: Buffer): void {
    const changed = (why: string) =>
      new MigError(
        'E_MIG_DISK_READ_FAILED',
        `${this.name}: the object changed on the server since the copy began (${why}) at offset ${pos}; nothing of the new version was used`,
        {
          details: { url: this.name, offset: pos },
        },
      )
    if (a.status === 412) throw changed('HTTP 412, precondition failed')
    const refused = statusError(this.name, a)
    if (refused) throw refused
    if (a.status !== 206) throw changed(`HTTP ${a.status} to a range request`)
    const cr = parseContentRange(a.headers['content-range'])
    if (!cr || cr.first !== pos || cr.last !== pos + into.length - 1) throw changed(`Content-Range ${a.headers['content-range'] ?? 'missing'}`)
    if (cr.size !== this.size) throw changed(`size ${cr.size}, was ${this.size}`)
    if (this.validators.etag && a.headers.etag !== this.validators.etag) throw changed(`ETag ${a.headers.etag ?? 'missing'}, was ${this.validators.etag}`)
    if (this.validators.lastModified && a.headers['last-modified'] !== this.validators.lastModified)
      throw changed(`Last-Modified ${a.headers['last-modified'] ?? 'missing'}, was ${this.validators.lastModified}`)
    if (a.body.length !== into.length) throw changed(`${a.body.length} bytes for ${into.length}`)
    if (a.body.buffer !== into.buffer || a.body.byteOffset !== into.byteOffset) a.body.copy(into)
  }

  get identity(): string {
    const v = this.validators.etag
      ? `ETag ${this.validators.etag}`
      : this.validators.lastModified
        ? `Last-Modified ${this.validators.lastModified}`
        : 'no validator'
    return `${v}, ${this.size} bytes`
  }

  close(): void {
    if (this.closed) return
    this.closed = true
    this.pool.close()
  }
}
