/**
 * The CLI's client of the migrator HTTP API (spec 4): JSON calls, a streamed multipart upload
 * with SHA-256 computed on the way, and the SSE stream parsed with eventsource-parser. Over the
 * server's unix socket (Bun's fetch `unix` option; under Node, undici's fetch with an Agent
 * connecting to the socket path) or over TCP with a Bearer token or Basic credentials.
 */
import { createHash } from 'node:crypto'
import { open, stat } from 'node:fs/promises'
import { basename } from 'node:path'
import { createParser, type EventSourceMessage } from 'eventsource-parser'

/** An error answered by the API (`{"error": {code, message}}`) or a transport failure (`code` null). */
export class ApiError extends Error {
  constructor(
    readonly code: string | null,
    message: string,
    readonly status: number | null,
  ) {
    super(message)
    this.name = 'ApiError'
  }
}

/**
 * Where the server is and how to authenticate: `socketPath` (the unix socket; `baseUrl` is then
 * `http://localhost/<base path>`, its host only fills the `Host` header) or a TCP `baseUrl`;
 * Basic `user`/`password`, else the Bearer `token` (both optional).
 */
export interface ApiTarget {
  baseUrl: string
  socketPath?: string
  token?: string
  user?: string
  password?: string
}

type Fetch = (url: string, init: RequestInit) => Promise<Response>

/** A fetch that connects to the unix socket `socketPath` whatever the URL's host. */
async function socketFetch(socketPath: string): Promise<Fetch> {
  if (typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined') return (url, init) => fetch(url, { ...init, unix: socketPath } as RequestInit)
  const undici = await import('undici')
  const dispatcher = new undici.Agent({ connect: { socketPath } })
  return (url, init) => undici.fetch(url, { ...(init as object), dispatcher } as never) as unknown as Promise<Response>
}

/** Thin typed access to the API. */
export class Api {
  private fetcher: Promise<Fetch> | null = null

  constructor(private readonly target: ApiTarget) {}

  /** The API base URL this client talks to (`unix:<path>` and the base path over the socket). */
  get baseUrl(): string {
    return this.target.socketPath ? `unix:${this.target.socketPath}:${new URL(this.target.baseUrl).pathname}` : this.target.baseUrl
  }

  private send(url: string, init: RequestInit): Promise<Response> {
    const socketPath = this.target.socketPath
    if (!socketPath) return fetch(url, init)
    this.fetcher ??= socketFetch(socketPath)
    return this.fetcher.then((f) => f(url, init))
  }

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    const h: Record<string, string> = { accept: 'application/json', ...extra }
    if (this.target.user) h.authorization = 'Basic ' + Buffer.from(`${this.target.user}:${this.target.password ?? ''}`).toString('base64')
    else if (this.target.token) h.authorization = `Bearer ${this.target.token}`
    return h
  }

  private authHint(res: Response): string {
    if (this.target.socketPath) return ''
    if (/^Bearer/i.test(res.headers.get('www-authenticate') ?? '') && !this.target.user) {
      return this.target.token
        ? "HTTP 401: the token was refused (MIGRATOR_TOKEN, or the api-token file of MIGRATOR_DATA_DIR: is it this server's?)"
        : 'HTTP 401: run as root on the server host (the CLI then reads the api-token file of the data directory), set MIGRATOR_TOKEN, or use the unix socket (no --url)'
    }
    return `HTTP 401: give --user and --password, or MIGRATOR_USER and MIGRATOR_PASSWORD${this.target.user ? `; the credentials of ${this.target.user} were rejected` : ''}`
  }

  private url(p: string): string {
    return this.target.baseUrl.replace(/\/+$/, '') + p
  }

  private async parse(res: Response): Promise<any> {
    const text = await res.text()
    let body: any = null
    try {
      body = text === '' ? null : JSON.parse(text)
    } catch {
      if (res.status === 401) throw new ApiError('E_MIG_AUTH_FAILED', this.authHint(res), 401)
      if (!res.ok) throw new ApiError(null, `HTTP ${res.status}: ${text.slice(0, 200)}`, res.status)
      throw new ApiError(null, `unexpected response: ${text.slice(0, 200)}`, res.status)
    }
    if (!res.ok) {
      const hint = res.status === 401 ? ` (${this.authHint(res)})` : ''
      throw new ApiError(body?.error?.code ?? null, (body?.error?.message ?? `HTTP ${res.status}`) + hint, res.status)
    }
    return body
  }

  /** A JSON call; throws {@link ApiError}. */
  async call(method: string, p: string, body?: unknown): Promise<any> {
    let res: Response
    try {
      res = await this.send(this.url(p), {
        method,
        headers: this.headers(body === undefined ? {} : { 'content-type': 'application/json' }),
        body: body === undefined ? undefined : JSON.stringify(body),
      })
    } catch (e) {
      throw new ApiError(null, `cannot reach the migrator at ${this.target.baseUrl}: ${(e as Error).message}`, null)
    }
    return this.parse(res)
  }

  /**
   * Uploads a local file as the multipart field `file`, streaming it from disk; its SHA-256 is
   * computed while reading and sent as the `sha256` field after the file, so the server checks
   * what it received against what was read. `onProgress(bytesSent, total)`.
   */
  async upload(file: string, onProgress: (sent: number, total: number) => void): Promise<any> {
    const total = (await stat(file)).size
    const fh = await open(file, 'r')
    const boundary = `migrator${Date.now().toString(16)}${Math.random().toString(16).slice(2)}`
    const enc = new TextEncoder()
    const hash = createHash('sha256')
    const name = basename(file).replace(/["\r\n]/g, '_')
    let sent = 0
    let phase = 0
    const buf = Buffer.alloc(1024 * 1024)
    const body = new ReadableStream<Uint8Array>({
      async pull(c) {
        if (phase === 0) {
          c.enqueue(
            enc.encode(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${name}"\r\nContent-Type: application/octet-stream\r\n\r\n`),
          )
          phase = 1
          return
        }
        if (phase === 1) {
          const { bytesRead } = await fh.read(buf, 0, buf.length, sent)
          if (bytesRead > 0) {
            const chunk = Buffer.from(buf.subarray(0, bytesRead))
            hash.update(chunk)
            sent += bytesRead
            onProgress(sent, total)
            c.enqueue(chunk)
            return
          }
          phase = 2
        }
        c.enqueue(enc.encode(`\r\n--${boundary}\r\nContent-Disposition: form-data; name="sha256"\r\n\r\n${hash.digest('hex')}\r\n--${boundary}--\r\n`))
        await fh.close()
        c.close()
      },
      async cancel() {
        await fh.close()
      },
    })
    let res: Response
    try {
      res = await this.send(this.url('/uploads'), {
        method: 'POST',
        headers: this.headers({ 'content-type': `multipart/form-data; boundary=${boundary}` }),
        body,
        duplex: 'half',
      } as RequestInit)
    } catch (e) {
      throw new ApiError(null, `upload of ${file} failed: ${(e as Error).message}`, null)
    }
    return this.parse(res)
  }

  /**
   * Follows `GET /migrations/stream` (optionally `?id=`), calling `onEvent(name, data)` for every
   * event until `onEvent` returns true or the signal aborts. `onOpen()` runs each time the stream
   * is connected (the server subscribed the client before answering, so nothing that happens
   * after `onOpen` starts is missed); returning true from it ends the follow too. Reconnects with
   * `Last-Event-ID` when the connection drops; an event whose data is not JSON is skipped.
   * Throws {@link ApiError} when the server cannot be reached or answers an error.
   */
  // biome-ignore lint/suspicious/noConfusingVoidType: a callback may return nothing (go on) or false (stop)
  async follow(
    jobId: string | null,
    onEvent: (name: string, data: any) => boolean | void,
    opts: { signal?: AbortSignal; onOpen?: () => Promise<boolean | void> } = {},
  ): Promise<void> {
    const { signal } = opts
    let lastId: string | null = null
    let done = false
    while (!done && !signal?.aborted) {
      const q = jobId ? `?id=${encodeURIComponent(jobId)}` : ''
      let res: Response
      try {
        res = await this.send(this.url(`/migrations/stream${q}`), {
          headers: this.headers(lastId ? { 'last-event-id': lastId, accept: 'text/event-stream' } : { accept: 'text/event-stream' }),
          signal,
        })
      } catch (e) {
        if (signal?.aborted) return
        throw new ApiError(null, `cannot reach the migrator at ${this.target.baseUrl}: ${(e as Error).message}`, null)
      }
      if (!res.ok || !res.body) await this.parse(res)
      const parser = createParser({
        onEvent: (m: EventSourceMessage) => {
          if (m.id) lastId = m.id
          let data: unknown
          try {
            data = JSON.parse(m.data)
          } catch {
            return
          }
          if (!done && onEvent(m.event ?? 'message', data)) done = true
        },
      })
      const reader = res.body!.getReader()
      const dec = new TextDecoder()
      try {
        if (opts.onOpen && (await opts.onOpen())) done = true
        while (!done) {
          const { value, done: end } = await reader.read()
          if (end) break
          parser.feed(dec.decode(value, { stream: true }))
        }
      } catch (e) {
        if (signal?.aborted) return
        if (e instanceof ApiError) throw e
      } finally {
        await reader.cancel().catch(() => {})
      }
      if (!done) await new Promise((r) => setTimeout(r, 500))
    }
  }
}
