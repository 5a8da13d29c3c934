/**
 * A read-only NBD server of one {@link DiskReader} on a Unix socket: what a live import's qcow2
 * overlays read as their backing file while the destination volume is still being filled
 * (docs/live-import.md). No npm package serves NBD; the project's NBD client
 * (lib/nbd/client.ts), qemu-img and qemu-io are its counterparts in the tests.
 *
 * Follows the NBD protocol document (NetworkBlockDevice/nbd `doc/proto.md`), server side:
 * - fixed newstyle handshake (`NBDMAGIC`, `IHAVEOPT`, `NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES`);
 * - options: `NBD_OPT_EXPORT_NAME`, `NBD_OPT_INFO` / `NBD_OPT_GO` (`NBD_INFO_EXPORT`,
 *   `NBD_INFO_BLOCK_SIZE`), `NBD_OPT_STRUCTURED_REPLY`, `NBD_OPT_LIST`, `NBD_OPT_ABORT`,
 *   `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT` (`base:allocation` only); every other
 *   option is answered `NBD_REP_ERR_UNSUP` (TLS included: the socket is local and private);
 * - transmission: `NBD_CMD_READ` (a simple reply, or one `OFFSET_DATA` / `OFFSET_HOLE` chunk with
 *   structured replies), `NBD_CMD_BLOCK_STATUS` (`base:allocation` from the reader's extents:
 *   zero extents are `NBD_STATE_HOLE | NBD_STATE_ZERO`; one descriptor under
 *   `NBD_CMD_FLAG_REQ_ONE`, else at most {@link MAX_STATUS_DESCRIPTORS}), `NBD_CMD_FLUSH` (nothing to flush),
 *   `NBD_CMD_DISC`; writes, trims and write-zeroes are refused with `EPERM` (the export is
 *   read-only), any other command with `EINVAL`.
 *
 * Hostile clients never crash it: option data is capped at {@link MAX_OPTION_BYTES}, a request
 * longer than {@link NBD_SERVER_MAX_REQUEST} or outside the export is answered `EINVAL` (a write's
 * payload above the cap drops the connection), a bad magic drops the connection, and at most
 * {@link MAX_IN_FLIGHT} requests of one connection are served at once (the socket is paused beyond).
 *
 * A read the reader fails is tried again (1 s, doubling to 10 s) until it succeeds or the server
 * closes: the source that stops answering holds the guest's and the block job's reads instead of
 * failing them, and `onWaiting` tells the job (`waiting: true` with the error, then `false`).
 */
import { chmod, chown, rm } from 'node:fs/promises'
import { createServer, type Server, type Socket } from 'node:net'
import type { DiskExtent, DiskReader } from '../contracts/disk-reader.ts'
import { MigError } from '../errors.ts'
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
  CMD_FLAG_REQ_ONE,
  REPLY_FLAG_DONE,
  REPLY_TYPE_OFFSET_DATA,
  REPLY_TYPE_OFFSET_HOLE,
  REPLY_TYPE_BLOCK_STATUS,
} from '../nbd/protocol.ts'

/** Largest read or block-status span served in one request, bytes (32 MiB: the readers' limit). */
export const NBD_SERVER_MAX_REQUEST = 32 * 1024 * 1024
/** Largest option payload accepted during the handshake, bytes. */
export const MAX_OPTION_BYTES = 64 * 1024
/**
 * Most descriptors in one block status answer. The NBD protocol lets a server describe less than
 * the span asked (the client asks again from where the answer ends), and qemu's client refuses a
 * structured reply payload over 1,000 bytes (`NBD_MAX_MALLOC_PAYLOAD` in qemu's block/nbd.c), as a
 * protocol error that fails the guest's I/O: 4 bytes of context id and 8 per descriptor stay under it.
 */
export const MAX_STATUS_DESCRIPTORS = 100
/** Requests of one connection served at once. */
export const MAX_IN_FLIGHT = 16

const OPT_EXPORT_NAME = 1
const OPT_ABORT = 2
const OPT_LIST = 3
const OPT_INFO = 6
const OPT_LIST_META_CONTEXT = 9

const REP_SERVER = 2
const REP_ERR_UNSUP = 0x80000001
const REP_ERR_INVALID = 0x80000003
const REP_ERR_UNKNOWN = 0x80000006
const REP_ERR_TOO_BIG = 0x80000009

const TFLAG_HAS_FLAGS = 1
const TFLAG_READ_ONLY = 1 << 1
const TFLAG_SEND_FLUSH = 1 << 2
const TFLAG_CAN_MULTI_CONN = 1 << 8

const CMD_WRITE = 1
const CMD_FLUSH = 3
const CMD_TRIM = 4
const CMD_WRITE_ZEROES = 6

const STATE_HOLE = 1
const STATE_ZERO = 2

const EPERM = 1
const EINVAL = 22
const ESHUTDOWN = 108

/** The meta context id of `base:allocation` (any non-zero number the server picks). */
const BASE_ALLOCATION_ID = 1

/** Options of {@link NbdExportServer}. */
export interface NbdExportServerOptions {
  /** Absolute path of the Unix socket (a stale file there is replaced). */
  socketPath: string
  /** The disk served. The server never closes it. */
  reader: DiskReader
  /** What logs and errors call the export (a disk label). */
  label: string
  /** Owner group of the socket (mode 0660): qemu's group; absent: mode 0600 (root only). */
  gid?: number | null
  /** Called when a read starts failing (`waiting: true`, the error) and when reads answer again. */
  onWaiting?(waiting: boolean, error: MigError | null): void
  /** First and longest pause between tries of a failed read, ms (default 1000 and 10000). */
  retryMs?: { first: number; max: number }
}

/** One extent map lookup: the zero/data runs of `[offset, offset+length)`. */
function clip(extents: DiskExtent[], offset: number, length: number): DiskExtent[] {
  const end = offset + length
  const out: DiskExtent[] = []
  // binary search for the first extent ending after `offset`
  let lo = 0
  let hi = extents.length
  while (lo < hi) {
    const mid = (lo + hi) >> 1
    const e = extents[mid]!
    if (e.offset + e.length <= offset) lo = mid + 1
    else hi = mid
  }
  for (let i = lo; i < extents.length; i++) {
    const e = extents[i]!
    if (e.offset >= end) break
    const s = Math.max(e.offset, offset)
    const t = Math.min(e.offset + e.length, end)
    if (t > s) out.push({ offset: s, length: t - s, zero: e.zero })
  }
  return out
}

/**
 * Serves `reader` read-only over NBD on a Unix socket until {@link close}. Several clients may be
 * connected at once (qemu, qemu-img, the guest inspection). `listen()` throws
 * `E_MIG_INTERNAL` when the socket cannot be bound.
 */
export class NbdExportServer {
  private server: Server | null = null
  private readonly sockets = new Set<Socket>()
  private extents: Promise<DiskExtent[]> | null = null
  private closed = false
  private failing = 0
  /** Read requests answered since the start. */
  reads = 0

  constructor(private readonly opts: NbdExportServerOptions) {}

  /** The reader's extents from 0, read once (a reader whose extents fail is served as all data). */
  private map(): Promise<DiskExtent[]> {
    if (!this.extents) {
      this.extents = (async () => {
        const out: DiskExtent[] = []
        try {
          for await (const e of this.opts.reader.extents(0)) {
            const last = out[out.length - 1]
            if (last && last.zero === e.zero && last.offset + last.length === e.offset) last.length += e.length
            else out.push({ ...e })
          }
          return out
        } catch {
          return [{ offset: 0, length: this.opts.reader.size, zero: false }]
        }
      })()
    }
    return this.extents
  }

  /** Binds the socket and starts serving; resolves once clients can connect. */
  async listen(): Promise<void> {
    const path = this.opts.socketPath
    await rm(path, { force: true })
    const server = createServer((s) => this.accept(s))
    server.on('error', () => {})
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject)
      server.listen(path, () => {
        server.off('error', reject)
        resolve()
      })
    }).catch((e: Error) => {
      throw new MigError('E_MIG_INTERNAL', `NBD export of ${this.opts.label}: cannot listen on ${path}: ${e.message}`)
    })
    this.server = server
    try {
      if (this.opts.gid != null) {
        await chown(path, 0, this.opts.gid)
        await chmod(path, 0o660)
      } else await chmod(path, 0o600)
    } catch (e) {
      await this.close()
      throw new MigError('E_MIG_INTERNAL', `NBD export of ${this.opts.label}: ${path}: ${(e as Error).message}`)
    }
    void this.map()
  }

  /** Stops listening, drops every connection and removes the socket; idempotent, never throws. */
  async close(): Promise<void> {
    this.closed = true
    for (const s of this.sockets) s.destroy()
    this.sockets.clear()
    const server = this.server
    this.server = null
    if (server) await new Promise<void>((r) => server.close(() => r()))
    await rm(this.opts.socketPath, { force: true }).catch(() => {})
  }

  private accept(sock: Socket): void {
    if (this.closed) {
      sock.destroy()
      return
    }
    this.sockets.add(sock)
    sock.on('close', () => this.sockets.delete(sock))
    sock.on('error', () => sock.destroy())
    new Connection(this, sock).start()
  }

  /** Reads `[offset, offset+length)`: zero extents without asking the reader, failed reads tried again. */
  async read(offset: number, length: number): Promise<{ data: Buffer | null }> {
    const runs = clip(await this.map(), offset, length)
    if (runs.length > 0 && runs.every((r) => r.zero)) return { data: null }
    const out = Buffer.alloc(length)
    for (const r of runs) {
      if (r.zero) continue
      const got = await this.retrying(() => this.opts.reader.read(r.offset, r.length))
      got.copy(out, r.offset - offset, 0, r.length)
    }
    // a map that does not cover the range (a gap) is read from the reader
    if (runs.length === 0) (await this.retrying(() => this.opts.reader.read(offset, length))).copy(out)
    this.reads++
    return { data: out }
  }

  /** `base:allocation` descriptors of `[offset, offset+length)`: `[length, flags]` pairs. */
  async status(offset: number, length: number): Promise<Array<[number, number]>> {
    const runs = clip(await this.map(), offset, length)
    if (runs.length === 0) return [[length, 0]]
    return runs.map((r) => [r.length, r.zero ? STATE_HOLE | STATE_ZERO : 0])
  }

  private async retrying(fn: () => Promise<Buffer>): Promise<Buffer> {
    const first = this.opts.retryMs?.first ?? 1000
    const max = this.opts.retryMs?.max ?? 10_000
    let pause = first
    let failed = false
    for (;;) {
      if (this.closed) throw new MigError('E_MIG_CANCELLED', `NBD export of ${this.opts.label} closed`)
      try {
        const got = await fn()
        if (failed && --this.failing === 0) this.opts.onWaiting?.(false, null)
        return got
      } catch (e) {
        const err = e instanceof MigError ? e : new MigError('E_MIG_DISK_READ_FAILED', `${this.opts.label}: ${(e as Error).message}`)
        if (!failed) {
          failed = true
          if (this.failing++ === 0) this.opts.onWaiting?.(true, err)
        }
        await new Promise((r) => setTimeout(r, pause))
        pause = Math.min(max, pause * 2)
      }
    }
  }

  /** The export's size in bytes. */
  get size(): number {
    return this.opts.reader.size
  }

  /** Whether the server is closed. */
  get isClosed(): boolean {
    return this.closed
  }
}

/** The byte-stream parser of one client connection. */
class Connection {
  private buf: Buffer = Buffer.alloc(0)
  private phase: 'flags' | 'options' | 'transmission' = 'flags'
  private noZeroes = false
  private structured = false
  private allocationContext = false
  private inFlight = 0
  private dead = false

  constructor(
    private readonly server: NbdExportServer,
    private readonly sock: Socket,
  ) {}

  start(): void {
    const hello = Buffer.alloc(18)
    hello.writeBigUInt64BE(NBDMAGIC, 0)
    hello.writeBigUInt64BE(IHAVEOPT, 8)
    hello.writeUInt16BE(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES, 16)
    this.sock.write(hello)
    this.sock.on('data', (chunk: Buffer) => {
      this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk
      try {
        this.pump()
      } catch {
        this.drop()
      }
    })
  }

  private drop(): void {
    this.dead = true
    this.sock.destroy()
  }

  private take(n: number): Buffer {
    const out = this.buf.subarray(0, n)
    this.buf = this.buf.subarray(n)
    return out
  }

  private pump(): void {
    while (!this.dead) {
      if (this.phase === 'flags') {
        if (this.buf.length < 4) return
        const flags = this.take(4).readUInt32BE(0)
        if (!(flags & FLAG_FIXED_NEWSTYLE)) return this.drop()
        this.noZeroes = (flags & FLAG_NO_ZEROES) !== 0
        this.phase = 'options'
      } else if (this.phase === 'options') {
        if (this.buf.length < 16) return
        if (this.buf.readBigUInt64BE(0) !== IHAVEOPT) return this.drop()
        const option = this.buf.readUInt32BE(8)
        const length = this.buf.readUInt32BE(12)
        if (length > MAX_OPTION_BYTES) return this.drop()
        if (this.buf.length < 16 + length) return
        this.take(16)
        this.option(option, Buffer.from(this.take(length)))
      } else {
        if (this.buf.length < 28) return
        if (this.buf.readUInt32BE(0) !== REQUEST_MAGIC) return this.drop()
        const type = this.buf.readUInt16BE(6)
        const length = this.buf.readUInt32BE(24)
        const withPayload = type === CMD_WRITE
        if (withPayload && length > NBD_SERVER_MAX_REQUEST) return this.drop()
        if (this.buf.length < 28 + (withPayload ? length : 0)) return
        const head = Buffer.from(this.take(28))
        if (withPayload) this.take(length)
        this.request(head)
        if (this.inFlight >= MAX_IN_FLIGHT) this.sock.pause()
      }
    }
  }

  private optReply(option: number, type: number, data: Buffer = Buffer.alloc(0)): void {
    const h = Buffer.alloc(20)
    h.writeBigUInt64BE(REPLY_MAGIC, 0)
    h.writeUInt32BE(option, 8)
    h.writeUInt32BE(type, 12)
    h.writeUInt32BE(data.length, 16)
    this.sock.write(data.length ? Buffer.concat([h, data]) : h)
  }

  private transmissionFlags(): number {
    return TFLAG_HAS_FLAGS | TFLAG_READ_ONLY | TFLAG_SEND_FLUSH | TFLAG_CAN_MULTI_CONN
  }

  /** The export name of an INFO/GO or meta-context request, or null when malformed. */
  private static nameOf(data: Buffer): { name: string; rest: Buffer } | null {
    if (data.length < 4) return null
    const n = data.readUInt32BE(0)
    if (4 + n > data.length) return null
    return { name: data.subarray(4, 4 + n).toString('utf8'), rest: data.subarray(4 + n) }
  }

  private option(option: number, data: Buffer): void {
    const size = this.server.size
    switch (option) {
      case OPT_EXPORT_NAME: {
        if (data.length > 0) return this.drop() // the only export is ""; no error reply exists for this option
        const r = Buffer.alloc(this.noZeroes ? 10 : 134)
        r.writeBigUInt64BE(BigInt(size), 0)
        r.writeUInt16BE(this.transmissionFlags(), 8)
        this.sock.write(r)
        this.phase = 'transmission'
        return
      }
      case OPT_ABORT:
        this.optReply(option, REP_ACK)
        this.sock.end()
        this.dead = true
        return
      case OPT_LIST: {
        if (data.length) return this.optReply(option, REP_ERR_INVALID)
        this.optReply(option, REP_SERVER, Buffer.alloc(4))
        return this.optReply(option, REP_ACK)
      }
      case OPT_STRUCTURED_REPLY:
        if (data.length) return this.optReply(option, REP_ERR_INVALID)
        this.structured = true
        return this.optReply(option, REP_ACK)
      case OPT_INFO:
      case OPT_GO: {
        const parsed = Connection.nameOf(data)
        if (!parsed || parsed.rest.length < 2 || parsed.rest.length !== 2 + parsed.rest.readUInt16BE(0) * 2) return this.optReply(option, REP_ERR_INVALID)
        if (parsed.name !== '') return this.optReply(option, REP_ERR_UNKNOWN, Buffer.from('the only export is ""'))
        const exp = Buffer.alloc(12)
        exp.writeUInt16BE(INFO_EXPORT, 0)
        exp.writeBigUInt64BE(BigInt(size), 2)
        exp.writeUInt16BE(this.transmissionFlags(), 10)
        this.optReply(option, REP_INFO, exp)
        const bs = Buffer.alloc(14)
        bs.writeUInt16BE(INFO_BLOCK_SIZE, 0)
        bs.writeUInt32BE(1, 2)
        bs.writeUInt32BE(4096, 6)
        bs.writeUInt32BE(NBD_SERVER_MAX_REQUEST, 10)
        this.optReply(option, REP_INFO, bs)
        this.optReply(option, REP_ACK)
        if (option === OPT_GO) this.phase = 'transmission'
        return
      }
      case OPT_LIST_META_CONTEXT:
      case OPT_SET_META_CONTEXT: {
        const parsed = Connection.nameOf(data)
        if (!parsed || parsed.rest.length < 4) return this.optReply(option, REP_ERR_INVALID)
        if (option === OPT_SET_META_CONTEXT && !this.structured) return this.optReply(option, REP_ERR_INVALID, Buffer.from('structured replies first'))
        if (parsed.name !== '') return this.optReply(option, REP_ERR_UNKNOWN)
        const count = parsed.rest.readUInt32BE(0)
        let at = 4
        const queries: string[] = []
        for (let i = 0; i < count; i++) {
          if (at + 4 > parsed.rest.length) return this.optReply(option, REP_ERR_INVALID)
          const n = parsed.rest.readUInt32BE(at)
          if (at + 4 + n > parsed.rest.length) return this.optReply(option, REP_ERR_INVALID)
          queries.push(parsed.rest.subarray(at + 4, at + 4 + n).toString('utf8'))
          at += 4 + n
        }
        if (at !== parsed.rest.length) return this.optReply(option, REP_ERR_INVALID)
        const wanted = option === OPT_LIST_META_CONTEXT && count === 0 ? true : queries.some((q) => q === 'base:allocation' || q === 'base:')
        if (option === OPT_SET_META_CONTEXT) this.allocationContext = wanted
        if (wanted) {
          const name = Buffer.from('base:allocation')
          const r = Buffer.alloc(4 + name.length)
          r.writeUInt32BE(BASE_ALLOCATION_ID, 0)
          name.copy(r, 4)
          this.optReply(option, REP_META_CONTEXT, r)
        }
        return this.optReply(option, REP_ACK)
      }
      default:
        return this.optReply(option, data.length > MAX_OPTION_BYTES ? REP_ERR_TOO_BIG : REP_ERR_UNSUP)
    }
  }

  private simple(cookie: Buffer, error: number, data?: Buffer): void {
    const h = Buffer.alloc(16)
    h.writeUInt32BE(SIMPLE_REPLY_MAGIC, 0)
    h.writeUInt32BE(error, 4)
    cookie.copy(h, 8)
    this.write(data ? [h, data] : [h])
  }

  private chunk(cookie: Buffer, type: number, payload: Buffer[], done = true): void {
    const len = payload.reduce((s, b) => s + b.length, 0)
    const h = Buffer.alloc(20)
    h.writeUInt32BE(STRUCTURED_REPLY_MAGIC, 0)
    h.writeUInt16BE(done ? REPLY_FLAG_DONE : 0, 4)
    h.writeUInt16BE(type, 6)
    cookie.copy(h, 8)
    h.writeUInt32BE(len, 16)
    this.write([h, ...payload])
  }

  private write(parts: Buffer[]): void {
    if (this.dead || this.sock.destroyed) return
    this.sock.write(parts.length === 1 ? parts[0]! : Buffer.concat(parts))
  }

  private finish(): void {
    this.inFlight--
    if (this.inFlight < MAX_IN_FLIGHT && !this.dead) this.sock.resume()
  }

  private request(head: Buffer): void {
    const flags = head.readUInt16BE(4)
    const type = head.readUInt16BE(6)
    const cookie = Buffer.from(head.subarray(8, 16))
    const offset = Number(head.readBigUInt64BE(16))
    const length = head.readUInt32BE(24)
    const size = this.server.size
    const inRange = offset <= size && length <= size - offset
    switch (type) {
      case CMD_DISC:
        this.dead = true
        this.sock.end()
        return
      case CMD_FLUSH:
        return this.simple(cookie, 0)
      case CMD_WRITE:
      case CMD_TRIM:
      case CMD_WRITE_ZEROES:
        return this.simple(cookie, EPERM)
      case CMD_READ: {
        if (!inRange || length > NBD_SERVER_MAX_REQUEST) return this.simple(cookie, EINVAL)
        if (length === 0) return this.structured ? this.chunk(cookie, 0, []) : this.simple(cookie, 0)
        this.inFlight++
        this.server
          .read(offset, length)
          .then(({ data }) => {
            const off = Buffer.alloc(8)
            off.writeBigUInt64BE(BigInt(offset))
            if (!this.structured) return this.simple(cookie, 0, data ?? Buffer.alloc(length))
            if (data) return this.chunk(cookie, REPLY_TYPE_OFFSET_DATA, [off, data])
            const len = Buffer.alloc(4)
            len.writeUInt32BE(length)
            return this.chunk(cookie, REPLY_TYPE_OFFSET_HOLE, [off, len])
          })
          .catch(() => this.simpleOrError(cookie, ESHUTDOWN))
          .finally(() => this.finish())
        return
      }
      case CMD_BLOCK_STATUS: {
        if (!this.structured || !this.allocationContext || !inRange || length === 0) return this.simpleOrError(cookie, EINVAL)
        this.inFlight++
        this.server
          .status(offset, Math.min(length, NBD_SERVER_MAX_REQUEST))
          .then((all) => {
            const descs = all.slice(0, flags & CMD_FLAG_REQ_ONE ? 1 : MAX_STATUS_DESCRIPTORS)
            const body = Buffer.alloc(4 + descs.length * 8)
            body.writeUInt32BE(BASE_ALLOCATION_ID, 0)
            descs.forEach(([l, f], i) => {
              body.writeUInt32BE(l, 4 + i * 8)
              body.writeUInt32BE(f, 8 + i * 8)
            })
            this.chunk(cookie, REPLY_TYPE_BLOCK_STATUS, [body])
          })
          .catch(() => this.simpleOrError(cookie, EINVAL))
          .finally(() => this.finish())
        return
      }
      default:
        return this.simpleOrError(cookie, EINVAL)
    }
  }

  /** An error reply: a simple one (allowed without payload under structured replies too). */
  private simpleOrError(cookie: Buffer, error: number): void {
    this.simple(cookie, error)
  }
}
