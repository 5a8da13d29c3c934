/**
 * HTTP/1.1 GETs over a small keep-alive connection pool whose sockets read (the `onread` socket
 * option of `node:net`/`node:tls`) a `Content-Length` body straight into the caller's buffer, and
 * anything else (heads, chunked bodies) into one reused buffer per connection: the transport of the datastore reads
 * (datastore.ts), so a disk copy allocates nothing per socket read. Through undici every socket
 * read is a new buffer; at a few hundred MB/s that garbage held a worker's RSS at 220-250 MiB
 * (bench/vim-job.ts) until the collector caught up.
 *
 * Also the transport of remote offline inputs (`lib/remote/http-object.ts`): ranged GETs of an
 * export on an HTTP(S) server, whose first request may cut a too-long answer (`partial`).
 *
 * Only what a datastore `/folder` GET needs (RFC 9112, HTTP/1.1 message syntax): a status line
 * and header fields of at most 64 KiB together; a body framed by `Content-Length`, by the
 * `chunked` transfer coding, or by the connection's close; no 1xx answers, no pipelining. The
 * TLS trust (CA, pinned thumbprint, insecure) is the one of the SOAP client (`lib/tls.ts`).
 */
import type { Socket } from 'node:net'
import { MigError } from '../errors.ts'
import { tlsConnector, type TlsTrust } from '../tls.ts'

/** Largest status line + header fields accepted, bytes. */
export const MAX_HEAD_BYTES = 64 * 1024
/** Bytes one socket read fills at most (the connection's reused receive buffer). */
const RX_BYTES = 256 * 1024
/** Idle connections are closed after this many milliseconds. */
const IDLE_MS = 30_000

/**
 * An answer: status, header fields (lower-case names) and the body (a view of `into` when given).
 * `cut`: the body was longer than `max` and only its first `max` bytes were read (`partial`).
 */
export interface RangeAnswer {
  status: number
  headers: Record<string, string>
  body: Buffer
  cut?: boolean
}

/**
 * Options of one {@link RangeHttp.get}: `max` bytes of body at most (into `into` when given),
 * `timeoutMs` for the whole exchange, `partial`: a longer 2xx body is cut at `max` bytes and the
 * connection closed (a server that ignores `Range` answers with the whole object) instead of
 * failing, `method` `HEAD` for an answer without body.
 */
export interface RangeGetOptions {
  max: number
  into?: Buffer
  timeoutMs: number
  partial?: boolean
  method?: 'GET' | 'HEAD'
}

/** One request in progress on a connection: the parser's state. */
interface Exchange {
  resolve(a: RangeAnswer): void
  reject(e: Error): void
  /** Bytes of the answer seen so far (0: the connection may have been closed by an idle peer). */
  seen: number
  max: number
  into?: Buffer
  head: Buffer[]
  headLen: number
  phase: 'head' | 'fixed' | 'close' | 'size' | 'data' | 'crlf' | 'trailer' | 'done'
  status: number
  headers: Record<string, string>
  body: Buffer | null
  got: number
  /** Bytes left in the body (`fixed`) or in the current chunk (`data`, `crlf`). */
  left: number
  /** The chunk-size or trailer line being read. */
  line: string
  keepAlive: boolean
  partial: boolean
  headOnly: boolean
  cut: boolean
}

/** A pooled connection. */
interface Conn {
  socket: Socket | null
  ready: Promise<void>
  busy: boolean
  dead: boolean
  used: boolean
  ex: Exchange | null
}

/**
 * A pool of at most `connections` keep-alive connections to one origin (`https:` or `http:`).
 * {@link get} throws `MigError('E_MIG_DISK_READ_FAILED')` for an answer larger than asked, and a
 * plain `Error` for transport and protocol failures (the caller decides about retries).
 */
export class RangeHttp {
  private readonly conns: Conn[] = []
  private readonly waiters: Array<() => void> = []
  private closed = false

  /** The origin, parsed once. */
  private readonly url: URL

  constructor(private readonly opts: { origin: string; trust: TlsTrust; connectTimeoutMs: number; connections?: number }) {
    this.url = new URL(opts.origin)
  }

  /**
   * `GET path` (path and query of the origin) with `headers`; resolves when the whole answer
   * arrived. A 2xx body, at most `max` bytes, goes into `into` when given (at least `max` bytes
   * long), else into a new buffer; an answer of status 300 or more resolves after its head with
   * an empty body (an error page is not read; its connection is closed). `timeoutMs` bounds the
   * whole exchange. A kept-alive connection the server closed while idle is retried once on a
   * new one.
   */
  async get(path: string, headers: Record<string, string>, o: RangeGetOptions): Promise<RangeAnswer> {
    for (let attempt = 0; ; attempt++) {
      const conn = await this.acquire()
      try {
        return await this.exchange(conn, path, headers, o)
      } catch (e) {
        // a kept-alive connection the peer closed while idle fails before any byte of the answer:
        // once, on a new connection
        const stale = conn.used && (e as { stale?: boolean }).stale === true
        if (!stale || attempt > 0) throw e
      } finally {
        this.release(conn)
      }
    }
  }

  /** Closes every connection; later calls fail. */
  close(): void {
    this.closed = true
    for (const c of this.conns.splice(0)) this.kill(c)
    for (const w of this.waiters.splice(0)) w()
  }

  private async acquire(): Promise<Conn> {
    for (;;) {
      if (this.closed) throw new Error('the connection pool is closed')
      // connections the server closed while idle hold no place in the pool
      for (const c of this.conns.filter((x) => x.dead && !x.busy)) this.drop(c)
      const idle = this.conns.find((c) => !c.busy && !c.dead)
      if (idle) {
        idle.busy = true
        idle.socket?.setTimeout(0)
        return idle
      }
      if (this.conns.length < (this.opts.connections ?? 8)) {
        const c = this.connect()
        this.conns.push(c)
        try {
          await c.ready
        } catch (e) {
          // its place in the pool is free again: a request waiting for one tries its own connect
          c.busy = false
          this.drop(c)
          throw e
        }
        return c
      }
      await new Promise<void>((r) => this.waiters.push(r))
    }
  }

  private release(c: Conn): void {
    c.busy = false
    if (c.dead || this.closed) this.drop(c)
    else {
      c.used = true
      c.socket?.setTimeout(IDLE_MS)
    }
    this.waiters.shift()?.()
  }

  private drop(c: Conn): void {
    this.kill(c)
    const i = this.conns.indexOf(c)
    if (i >= 0) this.conns.splice(i, 1)
    if (!c.busy) this.waiters.shift()?.()
  }

  private kill(c: Conn): void {
    c.dead = true
    c.socket?.destroy()
  }

  /** A new connection (busy), its socket reading into its own receive buffer. */
  private connect(): Conn {
    const url = this.url
    const rx = Buffer.allocUnsafe(RX_BYTES)
    const c: Conn = { socket: null, ready: Promise.resolve(), busy: true, dead: false, used: false, ex: null }
    const fail = (e: Error) => {
      c.dead = true
      const ex = c.ex
      c.ex = null
      ex?.reject(e)
    }
    // The body of a fixed-length answer is read straight into its place (the caller's buffer):
    // the socket's next read is given the exact rest of that body, so no byte of it is copied
    // out of `rx`. Both runtimes ask for the next read's buffer right after each read, and write
    // into it only when data arrives; an exchange that ends early (timeout, error) destroys the
    // socket first, so no read lands in a buffer its caller got back.
    let direct: Exchange | null = null
    const onread = {
      buffer: (): Buffer => {
        const ex = c.ex
        direct = ex !== null && ex.phase === 'fixed' && !ex.partial ? ex : null
        if (!direct) return rx
        direct.body ??= direct.into ?? Buffer.allocUnsafe(direct.left)
        return direct.body.subarray(direct.got, direct.got + direct.left)
      },
      callback: (n: number) => {
        if (direct && c.ex === direct) this.landed(c, direct, n)
        else if (c.ex) this.feed(c, rx.subarray(0, n))
        else this.kill(c) // data while no request is open: the connection is out of step
        return true
      },
    }
    const connector = tlsConnector(this.opts.trust, this.opts.connectTimeoutMs, { onread })
    c.ready = new Promise<void>((resolve, reject) => {
      connector({ hostname: url.hostname, host: url.host, protocol: url.protocol, port: url.port, servername: undefined } as never, (err, socket) => {
        if (err || !socket) return reject(err ?? new Error('no socket'))
        const s = socket as Socket
        c.socket = s
        s.unref()
        s.on('error', (e) => fail(e))
        s.on('timeout', () => c.busy || this.drop(c)) // idle for IDLE_MS (the timer is off while busy)
        s.on('end', () => this.ended(c))
        s.on('close', () => {
          this.ended(c)
          c.dead = true
        })
        resolve()
      })
    })
    return c
  }

  /** The server closed the connection: the end of a close-framed body, else a failure. */
  private ended(c: Conn): void {
    const ex = c.ex
    c.dead = true
    if (!ex) return
    if (ex.phase === 'close') return this.finish(c, ex)
    c.ex = null
    const e = new Error(ex.seen === 0 ? 'the server closed the connection before answering' : 'the server closed the connection in the middle of its answer')
    if (ex.seen === 0) Object.assign(e, { stale: true })
    ex.reject(e)
  }

  private exchange(c: Conn, path: string, headers: Record<string, string>, o: RangeGetOptions): Promise<RangeAnswer> {
    const url = this.url
    let req = `${o.method ?? 'GET'} ${path} HTTP/1.1\r\nhost: ${url.host}\r\n`
    for (const [k, v] of Object.entries(headers)) {
      if (/[\r\n\0]/.test(k + v)) return Promise.reject(new Error(`header ${k}: control characters`))
      req += `${k}: ${v}\r\n`
    }
    req += '\r\n'
    return new Promise<RangeAnswer>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.kill(c)
        const ex = c.ex
        c.ex = null
        ex?.reject(new Error(`no complete answer within ${o.timeoutMs} ms`))
      }, o.timeoutMs)
      c.ex = {
        resolve: (a) => {
          clearTimeout(timer)
          resolve(a)
        },
        reject: (e) => {
          clearTimeout(timer)
          reject(e)
        },
        seen: 0,
        max: o.max,
        into: o.into && o.into.length >= o.max ? o.into : undefined,
        head: [],
        headLen: 0,
        phase: 'head',
        status: 0,
        headers: {},
        body: null,
        got: 0,
        left: 0,
        line: '',
        keepAlive: true,
        partial: o.partial === true,
        headOnly: o.method === 'HEAD',
        cut: false,
      }
      if (c.dead || !c.socket) return this.ended(c)
      c.socket.write(req)
    })
  }

  /** `n` body bytes of a fixed-length answer arrived in place (see `connect`). */
  private landed(c: Conn, ex: Exchange, n: number): void {
    ex.seen += n
    ex.got += n
    ex.left -= n
    if (ex.left > 0) return
    ex.phase = 'done'
    this.finish(c, ex)
  }

  /** Parses `bytes` of the answer on `c` (copied out before the socket reads again). */
  private feed(c: Conn, bytes: Buffer): void {
    const ex = c.ex!
    ex.seen += bytes.length
    let at = 0
    try {
      while (at < bytes.length) {
        switch (ex.phase) {
          case 'head':
            at = this.readHead(ex, bytes, at)
            break
          case 'fixed':
          case 'data':
          case 'close': {
            const n = ex.phase === 'close' ? bytes.length - at : Math.min(ex.left, bytes.length - at)
            this.take(ex, bytes.subarray(at, at + n))
            at += n
            ex.left -= n
            if (ex.phase === 'fixed' && ex.left === 0) ex.phase = 'done'
            if (ex.phase === 'data' && ex.left === 0) {
              ex.phase = 'crlf'
              ex.left = 2
            }
            break
          }
          case 'crlf':
            if (bytes[at] !== (ex.left === 2 ? 0x0d : 0x0a)) throw new Error('a chunk does not end with CRLF')
            at++
            if (--ex.left === 0) ex.phase = 'size'
            break
          case 'size':
          case 'trailer': {
            const nl = bytes.indexOf(0x0a, at)
            const end = nl < 0 ? bytes.length : nl
            ex.line += bytes.toString('latin1', at, end)
            if (ex.line.length > 4096) throw new Error('a chunk-size or trailer line over 4 KiB')
            at = nl < 0 ? bytes.length : nl + 1
            if (nl >= 0) this.endLine(ex)
            break
          }
        }
        if (ex.phase === 'done') break
      }
      if (ex.phase === 'done') {
        // more than the answer on a connection to be reused: it is out of step
        if (at < bytes.length && ex.keepAlive) throw new Error('bytes after the end of the answer')
        this.finish(c, ex)
      }
    } catch (e) {
      this.kill(c)
      c.ex = null
      ex.reject(e as Error)
    }
  }

  /**
   * Reads the status line and header fields; returns where the body starts in `bytes`. Only the
   * head's bytes are scanned and kept (the body that follows it in the same read is not copied).
   */
  private readHead(ex: Exchange, bytes: Buffer, at: number): number {
    let i = at
    // ex.left counts the bytes of CR LF CR LF matched so far, across reads
    while (i < bytes.length && ex.left < 4) {
      const b = bytes[i++]
      ex.left = b === (ex.left % 2 === 0 ? 0x0d : 0x0a) ? ex.left + 1 : b === 0x0d ? 1 : 0
    }
    ex.headLen += i - at
    if (ex.headLen > MAX_HEAD_BYTES) throw new Error(`an answer head over ${MAX_HEAD_BYTES} bytes`)
    ex.head.push(Buffer.from(bytes.subarray(at, i)))
    if (ex.left === 4) {
      ex.left = 0
      this.parseHead(ex, Buffer.concat(ex.head).toString('latin1'))
    }
    return i
  }

  private parseHead(ex: Exchange, text: string): void {
    const lines = text.slice(0, -4).split('\r\n')
    const m = /^HTTP\/1\.([01]) (\d{3})(?: .*)?$/.exec(lines[0]!)
    if (!m) throw new Error(`not an HTTP/1.x status line: ${JSON.stringify(lines[0]!.slice(0, 80))}`)
    ex.status = Number(m[2])
    if (ex.status < 200) throw new Error(`an informational answer (HTTP ${ex.status}) to a GET`)
    for (const line of lines.slice(1)) {
      const i = line.indexOf(':')
      if (i <= 0 || /[\s]/.test(line.slice(0, i))) throw new Error(`a malformed header field: ${JSON.stringify(line.slice(0, 80))}`)
      const name = line.slice(0, i).toLowerCase()
      const value = line.slice(i + 1).trim()
      ex.headers[name] = name in ex.headers ? `${ex.headers[name]}, ${value}` : value
    }
    const conn = (ex.headers.connection ?? '').toLowerCase()
    ex.keepAlive = m[1] === '1' ? !/\bclose\b/.test(conn) : /\bkeep-alive\b/.test(conn)
    const te = ex.headers['transfer-encoding']
    const cl = ex.headers['content-length']
    if (ex.status >= 300) {
      // an error page is not read: the answer ends here and its connection is closed
      ex.phase = 'done'
      ex.keepAlive = false
    } else if (ex.status === 204 || ex.headOnly) ex.phase = 'done'
    else if (te !== undefined) {
      if (!/(^|,)\s*chunked\s*$/i.test(te)) throw new Error(`transfer coding ${JSON.stringify(te.slice(0, 80))} is not chunked`)
      ex.phase = 'size'
    } else if (cl !== undefined) {
      if (!/^\d{1,15}$/.test(cl)) throw new Error(`Content-Length ${JSON.stringify(cl.slice(0, 80))}`)
      ex.left = Number(cl)
      if (!ex.partial) this.room(ex, ex.left)
      ex.phase = ex.left === 0 ? 'done' : 'fixed'
    } else {
      ex.phase = 'close'
      ex.keepAlive = false
    }
  }

  /** A chunk-size or trailer line ended. */
  private endLine(ex: Exchange): void {
    const line = ex.line.replace(/\r$/, '')
    ex.line = ''
    if (ex.phase === 'trailer') {
      if (line === '') ex.phase = 'done'
      return
    }
    const m = /^([0-9a-fA-F]{1,12})[ \t]*(;.*)?$/.exec(line)
    if (!m) throw new Error(`a malformed chunk size: ${JSON.stringify(line.slice(0, 80))}`)
    ex.left = Number.parseInt(m[1]!, 16)
    if (!ex.partial) this.room(ex, ex.got + ex.left)
    ex.phase = ex.left === 0 ? 'trailer' : 'data'
  }

  /** Refuses a body over `max` bytes. */
  private room(ex: Exchange, total: number): void {
    if (total > ex.max) throw new MigError('E_MIG_DISK_READ_FAILED', `the server sent more than the ${ex.max} bytes asked for (HTTP ${ex.status})`)
  }

  /** Copies body bytes to their place. */
  private take(ex: Exchange, part: Buffer): void {
    if (ex.partial && ex.got + part.length >= ex.max) {
      // the first `max` bytes are all that is wanted: the rest of the answer is not read
      ex.body ??= ex.into ?? Buffer.allocUnsafe(ex.max)
      part.copy(ex.body, ex.got, 0, ex.max - ex.got)
      ex.cut = ex.got + part.length > ex.max || ex.left > part.length || ex.phase !== 'fixed'
      ex.got = ex.max
      ex.phase = 'done'
      ex.keepAlive = false
      return
    }
    this.room(ex, ex.got + part.length)
    ex.body ??= ex.into ?? Buffer.allocUnsafe(ex.phase === 'fixed' ? ex.left : ex.max)
    part.copy(ex.body, ex.got)
    ex.got += part.length
  }

  private finish(c: Conn, ex: Exchange): void {
    c.ex = null
    if (!ex.keepAlive) this.kill(c)
    ex.resolve({ status: ex.status, headers: ex.headers, body: (ex.body ?? Buffer.alloc(0)).subarray(0, ex.got), ...(ex.cut ? { cut: true } : {}) })
  }
}
