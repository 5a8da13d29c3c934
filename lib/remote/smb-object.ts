/**
 * A file on an SMB share (`smb://server[:port]/share/path/file.ova`) read in place as a
 * {@link RemoteFile} (roadmap v0.3 "SMB remote offline inputs"), over SMB 2.0.2 ([MS-SMB2]) with
 * NTLMv2 authentication ([MS-NLMP] 3.3.2), through `@tryjsky/v9u-smb2` (its connection,
 * negotiation, session setup and message codecs; see the package's commit for why this client).
 *
 * Open: one connection, a session (the credential's user, password and domain; anonymous
 * without), a tree connect to the share, a `CREATE` of the file (read access, `FILE_OPEN`). The
 * answer gives the size (`EndofFile`) and the identity: `LastWriteTime`, `ChangeTime`, size.
 * Reads: `READ` requests at any offset, up to {@link SmbObjectOptions.inFlight} of them
 * outstanding on the connection. The client offers dialects 2.0.2 and 2.1; when the server
 * chooses 2.1 or later and announces `SMB2_GLOBAL_CAP_LARGE_MTU` ([MS-SMB2] 2.2.4), a `READ`
 * asks up to {@link SmbObjectOptions.readBytes} (at most the server's `MaxReadSize`) and carries
 * the `CreditCharge` of its size, one credit per 64 KiB, and consumes as many message ids
 * ([MS-SMB2] 3.2.4.1.5); otherwise 64 KiB. A request waits while the credits the server granted
 * (the `CreditResponse` of every answer, 3.2.5.1.4) do not cover it and others are outstanding.
 * This module frames the server's answers itself (the client's own framing concatenates every
 * socket read onto the bytes it holds): a `READ` answer's data go from the socket's buffers
 * straight into the caller's buffer, every other answer is handed whole to the client's parser.
 * An interim `STATUS_PENDING` answer (the server went asynchronous, [MS-SMB2] 3.3.4.2) is
 * followed to its final answer.
 *
 * Change detection: a read resolves only after a second `CREATE` of the same path, started after
 * the read's bytes arrived, shows the identity of the open (one such check serves every read
 * that completed before it began). A file overwritten in place (new `LastWriteTime`) or replaced
 * by another (a rename over it: other times) is `E_MIG_DISK_READ_FAILED`, never a mixed disk.
 *
 * A connection cut or a request unanswered for `requestTimeoutMs` is retried on a new
 * connection (session, tree and file opened again, the identity compared) `retries` times with a
 * doubling backoff, then `E_MIG_DISK_READ_FAILED` naming the offset (`details.offset`).
 *
 * Failures: a refused, unreachable or unresolvable server, a connect timeout ->
 * `E_MIG_SOURCE_UNREACHABLE`; `STATUS_LOGON_FAILURE`, `STATUS_ACCESS_DENIED` and the account
 * states -> `E_MIG_AUTH_FAILED`; `STATUS_BAD_NETWORK_NAME` (no such share),
 * `STATUS_OBJECT_NAME_NOT_FOUND`, `STATUS_OBJECT_PATH_NOT_FOUND`, a folder -> `E_MIG_NOT_FOUND`
 * naming the URL.
 */
import { createRequire } from 'node:module'
import type { RemoteFile } from '../contracts/remote-file.ts'
import { MigError, type ErrorCode } from '../errors.ts'
import { sleep } from '../retry.ts'

/** SMB credentials: a user of the server (or of `domain`) and its password. */
export interface SmbAccess {
  kind: 'smb'
  username: string
  password: string
  /** The user's domain or workgroup; default `WORKGROUP` (a standalone server ignores it). */
  domain?: string
}

/** Options of {@link openSmbObject}; times in milliseconds. */
export interface SmbObjectOptions {
  auth?: SmbAccess | null
  /** TCP connect and session setup (default 10 s). */
  connectTimeoutMs?: number
  /** Bound of one request's answer (default 60 s). */
  requestTimeoutMs?: number
  /** Reconnections after a cut connection or an unanswered request, per read (default 5). */
  retries?: number
  /** First backoff; doubled at every retry (default 250 ms). */
  retryBaseMs?: number
  /** `READ` requests outstanding at once (default 8). */
  inFlight?: number
  /** Bytes one `READ` asks at most when the server allows multi-credit reads (default 1 MiB; 64 KiB otherwise). */
  readBytes?: number
}

/** The parts of an `smb://` URL: server, TCP port (default 445), share, path in the share (`\`-separated). */
export interface SmbLocation {
  host: string
  port: number
  share: string
  path: string
}

/**
 * Splits `smb://server[:port]/share/dir/file` (percent-encoding decoded). Throws
 * `E_MIG_INVALID_PLAN` when the URL names no share and file, or a segment is empty, `.`/`..` or
 * holds a backslash or a control character.
 */
export function parseSmbUrl(url: string): SmbLocation {
  const u = new URL(url)
  const bad = (why: string) => new MigError('E_MIG_INVALID_PLAN', `${url}: ${why}`, { details: { issues: [{ path: 'plan.source_ref.url', message: why }] } })
  if (u.protocol !== 'smb:') throw bad('not an smb:// URL')
  if (u.hostname === '') throw bad('must name a server (smb://server/share/file)')
  let parts: string[]
  try {
    parts = u.pathname.split('/').slice(1).map(decodeURIComponent)
  } catch {
    throw bad('has a malformed percent-encoding')
  }
  if (parts.length < 2) throw bad('must name a share and a file in it (smb://server/share/dir/file.ova)')
  for (const p of parts)
    if (p === '' || p === '.' || p === '..' || /[\\\x00-\x1f]/.test(p))
      throw bad(`the path segment "${p}" is empty, a dot segment, or holds a backslash or control character`)
  const host = u.hostname.replace(/^\[(.*)\]$/, '$1')
  return { host, port: u.port === '' ? 445 : Number(u.port), share: parts[0]!, path: parts.slice(1).join('\\') }
}

// --- the client's internals this module drives (CommonJS, untyped) ---

interface SmbConnection {
  socket: import('node:net').Socket
  messageId: number
  responses: Record<string, unknown>
  responsesCB: Record<string, (m: unknown) => void>
  connected: boolean
}
interface SmbCreated {
  FileId: Buffer
  EndofFile: Buffer
  LastWriteTime: Buffer
  ChangeTime: Buffer
  FileAttributes: Buffer | number
}
type Callback = (err: (Error & { code?: string }) | null, r?: unknown) => void
interface SmbMessageModule {
  parse(connection: SmbConnection, cb: Callback, error: Error): (m: unknown) => void
}

const require_ = createRequire(import.meta.url)
const SMB2 = require_('@tryjsky/v9u-smb2') as new (o: Record<string, unknown>) => SmbConnection
const forge = require_('@tryjsky/v9u-smb2/lib/tools/smb2-forge') as {
  request(name: string, params: unknown, c: SmbConnection, cb: Callback): void
  response(c: SmbConnection): (data: Buffer) => void
}
const connectionTools = require_('@tryjsky/v9u-smb2/lib/tools/smb2-connection') as {
  requireConnect(fn: (cb: Callback) => void): (this: SmbConnection, cb: Callback) => void
  close(c: SmbConnection): void
}
const SMB2Message = require_('@tryjsky/v9u-smb2/lib/tools/smb2-message') as new (o?: {
  headers: Record<string, unknown>
  request: Record<string, unknown>
}) => {
  isMessageIdSetted: boolean
  getBuffer(c: SmbConnection): Buffer
  parseBuffer(b: Buffer): void
  getHeaders(): { MessageId: Buffer }
}
const msErref = require_('@tryjsky/v9u-smb2/lib/tools/ms_erref') as {
  getStatus(status: number): { code: string; message: string; valueHex: string }
  getErrorMessage(e: unknown): string
}
const MESSAGES: Record<string, SmbMessageModule> = {
  open: require_('@tryjsky/v9u-smb2/lib/messages/open'),
  close: require_('@tryjsky/v9u-smb2/lib/messages/close'),
}

/** One credit's worth of payload ([MS-SMB2] 3.1.5.2), the largest `READ` of a single-credit dialect. */
const CREDIT_BYTES = 64 * 1024
/** Default bytes of one multi-credit `READ` (see {@link SmbObjectOptions.readBytes}). */
const READ_BYTES = 1024 * 1024
const DIRECTORY = 0x10
/** SMB2 header ([MS-SMB2] 2.2.1) and the fixed part of a `READ` answer (2.2.20). */
const HEADER = 64
const READ_HEAD = HEADER + 16
const CMD_NEGOTIATE = 0x0000
const CMD_READ = 0x0008
const STATUS_PENDING = 0x00000103
const CAP_LARGE_MTU = 0x00000004
const DIALECT_2_1 = 0x0210
/** Message ids kept for the requests the client sends on its own (the change checks' `CREATE` and `CLOSE`). */
const CREDIT_RESERVE = 4

const AUTH_STATUSES = new Set([
  'STATUS_LOGON_FAILURE',
  'STATUS_ACCESS_DENIED',
  'STATUS_WRONG_PASSWORD',
  'STATUS_ACCOUNT_DISABLED',
  'STATUS_ACCOUNT_RESTRICTION',
  'STATUS_ACCOUNT_LOCKED_OUT',
  'STATUS_ACCOUNT_EXPIRED',
  'STATUS_PASSWORD_EXPIRED',
  'STATUS_PASSWORD_MUST_CHANGE',
  'STATUS_INVALID_LOGON_HOURS',
  'STATUS_INVALID_WORKSTATION',
  'STATUS_NO_SUCH_USER',
])
const MISSING_STATUSES = new Set(['STATUS_OBJECT_NAME_NOT_FOUND', 'STATUS_OBJECT_PATH_NOT_FOUND', 'STATUS_NO_SUCH_FILE', 'STATUS_OBJECT_NAME_INVALID'])
const DNS = new Set(['ENOTFOUND', 'EAI_AGAIN', 'EAI_NONAME', 'EAI_FAIL'])

/** A transport failure (no answer): retried on a new connection. */
class CutError extends Error {
  readonly code: string
  constructor(code: string, message: string) {
    super(message)
    this.code = code
  }
}

/** A FILETIME (100 ns since 1601) as ISO text. */
function filetime(b: Buffer): string {
  const t = b.readBigUInt64LE(0)
  const ms = Number(t / 10_000n) - 11_644_473_600_000
  return `${new Date(ms).toISOString().replace(/Z$/, '')}${String(t % 10_000n).padStart(4, '0')}Z`
}

function identityOf(f: SmbCreated): string {
  return `LastWriteTime ${filetime(f.LastWriteTime)}, ChangeTime ${filetime(f.ChangeTime)}, ${Number(f.EndofFile.readBigUInt64LE(0))} bytes`
}

function offsetBuffer(pos: number): Buffer {
  const b = Buffer.alloc(8)
  b.writeBigUInt64LE(BigInt(pos))
  return b
}

/** One SMB connection: session and tree of the share; requests with a timeout, failed all at once when the connection dies. */
/** A `READ` outstanding: the caller's buffer and its completion. */
interface DirectRead {
  into: Buffer
  done(e: (Error & { code?: string }) | null, n?: number): void
}

class SmbSession {
  private readonly c: SmbConnection
  private readonly pending = new Set<(e: Error) => void>()
  private dead: CutError | null = null
  /** Message ids the server allows so far: the first one, plus every credit it granted ([MS-SMB2] 3.2.5.1.4). */
  private granted = 1
  private readonly creditWaiters: Array<() => void> = []
  /** `READ`s outstanding, by message id. */
  private readonly reads = new Map<number, DirectRead>()
  /** The negotiated dialect, the server's `MaxReadSize`, and whether reads may span several credits. */
  private dialect = 0
  private maxRead = CREDIT_BYTES
  private multiCredit = false
  // the framing state: the NetBIOS length and header bytes read (`pre`), or an answer being filled
  private readonly pre = Buffer.allocUnsafe(4 + READ_HEAD)
  private preLen = 0
  private msgLen = -1
  private whole: Buffer | null = null
  private wholeAt = 0
  private direct: DirectRead | null = null
  private directAt = 0
  private directLen = 0
  private left = 0
  private skip = 0

  private constructor(
    private readonly loc: SmbLocation,
    auth: SmbAccess | null,
    private readonly requestTimeoutMs: number,
    private readonly wantRead: number,
  ) {
    this.c = new SMB2({
      share: `\\\\${loc.host}\\${loc.share}`,
      port: loc.port,
      username: auth?.username ?? '',
      password: auth?.password ?? '',
      domain: auth?.domain ?? 'WORKGROUP',
      autoCloseTimeout: 0,
    })
    const closedByServer = () => this.die(new CutError('ECONNRESET', 'the server closed the connection'))
    this.c.socket.on('close', closedByServer)
    // The client opens its socket half-open (`allowHalfOpen`): a server that ends the connection
    // in order (FIN, not RST) brings 'end' and never 'close', and every request on it would wait
    // for its timeout. The server sends nothing more after its FIN: the connection is over.
    this.c.socket.on('end', () => {
      closedByServer()
      this.c.socket.destroy()
    })
    // this module frames the answers (see the module comment); a malformed one (a hostile or
    // broken server) ends this connection instead of throwing out of the event loop
    this.c.socket.removeAllListeners('data')
    this.c.responses = {}
    this.c.responsesCB = {}
    this.c.socket.on('data', (d: Buffer) => {
      try {
        this.feed(d)
      } catch (e) {
        this.die(new CutError('EPROTO', `a malformed SMB answer (${(e as Error).message})`))
        this.c.socket.destroy()
      }
    })
  }

  /** Bytes one `READ` may ask on this connection (set by the negotiation). */
  get readBytes(): number {
    return this.multiCredit ? Math.max(CREDIT_BYTES, Math.min(this.wantRead, this.maxRead)) : CREDIT_BYTES
  }

  /** Takes in the socket's bytes: NetBIOS-framed SMB2 answers ([MS-SMB2] 2.1). */
  private feed(d: Buffer): void {
    let at = 0
    while (at < d.length) {
      if (this.direct) {
        const k = Math.min(this.left, d.length - at)
        d.copy(this.direct.into, this.directAt, at, at + k)
        this.directAt += k
        this.left -= k
        at += k
        if (this.left === 0) this.endDirect()
        continue
      }
      if (this.whole) {
        const k = Math.min(this.whole.length - this.wholeAt, d.length - at)
        d.copy(this.whole, this.wholeAt, at, at + k)
        this.wholeAt += k
        at += k
        if (this.wholeAt === this.whole.length) {
          const w = this.whole
          this.whole = null
          this.answer(w)
        }
        continue
      }
      if (this.skip > 0) {
        const k = Math.min(this.skip, d.length - at)
        this.skip -= k
        at += k
        continue
      }
      // the NetBIOS length, then the header and a READ answer's fixed part (or the whole message when shorter)
      const want = this.msgLen < 0 ? 4 : 4 + Math.min(this.msgLen, READ_HEAD)
      const k = Math.min(want - this.preLen, d.length - at)
      d.copy(this.pre, this.preLen, at, at + k)
      this.preLen += k
      at += k
      if (this.preLen < want) continue
      if (this.msgLen < 0) {
        this.msgLen = (this.pre[1]! << 16) | this.pre.readUInt16BE(2)
        if (this.pre[0] !== 0 || this.msgLen < HEADER) throw new Error(`a NetBIOS frame of type ${this.pre[0]} and ${this.msgLen} bytes`)
        continue
      }
      this.begin()
    }
  }

  /** The header of an answer is in `pre`: counts its credits, then streams a READ's data or collects the message. */
  private begin(): void {
    const h = this.pre.subarray(4)
    const len = this.msgLen
    this.msgLen = -1
    this.preLen = 0
    if (h.readUInt32BE(0) !== 0xfe534d42) throw new Error('not an SMB2 header')
    this.granted += h.readUInt16LE(14)
    for (const w of this.creditWaiters.splice(0)) w()
    const status = h.readUInt32LE(8)
    const mid = h.readUInt32LE(24)
    const read = h.readUInt16LE(12) === CMD_READ ? this.reads.get(mid) : undefined
    if (read && status === 0 && len >= READ_HEAD) {
      const offset = h[HEADER + 2]!
      const n = h.readUInt32LE(HEADER + 4)
      if (offset === READ_HEAD && n <= read.into.length && READ_HEAD + n <= len) {
        this.reads.delete(mid)
        this.direct = read
        this.directAt = 0
        this.directLen = n
        this.left = n
        this.skip = len - READ_HEAD - n
        if (n === 0) this.endDirect()
        return
      }
    }
    const w = Buffer.allocUnsafe(len)
    h.copy(w, 0, 0, Math.min(len, READ_HEAD))
    if (len <= READ_HEAD) this.answer(w)
    else {
      this.whole = w
      this.wholeAt = READ_HEAD
    }
  }

  private endDirect(): void {
    const r = this.direct!
    this.direct = null
    r.done(null, this.directLen)
  }

  /** A whole answer that is not streamed: a READ's error or odd layout, or one for the client's parser. */
  private answer(m: Buffer): void {
    const command = m.readUInt16LE(12)
    const status = m.readUInt32LE(8)
    const mid = m.readUInt32LE(24)
    if (command === CMD_NEGOTIATE && status === 0 && m.length >= HEADER + 36) {
      this.dialect = m.readUInt16LE(HEADER + 4)
      const caps = m.readUInt32LE(HEADER + 24)
      this.maxRead = m.readUInt32LE(HEADER + 32)
      this.multiCredit = this.dialect >= DIALECT_2_1 && this.dialect !== 0x02ff && (caps & CAP_LARGE_MTU) !== 0
    }
    const read = command === CMD_READ ? this.reads.get(mid) : undefined
    if (read) {
      if (status === STATUS_PENDING) return // the final answer follows ([MS-SMB2] 3.2.5.1.5)
      this.reads.delete(mid)
      if (status !== 0) {
        const e = msErref.getStatus(status)
        read.done(Object.assign(new Error(msErref.getErrorMessage(e)), { code: e.code }))
        return
      }
      const offset = m[HEADER + 2]!
      const n = m.readUInt32LE(HEADER + 4)
      if (offset < READ_HEAD || offset + n > m.length || n > read.into.length) throw new Error(`a READ answer of ${n} bytes at ${offset} in ${m.length}`)
      m.copy(read.into, 0, offset, offset + n)
      read.done(null, n)
      return
    }
    const message = new SMB2Message()
    message.parseBuffer(m)
    const key = m.subarray(24, 28).toString('hex')
    const cb = this.c.responsesCB[key]
    if (cb) {
      delete this.c.responsesCB[key]
      cb(message)
    } else this.c.responses[key] = message
  }

  /** Waits until the server's credits cover `charge` more message ids, while answers that bring credits are awaited. */
  private async credits(charge: number): Promise<void> {
    while (!this.dead && this.c.messageId + charge + CREDIT_RESERVE > this.granted && this.reads.size > 0)
      await new Promise<void>((r) => this.creditWaiters.push(r))
  }

  /**
   * Reads `into.length` bytes (at most {@link readBytes}) at `pos` of the open `fileId` into
   * `into`, the data copied from the socket's buffers into it; resolves to the bytes the server
   * gave. Throws the status (its `code`) or a {@link CutError}.
   */
  async read(fileId: Buffer, into: Buffer, pos: number): Promise<number> {
    const charge = this.multiCredit ? Math.max(1, Math.ceil(into.length / CREDIT_BYTES)) : 1
    await this.credits(charge)
    return this.guard<number>(
      (cb) => {
        const mid = this.c.messageId
        this.c.messageId += charge
        const msg = new SMB2Message({
          headers: {
            Command: 'READ',
            SessionId: (this.c as unknown as { SessionId: unknown }).SessionId,
            TreeId: (this.c as unknown as { TreeId: unknown }).TreeId,
            ProcessId: (this.c as unknown as { ProcessId: unknown }).ProcessId,
            CreditCharge: this.multiCredit ? charge : 0,
            MessageId: mid,
          },
          request: { FileId: fileId, Length: into.length, Offset: offsetBuffer(pos) },
        })
        msg.isMessageIdSetted = true
        const body = msg.getBuffer(this.c)
        const frame = Buffer.allocUnsafe(4 + body.length)
        frame.writeUInt32BE(body.length, 0)
        body.copy(frame, 4)
        this.reads.set(mid, {
          into,
          done: (e, n) => {
            if (e) cb(e)
            else cb(null, n)
          },
        })
        this.c.socket.write(frame)
      },
      this.requestTimeoutMs,
      'ETIMEDOUT',
    )
  }

  /** Connects, sets up the session and the tree; throws the client's error (its `code`: a status or a socket code). */
  static async connect(loc: SmbLocation, auth: SmbAccess | null, connectTimeoutMs: number, requestTimeoutMs: number, readBytes: number): Promise<SmbSession> {
    const s = new SmbSession(loc, auth, requestTimeoutMs, readBytes)
    try {
      await s.guard(
        (cb) =>
          connectionTools
            .requireConnect((done) => done(null))
            .call(s.c, (e) => {
              cb(e)
            }),
        connectTimeoutMs,
        'ETIMEDOUT',
      )
    } catch (e) {
      s.close()
      throw e
    }
    return s
  }

  private die(e: CutError): void {
    if (this.dead) return
    this.dead = e
    for (const reject of this.pending) reject(e)
    this.pending.clear()
    this.reads.clear()
    for (const w of this.creditWaiters.splice(0)) w()
  }

  /** Runs `start`, bounded by `ms` (then the connection is declared dead) and by the connection's death. */
  private guard<T>(start: (cb: Callback) => void, ms: number, timeoutCode: string): Promise<T> {
    if (this.dead) return Promise.reject(this.dead)
    return new Promise<T>((resolve, reject) => {
      let settled = false
      const fail = (e: Error) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        this.pending.delete(fail)
        reject(e)
      }
      const timer = setTimeout(() => {
        const e = new CutError(timeoutCode, `no answer in ${ms} ms`)
        fail(e)
        this.die(e)
        this.close()
      }, ms)
      this.pending.add(fail)
      try {
        start((err, r) => {
          if (settled) return
          if (err) {
            fail(err)
            return
          }
          settled = true
          clearTimeout(timer)
          this.pending.delete(fail)
          resolve(r as T)
        })
      } catch (e) {
        fail(e as Error)
      }
    })
  }

  /** Sends message `name` and waits for its final answer (an interim `STATUS_PENDING` is followed). */
  request<T>(name: 'open' | 'close', params: unknown): Promise<T> {
    return this.guard<T>(
      (cb) => {
        const id = Buffer.alloc(4)
        id.writeUInt32LE(this.c.messageId >>> 0)
        const mid = id.toString('hex')
        const done: Callback = (err, r) => {
          if (err?.code === 'STATUS_PENDING') {
            // the client deletes the callback after this returns: register the final answer's handler next turn
            setImmediate(() => {
              const h = MESSAGES[name]!.parse(this.c, done, new Error())
              const early = this.c.responses[mid]
              if (early !== undefined) {
                delete this.c.responses[mid]
                h(early)
              } else this.c.responsesCB[mid] = h
            })
            return
          }
          cb(err, r)
        }
        forge.request(name, params, this.c, done)
      },
      this.requestTimeoutMs,
      'ETIMEDOUT',
    )
  }

  /** Opens the file for reading (`CREATE`, `FILE_OPEN`). */
  openFile(): Promise<SmbCreated> {
    return this.request<SmbCreated>('open', { path: this.loc.path })
  }

  close(): void {
    this.die(new CutError('ECONNRESET', 'closed'))
    try {
      connectionTools.close(this.c)
    } catch {}
    this.c.socket.destroy()
  }
}

/** The error the caller sees for a failure of connecting, authenticating, or opening. */
function openError(url: string, loc: SmbLocation, e: unknown): MigError {
  if (e instanceof MigError) return e
  const code = String((e as { code?: unknown }).code ?? '')
  const msg = (e as Error).message
  const at = (c: ErrorCode, why: string) => new MigError(c, `${url}: ${why}`, { cause: e, details: { url, code: code || null } })
  if (AUTH_STATUSES.has(code))
    return at('E_MIG_AUTH_FAILED', `the server refused the credentials (${code}); check the smb credential's user, password and domain`)
  if (code === 'STATUS_BAD_NETWORK_NAME') return at('E_MIG_NOT_FOUND', `no share "${loc.share}" on ${loc.host} (${code})`)
  if (MISSING_STATUSES.has(code)) return at('E_MIG_NOT_FOUND', `no file "${loc.path}" in share "${loc.share}" (${code})`)
  if (DNS.has(code)) return at('E_MIG_SOURCE_UNREACHABLE', `cannot resolve ${loc.host} (DNS, ${code})`)
  if (e instanceof CutError || /^E[A-Z]+$/.test(code)) return at('E_MIG_SOURCE_UNREACHABLE', `${loc.host}:${loc.port} unreachable (${code}: ${msg})`)
  return at('E_MIG_SOURCE_UNREACHABLE', `${loc.host}:${loc.port}: ${code || 'SMB'}: ${msg}`)
}

/**
 * Opens the file `url` names (`smb://server[:port]/share/path`). Throws as described in the
 * module comment, `E_MIG_INVALID_PLAN` for a URL without share and file.
 */
export async function openSmbObject(url: string, opts: SmbObjectOptions = {}): Promise<RemoteFile> {
  const loc = parseSmbUrl(url)
  const name = url
  let session: SmbSession | null = null
  try {
    session = await SmbSession.connect(loc, opts.auth ?? null, opts.connectTimeoutMs ?? 10_000, opts.requestTimeoutMs ?? 60_000, opts.readBytes ?? READ_BYTES)
    const f = await session.openFile()
    const attrs = typeof f.FileAttributes === 'number' ? f.FileAttributes : f.FileAttributes.readUInt32LE(0)
    if (attrs & DIRECTORY) throw new MigError('E_MIG_NOT_FOUND', `${url}: "${loc.path}" is a folder, not a file`, { details: { url } })
    return new SmbObject(name, loc, opts, session, f)
  } catch (e) {
    session?.close()
    throw openError(url, loc, e)
  }
}

class SmbObject implements RemoteFile {
  readonly size: number
  readonly identity: string
  private closed = false
  private reconnecting: Promise<void> | null = null
  /** Counts the connections made: a request that failed on an older one than the current retries on it, without reconnecting. */
  private generation = 0
  private slots: number
  private readonly queue: Array<() => void> = []
  private checking = false
  private readonly waiters: Array<{ resolve: () => void; reject: (e: Error) => void }> = []

  constructor(
    readonly name: string,
    private readonly loc: SmbLocation,
    private readonly opts: SmbObjectOptions,
    private session: SmbSession,
    private file: SmbCreated,
  ) {
    this.size = Number(file.EndofFile.readBigUInt64LE(0))
    this.identity = identityOf(file)
    this.slots = opts.inFlight ?? 8
  }

  private changed(pos: number, why: string): MigError {
    return new MigError(
      'E_MIG_DISK_READ_FAILED',
      `${this.name}: the file changed on the server since the copy began (${why}) at offset ${pos}; nothing of the new version was used`,
      { details: { url: this.name, offset: pos } },
    )
  }

  async read(into: Buffer, pos: number): Promise<number> {
    if (this.closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${this.name}: read at offset ${pos} after close`)
    const n = Math.max(0, Math.min(into.length, this.size - pos))
    if (n === 0) return 0
    const parts: Promise<void>[] = []
    const chunk = this.session.readBytes
    for (let o = 0; o < n; o += chunk) parts.push(this.readChunk(into.subarray(o, Math.min(n, o + chunk)), pos + o))
    const settled = await Promise.allSettled(parts)
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected')
    if (failed) throw failed.reason
    await this.verified(pos)
    return n
  }

  /** Waits for one of the `inFlight` request slots. */
  private async slot(): Promise<void> {
    if (this.slots > 0) {
      this.slots--
      return
    }
    await new Promise<void>((r) => this.queue.push(r))
  }

  private release(): void {
    const next = this.queue.shift()
    if (next) next()
    else this.slots++
  }

  /** Fills `into` (at most the session's `readBytes`) from `pos`, reconnecting after a cut. */
  private async readChunk(into: Buffer, pos: number): Promise<void> {
    const retries = this.opts.retries ?? 5
    let why = ''
    let used = -1
    for (let attempt = 0; attempt <= retries; attempt++) {
      if (attempt > 0) {
        await sleep((this.opts.retryBaseMs ?? 250) * 2 ** (attempt - 1))
        if (this.closed) break
        try {
          await this.reconnect(pos, used)
        } catch (e) {
          if (e instanceof MigError) throw e
          why = `${(e as { code?: string }).code ?? 'transport'}: ${(e as Error).message}`
          continue
        }
      }
      if (this.closed) break
      await this.slot()
      let got: number
      try {
        used = this.generation
        got = await this.session.read(this.file.FileId, into, pos)
      } catch (e) {
        if (e instanceof CutError) {
          why = `${e.code}: ${e.message}`
          continue
        }
        const code = String((e as { code?: unknown }).code ?? '')
        throw new MigError('E_MIG_DISK_READ_FAILED', `${this.name}: reading ${into.length} bytes at offset ${pos}: ${code} ${(e as Error).message}`, {
          cause: e,
          details: { url: this.name, offset: pos, code },
        })
      } finally {
        this.release()
      }
      // a short answer before the end of the file opened: the file shrank
      if (got !== into.length) throw this.changed(pos, `${got} bytes for ${into.length}`)
      return
    }
    throw new MigError(
      'E_MIG_DISK_READ_FAILED',
      `${this.name}: reading ${into.length} bytes at offset ${pos} failed ${retries + 1} times (${why}); the copy stopped at offset ${pos}`,
      { details: { url: this.name, offset: pos } },
    )
  }

  /**
   * A new connection, the file opened again and compared with the first open (one at a time).
   * `failedOn`: the generation of the connection the caller's request failed on; when a newer one
   * stands already, the caller retries on it (the requests of a cut connection fail one by one,
   * and each must not close the connection that replaced it).
   */
  private reconnect(pos: number, failedOn: number): Promise<void> {
    if (failedOn >= 0 && failedOn < this.generation) return this.reconnecting ?? Promise.resolve()
    if (!this.reconnecting)
      this.reconnecting = (async () => {
        this.session.close()
        const s = await SmbSession.connect(
          this.loc,
          this.opts.auth ?? null,
          this.opts.connectTimeoutMs ?? 10_000,
          this.opts.requestTimeoutMs ?? 60_000,
          this.opts.readBytes ?? READ_BYTES,
        )
        let f: SmbCreated
        try {
          f = await s.openFile()
        } catch (e) {
          s.close()
          if (e instanceof CutError) throw e
          throw this.changed(pos, `opening it again failed: ${(e as { code?: string }).code ?? (e as Error).message}`)
        }
        if (identityOf(f) !== this.identity) {
          s.close()
          throw this.changed(pos, `${identityOf(f)}, was ${this.identity}`)
        }
        this.session = s
        this.file = f
        this.generation++
      })().finally(() => {
        this.reconnecting = null
      })
    return this.reconnecting
  }

  /** Resolves once a check of the path, begun after this call, found the identity of the open. */
  private verified(pos: number): Promise<void> {
    return new Promise((resolve, reject) => {
      this.waiters.push({
        resolve,
        reject: (e) => reject(e instanceof MigError && e.code === 'E_MIG_DISK_READ_FAILED' ? this.changed(pos, e.message) : e),
      })
      this.pump()
    })
  }

  private pump(): void {
    if (this.checking || this.waiters.length === 0) return
    const batch = this.waiters.splice(0)
    this.checking = true
    this.checkOnce()
      .then(
        () => {
          for (const w of batch) w.resolve()
        },
        (e: Error) => {
          for (const w of batch) w.reject(e)
        },
      )
      .finally(() => {
        this.checking = false
        this.pump()
      })
  }

  /** Opens the path again and compares its identity; retries a cut connection like a read. */
  private async checkOnce(): Promise<void> {
    const retries = this.opts.retries ?? 5
    let why = ''
    let used = -1
    for (let attempt = 0; attempt <= retries; attempt++) {
      if (attempt > 0) {
        await sleep((this.opts.retryBaseMs ?? 250) * 2 ** (attempt - 1))
        try {
          await this.reconnect(0, used)
        } catch (e) {
          if (e instanceof MigError) throw new MigError('E_MIG_DISK_READ_FAILED', e.message)
          why = `${(e as { code?: string }).code ?? 'transport'}`
          continue
        }
      }
      const s = this.session
      used = this.generation
      let f: SmbCreated
      try {
        f = await s.openFile()
      } catch (e) {
        if (e instanceof CutError) {
          why = e.code
          continue
        }
        throw new MigError('E_MIG_DISK_READ_FAILED', `opening it again failed: ${(e as { code?: string }).code ?? (e as Error).message}`)
      }
      s.request('close', f).catch(() => {})
      const now = identityOf(f)
      if (now !== this.identity) throw new MigError('E_MIG_DISK_READ_FAILED', `${now}, was ${this.identity}`)
      return
    }
    throw new MigError('E_MIG_DISK_READ_FAILED', `checking the file failed ${retries + 1} times (${why})`)
  }

  close(): void {
    if (this.closed) return
    this.closed = true
    for (const r of this.queue.splice(0)) r()
    this.session.close()
  }
}
