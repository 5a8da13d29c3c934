/**
 * A small NBD client over a Unix socket (`node:net` only, so it runs under Bun and Node 20).
 *
 * Follows the NBD protocol document (NetworkBlockDevice/nbd `doc/proto.md`):
 * - fixed newstyle handshake (`NBDMAGIC`, `IHAVEOPT`, `NBD_FLAG_FIXED_NEWSTYLE`, `NBD_FLAG_NO_ZEROES`);
 * - option haggling: `NBD_OPT_STRUCTURED_REPLY`, `NBD_OPT_SET_META_CONTEXT` with one metadata
 *   context (`base:allocation` by default, or another such as qemu's `qemu:dirty-bitmap:<name>`,
 *   qemu `docs/interop/nbd.txt`), `NBD_OPT_GO` asking for `NBD_INFO_EXPORT` (size, transmission
 *   flags) and `NBD_INFO_BLOCK_SIZE`;
 * - transmission: `NBD_CMD_READ` (simple replies, or structured replies reassembled from
 *   `NBD_REPLY_TYPE_OFFSET_DATA` / `OFFSET_HOLE` chunks, with `ERROR` / `ERROR_OFFSET` chunks),
 *   `NBD_CMD_BLOCK_STATUS` (`NBD_REPLY_TYPE_BLOCK_STATUS` descriptors with `NBD_STATE_HOLE` /
 *   `NBD_STATE_ZERO`), `NBD_CMD_DISC`.
 *
 * Several requests may be in flight; replies are matched by their 64-bit handle (cookie). Request
 * sizes are bounded ({@link NBD_MAX_REQUEST}, 32 MiB, or the server's maximum block size when
 * smaller); no allocation is ever made from a size the server declares without a cap. Every
 * protocol violation, server error or lost connection is a
 * `MigError('E_MIG_DISK_READ_FAILED')` naming the export and, for requests, the offset.
 * A protocol violation also disconnects hard and fails every request in flight.
 */
import { connect as netConnect, type Socket } from 'node:net'
import { u64beExact as u64 } from '../bytes.ts'
import { MigError } from '../errors.ts'
import { sleep } from '../retry.ts'
import {
  NBDMAGIC,
  IHAVEOPT,
  REPLY_MAGIC,
  REQUEST_MAGIC,
  SIMPLE_REPLY_MAGIC,
  STRUCTURED_REPLY_MAGIC,
  FLAG_FIXED_NEWSTYLE,
  FLAG_NO_ZEROES,
  OPT_GO,
  OPT_STRUCTURED_REPLY,
  OPT_SET_META_CONTEXT,
  REP_ACK,
  REP_INFO,
  REP_META_CONTEXT,
  INFO_EXPORT,
  INFO_BLOCK_SIZE,
  CMD_READ,
  CMD_DISC,
  CMD_BLOCK_STATUS,
  REPLY_FLAG_DONE,
  REPLY_TYPE_OFFSET_DATA,
  REPLY_TYPE_OFFSET_HOLE,
  REPLY_TYPE_BLOCK_STATUS,
} from './protocol.ts'

/** Largest read or block-status span the client sends in one request, bytes (32 MiB). */
export const NBD_MAX_REQUEST = 32 * 1024 * 1024

const OLDSTYLE_MAGIC = 0x00420281861253n

const REP_FLAG_ERROR = 0x80000000

const REPLY_TYPE_NONE = 0
const REPLY_TYPE_ERROR = 0x8001
const REPLY_TYPE_ERROR_OFFSET = 0x8002

/** Transmission flag `NBD_FLAG_READ_ONLY`. */
export const NBD_FLAG_READ_ONLY = 1 << 1
/** Block status flag of `base:allocation`: the extent is unallocated (a hole). */
export const NBD_STATE_HOLE = 1
/** Block status flag of `base:allocation`: the extent reads as zeros. */
export const NBD_STATE_ZERO = 2
/** Block status flag of a `qemu:dirty-bitmap:` context: the extent is dirty (qemu `docs/interop/nbd.txt`). */
export const NBD_STATE_DIRTY = 1

/** Largest option reply payload accepted during the handshake, bytes. */
const MAX_OPTION_REPLY = 64 * 1024
/** Largest structured chunk payload that is not read data (block status, errors), bytes. */
const MAX_META_CHUNK = 8 * 1024 * 1024
/** Size of the reused socket receive buffer, bytes. */
const RECV_BUFFER = 1024 * 1024

const ERRNO: Record<number, string> = { 1: 'EPERM', 5: 'EIO', 12: 'ENOMEM', 22: 'EINVAL', 28: 'ENOSPC', 75: 'EOVERFLOW', 95: 'ENOTSUP', 108: 'ESHUTDOWN' }

/** One block status descriptor of the `base:allocation` context (NBD protocol `NBD_REPLY_TYPE_BLOCK_STATUS`): byte range and `NBD_STATE_*` flags. */
export interface BlockStatusDescriptor {
  offset: number
  length: number
  flags: number
}

/** Options of {@link NbdClient.connect}. */
export interface NbdConnectOptions {
  /** Export name (qemu-nbd's default export is `""`). */
  exportName?: string
  /** Name used in error messages (e.g. the disk file or tar member); defaults to the socket path. */
  label?: string
  /** Give up connecting/handshaking after this many milliseconds (default 10 000). */
  timeoutMs?: number
  /** Aborting closes the connection. */
  signal?: AbortSignal
  /** Ask for a metadata context (default true). */
  blockStatus?: boolean
  /**
   * The metadata context block status reports (default `base:allocation`): one context per
   * connection, so each descriptor answers one question. Whether the server granted it is
   * {@link NbdClient.baseAllocation} (true for any granted context).
   */
  metaContext?: string
  /**
   * Whether the server process is gone, asked before each new connection attempt: a socket file
   * left by a server that exited refuses connections forever, so no more attempts are made.
   */
  serverGone?(): boolean
}

interface Pending {
  kind: 'read' | 'status'
  offset: number
  length: number
  buf?: Buffer
  ranges?: Array<[number, number]>
  extents?: BlockStatusDescriptor[]
  statusChunks?: number
  error?: string
  resolve(v: unknown): void
  reject(e: unknown): void
}

/**
 * Receives socket bytes into buffers the parser asks for ({@link Receiver.expect}): read data is
 * copied straight from the socket's (reused) receive buffer into the caller's destination, so
 * the data path allocates nothing per socket read. Bytes that arrive while nothing is expected
 * (only during the handshake, whose steps await promises) are kept as copies until asked for.
 */
class Receiver {
  private want: { buf: Buffer; have: number; cb: (b: Buffer) => void } | null = null
  private stash: Buffer[] = []
  private stashed = 0
  private failure: unknown = null
  private takeReject: ((e: unknown) => void) | null = null

  /** Asks for exactly `buf.length` (> 0) bytes; `cb(buf)` runs synchronously once they are in. */
  expect(buf: Buffer, cb: (b: Buffer) => void): void {
    this.want = { buf, have: 0, cb }
    if (this.stash.length) {
      const s = this.stash
      this.stash = []
      this.stashed = 0
      for (const b of s) this.feed(b)
    }
  }

  /** Bytes from the socket (`data` is only valid during the call). */
  feed(data: Buffer): void {
    let i = 0
    while (i < data.length) {
      const w = this.want
      if (!w) {
        this.stashed += data.length - i
        if (this.stashed > MAX_OPTION_REPLY * 4) throw new Error('server sent unsolicited data')
        this.stash.push(Buffer.from(data.subarray(i)))
        return
      }
      const n = Math.min(w.buf.length - w.have, data.length - i)
      data.copy(w.buf, w.have, i, i + n)
      w.have += n
      i += n
      if (w.have === w.buf.length) {
        this.want = null
        w.cb(w.buf)
      }
    }
  }

  /** Promise form of {@link expect} for the handshake. */
  take(n: number): Promise<Buffer> {
    if (this.failure) return Promise.reject(this.failure)
    if (n === 0) return Promise.resolve(Buffer.alloc(0))
    return new Promise((resolve, reject) => {
      this.takeReject = reject
      this.expect(Buffer.allocUnsafe(n), (b) => {
        this.takeReject = null
        resolve(b)
      })
    })
  }

  fail(e: unknown): void {
    this.failure ??= e
    this.want = null
    const r = this.takeReject
    this.takeReject = null
    r?.(e)
  }
}

/**
 * An open NBD connection in the transmission phase.
 * Create with {@link NbdClient.connect}; end with {@link NbdClient.disconnect}.
 */
export class NbdClient {
  /** Export size, bytes. */
  size = 0
  /** Transmission flags (`NBD_FLAG_*`). */
  flags = 0
  /** Whether structured replies were negotiated. */
  structured = false
  /** Whether the requested meta context (`base:allocation` unless another was asked) was negotiated (block status available). */
  baseAllocation = false
  /** Largest request length sent, bytes: min(32 MiB, the server's maximum block size). */
  maxRequest = NBD_MAX_REQUEST
  /** The server's minimum block size (1 when not announced), bytes. */
  minBlock = 1

  private readonly q = new Receiver()
  private readonly hb = Buffer.alloc(32)
  private readonly pending = new Map<number, Pending>()
  private nextHandle = 1
  private contextId = -1
  private dead: MigError | null = null
  private closed = false

  private sock!: Socket

  private constructor(private readonly label: string) {}

  /** Socket bytes (from `onread`, the buffer is reused by the socket). */
  private onBytes(data: Buffer): void {
    if (this.dead) return
    try {
      this.q.feed(data)
    } catch (e) {
      this.fatal(e instanceof MigError ? e : this.violation((e as Error).message))
    }
  }

  private attach(sock: Socket): void {
    this.sock = sock
    sock.on('error', (e) => this.fatal(`connection error: ${e.message}`))
    sock.on('close', () => this.fatal('connection closed by the server'))
  }

  /**
   * Connects to the Unix socket `socketPath` and negotiates (fixed newstyle, structured replies,
   * `base:allocation`, `NBD_OPT_GO`). Retries while the socket is not yet listening
   * (`ENOENT`/`ECONNREFUSED`) until `timeoutMs`.
   * Throws `E_MIG_DISK_READ_FAILED` (unreachable server, handshake violation, unknown export);
   * `E_MIG_CANCELLED` when `signal` aborts first.
   */
  static async connect(socketPath: string, opts: NbdConnectOptions = {}): Promise<NbdClient> {
    const label = opts.label ?? socketPath
    const deadline = Date.now() + (opts.timeoutMs ?? 10_000)
    const client = new NbdClient(label)
    const rxBuf = Buffer.allocUnsafe(RECV_BUFFER)
    const onread = { buffer: rxBuf, callback: (n: number, b: Uint8Array) => (client.onBytes((b as Buffer).subarray(0, n)), true) }
    let sock: Socket
    for (;;) {
      if (opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', `${label}: cancelled while connecting to the NBD server`)
      try {
        sock = await new Promise<Socket>((resolve, reject) => {
          const s = netConnect({ path: socketPath, onread })
          s.once('connect', () => (s.removeListener('error', reject), resolve(s)))
          s.once('error', reject)
        })
        break
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code
        if ((code === 'ENOENT' || code === 'ECONNREFUSED') && Date.now() < deadline && !opts.serverGone?.()) {
          await sleep(20)
          continue
        }
        throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: cannot connect to NBD socket ${socketPath}: ${(e as Error).message}`, { cause: e })
      }
    }
    client.attach(sock)
    const onAbort = () => client.fatal('cancelled')
    opts.signal?.addEventListener('abort', onAbort, { once: true })
    const timer = setTimeout(() => client.fatal('handshake timed out'), Math.max(1, deadline - Date.now()))
    try {
      await client.handshake(opts.exportName ?? '', opts.blockStatus !== false, opts.metaContext ?? 'base:allocation')
    } catch (e) {
      client.destroy()
      if (opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', `${label}: cancelled during the NBD handshake`)
      throw e instanceof MigError ? e : new MigError('E_MIG_DISK_READ_FAILED', `${label}: NBD handshake failed: ${(e as Error).message}`, { cause: e })
    } finally {
      clearTimeout(timer)
    }
    client.startReply()
    return client
  }

  private violation(reason: string): MigError {
    return new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: NBD protocol violation: ${reason}`)
  }

  /** Marks the connection dead: fails every pending request and the byte queue, closes the socket. */
  private fatal(reason: string | MigError): void {
    if (this.dead) return
    const err = typeof reason === 'string' ? new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: ${this.closed ? 'NBD connection closed' : reason}`) : reason
    this.dead = err
    this.q.fail(err)
    for (const p of this.pending.values())
      p.reject(new MigError('E_MIG_DISK_READ_FAILED', `${err.message} (request at offset ${p.offset}, ${p.length} bytes)`, { cause: err }))
    this.pending.clear()
    this.sock.destroy()
  }

  private destroy(): void {
    this.closed = true
    this.fatal('closed')
  }

  // ---- handshake -------------------------------------------------------------------------

  private async handshake(exportName: string, wantStatus: boolean, context: string): Promise<void> {
    const h = await this.q.take(16)
    if (h.readBigUInt64BE(0) !== NBDMAGIC) throw this.violation('bad server magic (not an NBD server)')
    const m = h.readBigUInt64BE(8)
    if (m === OLDSTYLE_MAGIC) throw this.violation('oldstyle negotiation is not supported')
    if (m !== IHAVEOPT) throw this.violation('bad newstyle magic')
    const hflags = (await this.q.take(2)).readUInt16BE(0)
    if (!(hflags & FLAG_FIXED_NEWSTYLE)) throw this.violation('server does not support fixed newstyle negotiation')
    const cflags = Buffer.alloc(4)
    cflags.writeUInt32BE(FLAG_FIXED_NEWSTYLE | (hflags & FLAG_NO_ZEROES), 0)
    this.sock.write(cflags)

    const name = Buffer.from(exportName, 'utf8')
    if (name.length > 4096) throw new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: export name too long`)

    // NBD_OPT_STRUCTURED_REPLY
    this.sendOption(OPT_STRUCTURED_REPLY, Buffer.alloc(0))
    for (;;) {
      const r = await this.optionReply(OPT_STRUCTURED_REPLY)
      if (r.type === REP_ACK) {
        this.structured = true
        break
      }
      if (r.type & REP_FLAG_ERROR) break // unsupported: simple replies only
      throw this.violation(`unexpected reply ${r.type} to NBD_OPT_STRUCTURED_REPLY`)
    }

    // NBD_OPT_SET_META_CONTEXT <context>
    if (this.structured && wantStatus) {
      const q = Buffer.from(context, 'utf8')
      if (q.length > 4096) throw new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: meta context name too long`)
      const p = Buffer.alloc(4 + name.length + 4 + 4 + q.length)
      let o = p.writeUInt32BE(name.length, 0)
      o += name.copy(p, o)
      o = p.writeUInt32BE(1, o)
      o = p.writeUInt32BE(q.length, o)
      q.copy(p, o)
      this.sendOption(OPT_SET_META_CONTEXT, p)
      for (;;) {
        const r = await this.optionReply(OPT_SET_META_CONTEXT)
        if (r.type === REP_ACK) break
        if (r.type & REP_FLAG_ERROR) break
        if (r.type !== REP_META_CONTEXT) throw this.violation(`unexpected reply ${r.type} to NBD_OPT_SET_META_CONTEXT`)
        if (r.data.length < 5) throw this.violation('short NBD_REP_META_CONTEXT')
        const id = r.data.readUInt32BE(0)
        if (r.data.subarray(4).toString('utf8') === context) this.contextId = id
      }
      this.baseAllocation = this.contextId >= 0
    }

    // NBD_OPT_GO
    const p = Buffer.alloc(4 + name.length + 2 + 2)
    let o = p.writeUInt32BE(name.length, 0)
    o += name.copy(p, o)
    o = p.writeUInt16BE(1, o)
    p.writeUInt16BE(INFO_BLOCK_SIZE, o)
    this.sendOption(OPT_GO, p)
    let gotExport = false
    for (;;) {
      const r = await this.optionReply(OPT_GO)
      if (r.type === REP_ACK) break
      if (r.type & REP_FLAG_ERROR) {
        throw new MigError(
          'E_MIG_DISK_READ_FAILED',
          `${this.label}: NBD server refused export "${exportName}": error ${r.type - REP_FLAG_ERROR}${r.data.length ? `: ${r.data.toString('utf8')}` : ''}`,
        )
      }
      if (r.type !== REP_INFO) throw this.violation(`unexpected reply ${r.type} to NBD_OPT_GO`)
      if (r.data.length < 2) throw this.violation('short NBD_REP_INFO')
      const info = r.data.readUInt16BE(0)
      if (info === INFO_EXPORT) {
        if (r.data.length !== 12) throw this.violation('NBD_INFO_EXPORT of wrong length')
        try {
          this.size = u64(r.data, 2)
        } catch {
          throw this.violation('export size beyond 2^53 bytes')
        }
        this.flags = r.data.readUInt16BE(10)
        gotExport = true
      } else if (info === INFO_BLOCK_SIZE) {
        if (r.data.length !== 14) throw this.violation('NBD_INFO_BLOCK_SIZE of wrong length')
        const min = r.data.readUInt32BE(2)
        const max = r.data.readUInt32BE(10)
        if (min < 1 || min > 65536 || (min & (min - 1)) !== 0) throw this.violation(`bad minimum block size ${min}`)
        this.minBlock = min
        if (max >= min) this.maxRequest = Math.max(min, Math.min(NBD_MAX_REQUEST, max))
      }
    }
    if (!gotExport) throw this.violation('NBD_OPT_GO ended without NBD_INFO_EXPORT')
  }

  private sendOption(opt: number, data: Buffer): void {
    const h = Buffer.alloc(16)
    h.writeBigUInt64BE(IHAVEOPT, 0)
    h.writeUInt32BE(opt, 8)
    h.writeUInt32BE(data.length, 12)
    this.sock.write(data.length ? Buffer.concat([h, data]) : h)
  }

  private async optionReply(opt: number): Promise<{ type: number; data: Buffer }> {
    const h = await this.q.take(20)
    if (h.readBigUInt64BE(0) !== REPLY_MAGIC) throw this.violation('bad option reply magic')
    if (h.readUInt32BE(8) !== opt) throw this.violation(`option reply for option ${h.readUInt32BE(8)}, expected ${opt}`)
    const type = h.readUInt32BE(12)
    const len = h.readUInt32BE(16)
    if (len > MAX_OPTION_REPLY) throw this.violation(`option reply of ${len} bytes`)
    return { type, data: await this.q.take(len) }
  }

  // ---- transmission ----------------------------------------------------------------------

  private send(type: number, flags: number, offset: number, length: number): number {
    const handle = this.nextHandle++
    const h = Buffer.alloc(28)
    h.writeUInt32BE(REQUEST_MAGIC, 0)
    h.writeUInt16BE(flags, 4)
    h.writeUInt16BE(type, 6)
    h.writeUInt32BE(0, 8)
    h.writeUInt32BE(handle >>> 0, 12)
    h.writeBigUInt64BE(BigInt(offset), 16)
    h.writeUInt32BE(length, 24)
    this.sock.write(h)
    return handle
  }

  private checkRange(what: string, offset: number, length: number): void {
    if (this.dead) throw new MigError('E_MIG_DISK_READ_FAILED', `${this.dead.message} (${what} at offset ${offset})`)
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length <= 0 || offset + length > this.size) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: ${what} of ${length} bytes at offset ${offset} is outside the export (${this.size} bytes)`)
    }
    if (length > this.maxRequest)
      throw new MigError(
        'E_MIG_DISK_READ_FAILED',
        `${this.label}: ${what} of ${length} bytes at offset ${offset} exceeds the ${this.maxRequest}-byte request bound`,
      )
  }

  /**
   * Reads `length` bytes at `offset` (`NBD_CMD_READ`). `length` is at most {@link maxRequest}.
   * `into`, when given and large enough, receives the data and a view of it is returned.
   * Holes of structured replies are filled with zeros. Throws `E_MIG_DISK_READ_FAILED` naming
   * the export and offset (server error, violation, lost connection, out-of-range request).
   */
  read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
    try {
      this.checkRange('read', offset, length)
    } catch (e) {
      return Promise.reject(e)
    }
    const buf = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
    return new Promise((resolve, reject) => {
      const handle = this.send(CMD_READ, 0, offset, length)
      this.pending.set(handle, { kind: 'read', offset, length, buf, ranges: [], resolve: resolve as (v: unknown) => void, reject })
    })
  }

  /**
   * The extents of the negotiated meta context (`base:allocation` unless another was asked) over
   * `[offset, offset+length)` (`NBD_CMD_BLOCK_STATUS`); the server may answer for a shorter span
   * (at least one extent); the last extent is clipped to the request. Without a negotiated
   * context one extent with flags 0 covering the span is returned.
   * Throws `E_MIG_DISK_READ_FAILED`.
   */
  blockStatus(offset: number, length: number): Promise<BlockStatusDescriptor[]> {
    const len = Math.min(length, 0x40000000, this.size - offset) // at most 1 GiB per request
    if (this.dead) return Promise.reject(new MigError('E_MIG_DISK_READ_FAILED', `${this.dead.message} (block status at offset ${offset})`))
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || len <= 0) {
      return Promise.reject(
        new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: block status at offset ${offset} is outside the export (${this.size} bytes)`),
      )
    }
    if (!this.baseAllocation) return Promise.resolve([{ offset, length: len, flags: 0 }])
    return new Promise((resolve, reject) => {
      const handle = this.send(CMD_BLOCK_STATUS, 0, offset, len)
      this.pending.set(handle, { kind: 'status', offset, length: len, extents: [], statusChunks: 0, resolve: resolve as (v: unknown) => void, reject })
    })
  }

  /** Sends `NBD_CMD_DISC` and closes the socket. Never throws; pending requests fail. */
  async disconnect(): Promise<void> {
    if (this.dead) return
    try {
      this.send(CMD_DISC, 0, 0, 0)
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, 1000)
        this.sock.end(() => (clearTimeout(t), resolve()))
      })
    } catch {
      /* ignore */
    }
    this.destroy()
  }

  // ---- reply parsing: a synchronous state machine fed by the socket ------------------------

  private startReply(): void {
    this.q.expect(this.hb.subarray(0, 4), (b) => {
      const m = b.readUInt32BE(0)
      if (m === SIMPLE_REPLY_MAGIC) this.q.expect(this.hb.subarray(0, 12), (h) => this.simpleReply(h))
      else if (m === STRUCTURED_REPLY_MAGIC && this.structured) this.q.expect(this.hb.subarray(0, 16), (h) => this.structuredChunk(h))
      else throw this.violation(`bad reply magic 0x${m.toString(16)}`)
    })
  }

  private take(handle: number): Pending {
    const p = this.pending.get(handle)
    if (!p) throw this.violation(`reply for unknown handle ${handle}`)
    return p
  }

  private simpleReply(h: Buffer): void {
    const err = h.readUInt32BE(0)
    if (h.readUInt32BE(4) !== 0) throw this.violation('reply for unknown handle')
    const handle = h.readUInt32BE(8)
    const p = this.take(handle)
    if (err !== 0) {
      this.pending.delete(handle)
      p.reject(
        new MigError(
          'E_MIG_DISK_READ_FAILED',
          `${this.label}: NBD server error ${ERRNO[err] ?? err} for ${p.kind === 'read' ? 'read' : 'block status'} of ${p.length} bytes at offset ${p.offset}`,
        ),
      )
      return this.startReply()
    }
    if (p.kind !== 'read' || this.structured) throw this.violation(`simple reply with data for a ${p.kind} request at offset ${p.offset}`)
    this.q.expect(p.buf!, () => {
      this.pending.delete(handle)
      p.resolve(p.buf)
      this.startReply()
    })
  }

  private structuredChunk(h: Buffer): void {
    const flags = h.readUInt16BE(0)
    const type = h.readUInt16BE(2)
    if (h.readUInt32BE(4) !== 0) throw this.violation('chunk for unknown handle')
    const handle = h.readUInt32BE(8)
    const len = h.readUInt32BE(12)
    const p = this.take(handle)
    const at = `at offset ${p.offset}`
    const end = () => {
      if (flags & REPLY_FLAG_DONE) this.finish(handle, p)
      this.startReply()
    }
    switch (type) {
      case REPLY_TYPE_NONE:
        if (len !== 0) throw this.violation(`NBD_REPLY_TYPE_NONE with payload ${at}`)
        if (!(flags & REPLY_FLAG_DONE)) throw this.violation(`NBD_REPLY_TYPE_NONE without DONE ${at}`)
        return end()
      case REPLY_TYPE_OFFSET_DATA: {
        if (p.kind !== 'read') throw this.violation(`data chunk for a block status request ${at}`)
        if (len < 9) throw this.violation(`short NBD_REPLY_TYPE_OFFSET_DATA ${at}`)
        return this.q.expect(this.hb.subarray(0, 8), (b) => {
          const off = u64(b, 0)
          const n = len - 8
          this.claim(p, off, n)
          this.q.expect(p.buf!.subarray(off - p.offset, off - p.offset + n), end)
        })
      }
      case REPLY_TYPE_OFFSET_HOLE: {
        if (p.kind !== 'read') throw this.violation(`hole chunk for a block status request ${at}`)
        if (len !== 12) throw this.violation(`NBD_REPLY_TYPE_OFFSET_HOLE of length ${len} ${at}`)
        return this.q.expect(this.hb.subarray(0, 12), (b) => {
          const off = u64(b, 0)
          const n = b.readUInt32BE(8)
          if (n === 0) throw this.violation(`empty hole ${at}`)
          this.claim(p, off, n)
          p.buf!.fill(0, off - p.offset, off - p.offset + n)
          end()
        })
      }
      case REPLY_TYPE_BLOCK_STATUS: {
        if (p.kind !== 'status') throw this.violation(`block status chunk for a read ${at}`)
        if (len < 12 || (len - 4) % 8 !== 0 || len > MAX_META_CHUNK) throw this.violation(`NBD_REPLY_TYPE_BLOCK_STATUS of length ${len} ${at}`)
        return this.q.expect(Buffer.allocUnsafe(len), (b) => {
          if (b.readUInt32BE(0) !== this.contextId) throw this.violation(`block status for unknown context ${b.readUInt32BE(0)} ${at}`)
          if (p.statusChunks! > 0) throw this.violation(`more than one block status chunk ${at}`)
          p.statusChunks!++
          let pos = p.offset
          const stop = p.offset + p.length
          for (let i = 4; i < len && pos < stop; i += 8) {
            const l = b.readUInt32BE(i)
            if (l === 0) throw this.violation(`zero-length extent ${at}`)
            const n = Math.min(l, stop - pos)
            p.extents!.push({ offset: pos, length: n, flags: b.readUInt32BE(i + 4) })
            pos += n
          }
          end()
        })
      }
      default: {
        if (!(type & 0x8000)) throw this.violation(`unknown chunk type ${type} ${at}`)
        if (len < 6 || len > MAX_META_CHUNK) throw this.violation(`error chunk of length ${len} ${at}`)
        return this.q.expect(Buffer.allocUnsafe(len), (b) => {
          const err = b.readUInt32BE(0)
          const mlen = b.readUInt16BE(4)
          if (mlen > len - 6) throw this.violation(`error message longer than its chunk ${at}`)
          if (type === REPLY_TYPE_ERROR_OFFSET && len !== 14 + mlen) throw this.violation(`NBD_REPLY_TYPE_ERROR_OFFSET of length ${len} ${at}`)
          const msg = b.subarray(6, 6 + Math.min(mlen, 4096)).toString('utf8')
          const where = type === REPLY_TYPE_ERROR_OFFSET ? u64(b, 6 + mlen) : p.offset
          p.error ??= `NBD server error ${ERRNO[err] ?? err}${msg ? ` (${msg})` : ''} at offset ${where}`
          if (type !== REPLY_TYPE_ERROR && type !== REPLY_TYPE_ERROR_OFFSET) p.error = `unknown error chunk type ${type} at offset ${where}`
          end()
        })
      }
    }
  }

  /** Records that a content chunk covers [off, off+n) of request `p`; rejects overlaps and strays. */
  private claim(p: Pending, off: number, n: number): void {
    if (off < p.offset || off + n > p.offset + p.length)
      throw this.violation(`content chunk [${off}, ${off + n}) outside the read of ${p.length} bytes at offset ${p.offset}`)
    for (const [s, e] of p.ranges!) if (off < e && s < off + n) throw this.violation(`overlapping content chunks at offset ${off}`)
    if (p.ranges!.length > 65536) throw this.violation(`too many content chunks for the read at offset ${p.offset}`)
    p.ranges!.push([off, off + n])
  }

  private finish(handle: number, p: Pending): void {
    this.pending.delete(handle)
    const what = p.kind === 'read' ? `read of ${p.length} bytes at offset ${p.offset}` : `block status at offset ${p.offset}`
    if (p.error) return p.reject(new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: ${p.error} (${what})`))
    if (p.kind === 'read') {
      let covered = 0
      for (const [s, e] of p.ranges!) covered += e - s
      if (covered !== p.length) {
        const v = this.violation(`${what} answered ${covered} bytes`)
        p.reject(v)
        return this.fatal(v)
      }
      p.resolve(p.buf)
    } else {
      if (p.extents!.length === 0) {
        const v = this.violation(`${what}: no extents`)
        p.reject(v)
        return this.fatal(v)
      }
      p.resolve(p.extents)
    }
  }
}
