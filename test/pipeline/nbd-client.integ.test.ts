/**
 * NBD client: protocol handling against a scripted fake server (structured replies, holes,
 * errors, violations, handle matching) and against real qemu-nbd.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, writeFileSync } from 'node:fs'
import { createServer, type Server, type Socket } from 'node:net'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { NbdClient, NBD_STATE_HOLE, NBD_STATE_ZERO } from '../../lib/nbd/client.ts'
import { startQemuNbd } from '../../lib/pipeline/qemu-nbd.ts'
import { tempDir } from '../helpers/tmp.ts'

const tmp = tempDir('mig-nbd-')
afterAll(() => tmp.cleanup())

type Req = { type: number; handle: Buffer; offset: number; length: number }
type Script = {
  structured?: boolean
  size?: number
  /** Answers one transmission request by writing to the socket. */
  onRequest(sock: Socket, req: Req): void
  badMagic?: boolean
}

let n = 0
/** A scripted newstyle NBD server on a Unix socket. */
async function fakeServer(script: Script): Promise<{ socket: string; server: Server }> {
  const socket = path.join(tmp.dir, `fake${n++}.sock`)
  const server = createServer((sock) => {
    let buf = Buffer.alloc(0)
    let phase: 'flags' | 'opts' | 'tx' = 'flags'
    const hello = Buffer.alloc(18)
    hello.write(script.badMagic ? 'NOTNBD!!' : 'NBDMAGIC', 0, 'latin1')
    hello.writeBigUInt64BE(0x49484156454f5054n, 8)
    hello.writeUInt16BE(3, 16)
    sock.write(hello)
    const optReply = (opt: number, type: number, data: Buffer = Buffer.alloc(0)) => {
      const h = Buffer.alloc(20)
      h.writeBigUInt64BE(0x0003e889045565a9n, 0)
      h.writeUInt32BE(opt, 8)
      h.writeUInt32BE(type, 12)
      h.writeUInt32BE(data.length, 16)
      sock.write(Buffer.concat([h, data]))
    }
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d])
      for (;;) {
        if (phase === 'flags') {
          if (buf.length < 4) return
          buf = buf.subarray(4)
          phase = 'opts'
        } else if (phase === 'opts') {
          if (buf.length < 16) return
          const len = buf.readUInt32BE(12)
          if (buf.length < 16 + len) return
          const opt = buf.readUInt32BE(8)
          buf = buf.subarray(16 + len)
          if (opt === 8) optReply(8, script.structured === false ? 0x80000001 : 1)
          else if (opt === 10) {
            const d2 = Buffer.alloc(4 + 15)
            d2.writeUInt32BE(7, 0)
            d2.write('base:allocation', 4, 'ascii')
            optReply(10, 4, d2)
            optReply(10, 1)
          } else if (opt === 7) {
            const info = Buffer.alloc(12)
            info.writeUInt16BE(0, 0)
            info.writeBigUInt64BE(BigInt(script.size ?? 1 << 20), 2)
            info.writeUInt16BE(1 | 2, 10)
            optReply(7, 3, info)
            optReply(7, 1)
            phase = 'tx'
          } else optReply(opt, 0x80000001)
        } else {
          if (buf.length < 28) return
          const req = {
            type: buf.readUInt16BE(6),
            handle: Buffer.from(buf.subarray(8, 16)),
            offset: Number(buf.readBigUInt64BE(16)),
            length: buf.readUInt32BE(24),
          }
          buf = buf.subarray(28)
          if (req.type === 2) return sock.end()
          script.onRequest(sock, req)
        }
      }
    })
    sock.on('error', () => {})
  })
  await new Promise<void>((r) => server.listen(socket, r))
  return { socket, server }
}

/** A structured reply chunk. */
function chunk(handle: Buffer, flags: number, type: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(20)
  h.writeUInt32BE(0x668e33ef, 0)
  h.writeUInt16BE(flags, 4)
  h.writeUInt16BE(type, 6)
  handle.copy(h, 8)
  h.writeUInt32BE(payload.length, 16)
  return Buffer.concat([h, payload])
}
const u64 = (v: number) => {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(BigInt(v))
  return b
}
const u32 = (v: number) => {
  const b = Buffer.alloc(4)
  b.writeUInt32BE(v)
  return b
}

async function expectCode(p: Promise<unknown>, code: string): Promise<MigError> {
  let err: unknown
  try {
    await p
  } catch (e) {
    err = e
  }
  expect(err).toBeInstanceOf(MigError)
  expect((err as MigError).code).toBe(code as MigError['code'])
  return err as MigError
}

describe('NbdClient against a scripted server', () => {
  const data = randomBytes(1 << 20)

  test('structured read reassembled from out-of-order data and hole chunks; replies matched by handle', async () => {
    const { socket, server } = await fakeServer({
      onRequest(sock, req) {
        if (req.type !== 0) throw new Error('unexpected')
        // [o, o+len): first half as hole, second half as data, sent second-half first.
        const half = req.length / 2
        const hole = Buffer.concat([u64(req.offset), u32(half)])
        const dat = Buffer.concat([u64(req.offset + half), data.subarray(req.offset + half, req.offset + req.length)])
        // Delay the first request's reply so the second overtakes it.
        const send = () => sock.write(Buffer.concat([chunk(req.handle, 0, 1, dat), chunk(req.handle, 1, 2, hole)]))
        if (req.offset === 0) setTimeout(send, 30)
        else send()
      },
    })
    const c = await NbdClient.connect(socket, { label: 'fake' })
    expect(c.size).toBe(1 << 20)
    expect(c.structured).toBe(true)
    expect(c.baseAllocation).toBe(true)
    const [a, b] = await Promise.all([c.read(0, 65536), c.read(65536, 65536)])
    expect(a.subarray(0, 32768).equals(Buffer.alloc(32768))).toBe(true)
    expect(a.subarray(32768).equals(data.subarray(32768, 65536))).toBe(true)
    expect(b.subarray(0, 32768).equals(Buffer.alloc(32768))).toBe(true)
    expect(b.subarray(32768).equals(data.subarray(98304, 131072))).toBe(true)
    await c.disconnect()
    server.close()
  })

  test('block status descriptors become extents; the last one is clipped to the request', async () => {
    const { socket, server } = await fakeServer({
      onRequest(sock, req) {
        const p = Buffer.concat([u32(7), u32(4096), u32(0), u32(8192), u32(NBD_STATE_HOLE | NBD_STATE_ZERO), u32(1 << 20), u32(0)])
        sock.write(chunk(req.handle, 1, 5, p))
      },
    })
    const c = await NbdClient.connect(socket)
    const ext = await c.blockStatus(0, 65536)
    expect(ext).toEqual([
      { offset: 0, length: 4096, flags: 0 },
      { offset: 4096, length: 8192, flags: 3 },
      { offset: 12288, length: 65536 - 12288, flags: 0 },
    ])
    await c.disconnect()
    server.close()
  })

  test('an error chunk fails that request with E_MIG_DISK_READ_FAILED naming the offset; others go on', async () => {
    const { socket, server } = await fakeServer({
      onRequest(sock, req) {
        if (req.offset === 4096) {
          const msg = Buffer.from('bad sector')
          sock.write(chunk(req.handle, 1, 0x8002, Buffer.concat([u32(5), Buffer.from([0, msg.length]), msg, u64(4096 + 512)])))
        } else sock.write(chunk(req.handle, 1, 1, Buffer.concat([u64(req.offset), data.subarray(req.offset, req.offset + req.length)])))
      },
    })
    const c = await NbdClient.connect(socket, { label: 'disk.qcow2' })
    const err = await expectCode(c.read(4096, 4096), 'E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('disk.qcow2')
    expect(err.message).toContain('EIO')
    expect(err.message).toContain('bad sector')
    expect(err.message).toContain('4608')
    expect((await c.read(8192, 100)).equals(data.subarray(8192, 8292))).toBe(true)
    await c.disconnect()
    server.close()
  })

  test('a reply for an unknown handle is a protocol violation that fails every pending request', async () => {
    const { socket, server } = await fakeServer({
      onRequest(sock, req) {
        const bogus = Buffer.from(req.handle)
        bogus.writeUInt32BE(999, 4)
        sock.write(chunk(bogus, 1, 0, Buffer.alloc(0)))
      },
    })
    const c = await NbdClient.connect(socket, { label: 'fake' })
    const err = await expectCode(c.read(0, 512), 'E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('protocol violation')
    expect(err.message).toContain('offset 0')
    await expectCode(c.read(512, 512), 'E_MIG_DISK_READ_FAILED')
    server.close()
  })

  // Data chunks (type 1, flag DONE) that break the read of 512 bytes at 0: the payload's offset and length, and the words of the error.
  const violations = [
    { name: 'data chunk outside the request is a violation', at: (offset: number) => offset + 4096, bytes: 16, says: 'outside the read' },
    { name: 'a reply that does not cover the whole read is a violation', at: (offset: number) => offset, bytes: 100, says: 'answered 100 bytes' },
  ]
  for (const v of violations) {
    test(v.name, async () => {
      const { socket, server } = await fakeServer({
        onRequest(sock, req) {
          sock.write(chunk(req.handle, 1, 1, Buffer.concat([u64(v.at(req.offset)), Buffer.alloc(v.bytes)])))
        },
      })
      const c = await NbdClient.connect(socket)
      const err = await expectCode(c.read(0, 512), 'E_MIG_DISK_READ_FAILED')
      expect(err.message).toContain(v.says)
      server.close()
    })
  }

  test('without structured replies, simple replies carry the data', async () => {
    const { socket, server } = await fakeServer({
      structured: false,
      onRequest(sock, req) {
        const h = Buffer.alloc(16)
        h.writeUInt32BE(0x67446698, 0)
        req.handle.copy(h, 8)
        sock.write(Buffer.concat([h, data.subarray(req.offset, req.offset + req.length)]))
      },
    })
    const c = await NbdClient.connect(socket)
    expect(c.structured).toBe(false)
    expect(c.baseAllocation).toBe(false)
    expect((await c.read(1000, 3000)).equals(data.subarray(1000, 4000))).toBe(true)
    expect(await c.blockStatus(0, 4096)).toEqual([{ offset: 0, length: 4096, flags: 0 }])
    await c.disconnect()
    server.close()
  })

  test('a bad server magic fails the handshake', async () => {
    const { socket, server } = await fakeServer({ badMagic: true, onRequest() {} })
    const err = await expectCode(NbdClient.connect(socket, { label: 'x.vmdk' }), 'E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('x.vmdk')
    expect(err.message).toContain('magic')
    server.close()
  })

  test('requests beyond the export or over 32 MiB are refused before sending', async () => {
    const { socket, server } = await fakeServer({ size: 64 << 20, onRequest() {} })
    const c = await NbdClient.connect(socket)
    expect((await expectCode(c.read(63 << 20, 2 << 20), 'E_MIG_DISK_READ_FAILED')).message).toContain('outside the export')
    expect((await expectCode(c.read(0, 33 << 20), 'E_MIG_DISK_READ_FAILED')).message).toContain('request bound')
    await c.disconnect()
    server.close()
  })

  test('a socket nobody listens on is E_MIG_DISK_READ_FAILED after the timeout', async () => {
    const err = await expectCode(NbdClient.connect(path.join(tmp.dir, 'none.sock'), { timeoutMs: 100 }), 'E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('none.sock')
  })

  test('a socket file its server left behind (it exited): no more attempts once serverGone() says so', async () => {
    // qemu-nbd opens its socket before the image and exits when it refuses the image.
    const stale = path.join(tmp.dir, 'stale.sock')
    execFileSync('python3', ['-c', 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])', stale])
    expect(existsSync(stale)).toBe(true)
    const t0 = performance.now()
    await expectCode(NbdClient.connect(stale, { timeoutMs: 5000, serverGone: () => true }), 'E_MIG_DISK_READ_FAILED')
    expect(performance.now() - t0).toBeLessThan(1000)
    // Without it, the client keeps trying until its timeout.
    const t1 = performance.now()
    await expectCode(NbdClient.connect(stale, { timeoutMs: 300 }), 'E_MIG_DISK_READ_FAILED')
    expect(performance.now() - t1).toBeGreaterThanOrEqual(250)
  })
})

describe('NbdClient against qemu-nbd', () => {
  test('negotiates structured replies and base:allocation; reads and block status match the image', async () => {
    const raw = path.join(tmp.dir, 'q.raw')
    const data = randomBytes(192 * 1024)
    const img = Buffer.alloc(4 << 20)
    data.copy(img, 1 << 20)
    writeFileSync(raw, img)
    const qcow = path.join(tmp.dir, 'q.qcow2')
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, qcow])
    const srv = await startQemuNbd({ path: qcow, format: 'qcow2' })
    try {
      const c = await NbdClient.connect(srv.socketPath)
      expect(c.size).toBe(4 << 20)
      expect(c.structured).toBe(true)
      expect(c.baseAllocation).toBe(true)
      const ext = await c.blockStatus(0, 4 << 20)
      const zero = ext.filter((e) => e.flags & NBD_STATE_ZERO).reduce((a, e) => a + e.length, 0)
      expect(zero).toBe((4 << 20) - 192 * 1024)
      const reads = await Promise.all([c.read(0, 2 << 20), c.read(2 << 20, 2 << 20)])
      expect(Buffer.concat(reads).equals(img)).toBe(true)
      await c.disconnect()
    } finally {
      await srv.close()
    }
    expect(srv.exited()).toBe(true)
  })
})

describe('qemu-nbd process handling', () => {
  test('an AbortSignal kills qemu-nbd and removes its socket; close is idempotent', async () => {
    const raw = path.join(tmp.dir, 'abort.raw')
    writeFileSync(raw, Buffer.alloc(1 << 20))
    const ac = new AbortController()
    const srv = await startQemuNbd({ path: raw, format: 'raw', signal: ac.signal })
    expect(existsSync(srv.socketPath)).toBe(true)
    expect(() => process.kill(srv.pid, 0)).not.toThrow()
    ac.abort()
    for (let i = 0; i < 100 && !srv.exited(); i++) await new Promise((r) => setTimeout(r, 20))
    expect(srv.exited()).toBe(true)
    await srv.close()
    expect(existsSync(srv.socketPath)).toBe(false)
    await srv.close()
  })

  test('a missing qemu-nbd binary or an image qemu refuses is E_MIG_DISK_READ_FAILED with the reason', async () => {
    const raw = path.join(tmp.dir, 'plain.raw')
    writeFileSync(raw, Buffer.alloc(4096))
    const e1 = await expectCode(startQemuNbd({ path: raw, format: 'raw', qemuNbdPath: path.join(tmp.dir, 'no-such-qemu-nbd') }), 'E_MIG_DISK_READ_FAILED')
    expect(e1.message).toContain('qemu-nbd')
    const e2 = await expectCode(startQemuNbd({ path: raw, format: 'qcow2', label: 'plain.raw as qcow2' }), 'E_MIG_DISK_READ_FAILED')
    expect(e2.message).toContain('plain.raw as qcow2')
    expect(e2.message).toContain('qcow2')
  })
})
