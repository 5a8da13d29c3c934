/**
 * The datastore transport (lib/http/range-http.ts) against plain TCP servers on
 * 127.0.0.1 that write exactly the bytes each case needs (stand-ins for a datastore `/folder`
 * endpoint; TLS and the pinned thumbprint are exercised through the vCenter simulator in
 * vim-data.test.ts and live-vim.test.ts): bodies framed by Content-Length, chunked and by the
 * connection's close land in the caller's buffer; connections are kept alive, bounded and
 * replaced when the server closed them while idle; error pages are not read; hostile answers
 * (oversized head or body, garbage, a close in the middle, silence) fail with a message and
 * nothing hangs.
 */
import { afterEach, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { createServer, type Server, type Socket } from 'node:net'
import { DatastoreHttp, openDatastoreVmdk } from '../../lib/adapters/vim/datastore.ts'
import { MAX_HEAD_BYTES, RangeHttp } from '../../lib/http/range-http.ts'
import type { VimClient } from '../../lib/adapters/vim/soap.ts'
import { thrown } from '../helpers/tmp.ts'

/** A server answering each request (its head, as text) with `answer`'s bytes; counts connections. */
async function serve(
  answer: (req: string, n: number, s: Socket) => Buffer | string | null,
): Promise<{ origin: string; connections: () => number; server: Server }> {
  let connections = 0
  let requests = 0
  const server = createServer((s) => {
    connections++
    let buf = ''
    s.on('data', (d) => {
      buf += d.toString('latin1')
      for (let end = buf.indexOf('\r\n\r\n'); end >= 0; end = buf.indexOf('\r\n\r\n')) {
        const req = buf.slice(0, end)
        buf = buf.slice(end + 4)
        const a = answer(req, ++requests, s)
        if (a !== null) s.write(a)
      }
    })
    s.on('error', () => {})
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  const port = (server.address() as { port: number }).port
  servers.push(server)
  return { origin: `http://127.0.0.1:${port}`, connections: () => connections, server }
}

const servers: Server[] = []
const pools: RangeHttp[] = []
afterEach(async () => {
  for (const p of pools.splice(0)) p.close()
  for (const s of servers.splice(0)) await new Promise((r) => s.close(r))
})

function pool(origin: string, connections = 8): RangeHttp {
  const p = new RangeHttp({ origin, trust: {}, connectTimeoutMs: 2000, connections })
  pools.push(p)
  return p
}

const MiB = 1024 * 1024
const head = (status: string, fields: string[]) => `HTTP/1.1 ${status}\r\n${fields.map((f) => `${f}\r\n`).join('')}\r\n`

describe('RangeHttp', () => {
  test('Content-Length, chunked and close-framed bodies land in the caller buffer; one kept-alive connection serves many requests', async () => {
    const data = randomBytes(1024 * 1024 + 17)
    const srv = await serve((req) => {
      const m = /range: bytes=(\d+)-(\d+)/.exec(req)!
      const part = data.subarray(Number(m[1]), Number(m[2]) + 1)
      return Buffer.concat([
        Buffer.from(head('206 Partial Content', [`Content-Length: ${part.length}`, `Content-Range: bytes ${m[1]}-${m[2]}/${data.length}`])),
        part,
      ])
    })
    const p = pool(srv.origin)
    const into = Buffer.alloc(600 * 1024)
    for (const [o, l] of [
      [0, 1],
      [5, 512 * 1024],
      [1024 * 1024, 17],
    ] as const) {
      const a = await p.get('/folder/d.vmdk', { range: `bytes=${o}-${o + l - 1}` }, { max: l, into, timeoutMs: 5000 })
      expect([a.status, a.headers['content-range'], a.body.equals(data.subarray(o, o + l)), a.body.buffer === into.buffer]).toEqual([
        206,
        `bytes ${o}-${o + l - 1}/${data.length}`,
        true,
        true,
      ])
    }
    expect(srv.connections()).toBe(1)
    // without a buffer: a new one of the body's size
    const own = await p.get('/x', { range: 'bytes=0-99' }, { max: 100, timeoutMs: 5000 })
    expect(own.body.equals(data.subarray(0, 100))).toBe(true)

    // chunked, in odd chunk sizes with an extension and a trailer, written byte by byte in parts
    const chunked = await serve((_req, _n, s) => {
      const body = data.subarray(0, 70_001)
      const parts = [Buffer.from(head('200 OK', ['Transfer-Encoding: chunked']))]
      for (let at = 0; at < body.length; ) {
        const n = Math.min(body.length - at, 1 + ((at * 7919) % 30_000))
        parts.push(Buffer.from(`${n.toString(16)};ext=1\r\n`), body.subarray(at, at + n), Buffer.from('\r\n'))
        at += n
      }
      parts.push(Buffer.from('0\r\nx-trailer: 1\r\n\r\n'))
      const all = Buffer.concat(parts)
      for (let at = 0; at < all.length; at += 4093) s.write(all.subarray(at, at + 4093))
      return null
    })
    const c = await pool(chunked.origin).get('/c', {}, { max: 70_001, into, timeoutMs: 5000 })
    expect([c.status, c.body.length, c.body.equals(data.subarray(0, 70_001))]).toEqual([200, 70_001, true])

    // a head whose CR LF CR LF is split across reads
    const split = await serve((_req, _n, s) => {
      s.write('HTTP/1.1 206 Partial Content\r\nContent-Length: 4\r\n\r')
      setTimeout(() => s.write('\nab'), 30)
      setTimeout(() => s.write('cd'), 60)
      return null
    })
    const sp = await pool(split.origin).get('/s', {}, { max: 4, timeoutMs: 5000 })
    expect([sp.status, sp.headers['content-length'], sp.body.toString()]).toEqual([206, '4', 'abcd'])

    // no framing: the body ends when the server closes
    const closing = await serve((_req, _n, s) => {
      s.end(Buffer.concat([Buffer.from('HTTP/1.0 200 OK\r\n\r\n'), data.subarray(0, 3000)]))
      return null
    })
    const e = await pool(closing.origin).get('/e', {}, { max: 4096, timeoutMs: 5000 })
    expect(e.body.equals(data.subarray(0, 3000))).toBe(true)
  })

  test('error pages are not read; at most `connections` sockets; an idle connection closed by the server is replaced', async () => {
    let dropped = false
    const srv = await serve((req, _n, s) => {
      if (req.includes('/missing')) return head('404 Not Found', ['Content-Length: 100000']) + 'x'.repeat(100_000)
      if (req.includes('/a')) setTimeout(() => s.end(), 50) // answers, then closes the kept-alive connection while idle
      if (req.includes('/c') && !dropped) {
        // the race a keep-alive timeout makes: the request met a connection the server was closing
        dropped = true
        s.destroy()
        return null
      }
      return head('206 Partial Content', ['Content-Length: 4']) + 'abcd'
    })
    const p = pool(srv.origin, 3)
    const missing = await p.get('/missing', {}, { max: 1, timeoutMs: 5000 })
    expect([missing.status, missing.body.length, srv.connections()]).toEqual([404, 0, 1])
    expect((await p.get('/a', {}, { max: 4, timeoutMs: 5000 })).body.toString()).toBe('abcd')
    await new Promise((r) => setTimeout(r, 200))
    // the 404's connection was closed by the client, /a's by the server while idle: a new one
    expect((await p.get('/b', {}, { max: 4, timeoutMs: 5000 })).body.toString()).toBe('abcd')
    expect(srv.connections()).toBe(3)
    // /b's connection is reused for /c and dropped under it: sent again on a new connection
    expect((await p.get('/c', {}, { max: 4, timeoutMs: 5000 })).body.toString()).toBe('abcd')
    expect([dropped, srv.connections()]).toEqual([true, 4])
    const before = srv.connections()
    const many = await Promise.all(Array.from({ length: 20 }, (_, i) => p.get(`/p${i}`, {}, { max: 4, timeoutMs: 5000 })))
    expect(many.every((a) => a.body.toString() === 'abcd')).toBe(true)
    expect(srv.connections() - before).toBeLessThanOrEqual(3)
  })

  test('a body read in place: parts sent after the head land in the caller buffer; once an answer timed out, its late bytes never reach that buffer', async () => {
    const data = randomBytes(256 * 1024)
    const srv = await serve((req, _n, s) => {
      const slow = req.includes('/slow')
      s.write(head('206 Partial Content', [`Content-Length: ${data.length}`]))
      setTimeout(() => s.write(data.subarray(0, 1000)), 30)
      setTimeout(() => s.write(data.subarray(1000)), slow ? 600 : 60)
      return null
    })
    const p = pool(srv.origin, 1)
    const into = Buffer.alloc(data.length + 10, 0xee)
    const a = await p.get('/ok', {}, { max: data.length, into, timeoutMs: 5000 })
    expect([a.body.equals(data), a.body.buffer === into.buffer, into.subarray(data.length).every((b) => b === 0xee)]).toEqual([true, true, true])
    into.fill(0xee)
    expect((await thrown(() => p.get('/slow', {}, { max: data.length, into, timeoutMs: 300 }))).message).toContain('no complete answer within 300 ms')
    // the caller owns its buffer again: what the server sends later lands nowhere
    into.fill(0x55)
    await Bun.sleep(500)
    expect(into.every((b) => b === 0x55)).toBe(true)
    expect((await p.get('/ok', {}, { max: data.length, into, timeoutMs: 5000 })).body.equals(data)).toBe(true)
  })

  test('hostile answers fail with a message, within the timeout, and the pool goes on', async () => {
    const cases: Record<string, (s: Socket) => string | Buffer | null> = {
      '/big-head': () => `HTTP/1.1 200 OK\r\nx: ${'a'.repeat(MAX_HEAD_BYTES)}\r\n\r\n`,
      '/garbage': () => 'SSH-2.0-OpenSSH_9.2\r\n\r\n',
      '/long-body': () => head('200 OK', ['Content-Length: 10']) + '0123456789',
      '/over-chunked': () => `${head('200 OK', ['Transfer-Encoding: chunked'])}8\r\n01234567\r\n8\r\n01234567\r\n0\r\n\r\n`,
      '/bad-chunk': () => `${head('200 OK', ['Transfer-Encoding: chunked'])}zz\r\n`,
      '/bad-length': () => head('200 OK', ['Content-Length: -1']),
      '/gzip': () => head('200 OK', ['Transfer-Encoding: gzip']),
      '/cut': (s) => {
        s.end(`${head('206 Partial Content', ['Content-Length: 8'])}part`)
        return null
      },
      '/silence': () => null,
      '/extra': () => `${head('200 OK', ['Content-Length: 2'])}okHTTP/1.1 200 OK\r\n`,
    }
    const srv = await serve((req, _n, s) => cases[/^GET (\S+)/.exec(req)![1]!]!(s))
    const p = pool(srv.origin)
    const out: Record<string, string> = {}
    const t0 = Date.now()
    for (const path of Object.keys(cases)) out[path] = (await thrown(() => p.get(path, {}, { max: 8, timeoutMs: 400 }))).message
    expect(Date.now() - t0).toBeLessThan(5000)
    expect(out['/big-head']).toContain(`over ${MAX_HEAD_BYTES} bytes`)
    expect(out['/garbage']).toContain('not an HTTP/1.x status line')
    expect(out['/long-body']).toContain('more than the 8 bytes asked for')
    expect(out['/over-chunked']).toContain('more than the 8 bytes asked for')
    expect(out['/bad-chunk']).toContain('malformed chunk size')
    expect(out['/bad-length']).toContain('Content-Length "-1"')
    expect(out['/gzip']).toContain('is not chunked')
    expect(out['/cut']).toContain('closed the connection in the middle of its answer')
    expect(out['/silence']).toContain('no complete answer within 400 ms')
    expect(out['/extra']).toContain('bytes after the end of the answer')
    const err = await thrown(() => p.get('/long-body', {}, { max: 8, timeoutMs: 400 }))
    expect((err as { code?: string }).code).toBe('E_MIG_DISK_READ_FAILED')
    // header injection is refused before anything is sent
    expect((await thrown(() => p.get('/x', { cookie: 'a\r\nx: y' }, { max: 8, timeoutMs: 400 }))).message).toContain('control characters')
    // nothing listening: a connect error, not a hang
    const dead = pool('http://127.0.0.1:1')
    expect((await thrown(() => dead.get('/x', {}, { max: 8, timeoutMs: 400 }))).message).toMatch(/ECONNREFUSED|refused/i)
  })
})

test('a server that stops: its idle connections and failed connects free their places, every request waiting for one fails, none hangs; the pool serves again once it listens', async () => {
  const open = new Set<Socket>()
  const { origin, server } = await serve((_req, _n, s) => (open.add(s), head('206 Partial Content', ['Content-Length: 2']) + 'ok'))
  const port = (server.address() as { port: number }).port
  const p = pool(origin, 2)
  // both connections made, then idle in the pool when the server goes away
  await Promise.all([p.get('/x', {}, { max: 2, timeoutMs: 5000 }), p.get('/x', {}, { max: 2, timeoutMs: 5000 })])
  for (const s of open) s.destroy()
  await new Promise((r) => server.close(r))
  servers.splice(servers.indexOf(server), 1)
  await Bun.sleep(50)
  // more requests than connections: those queued for a place must learn of the failed connects
  const settled = await Promise.allSettled(Array.from({ length: 6 }, () => p.get('/x', {}, { max: 2, timeoutMs: 5000 })))
  expect(settled.map((r) => r.status)).toEqual(Array(6).fill('rejected'))
  const again = createServer((s) => s.on('data', () => s.write(head('206 Partial Content', ['Content-Length: 2']) + 'ok')))
  servers.push(again)
  await new Promise<void>((r) => again.listen(port, '127.0.0.1', r))
  const a = await p.get('/x', {}, { max: 2, timeoutMs: 5000 })
  expect([a.status, Buffer.from(a.body).toString()]).toEqual([206, 'ok'])
}, 20_000)

describe('DatastoreHttp over RangeHttp', () => {
  test('a read over 1 MiB goes out as parallel 1 MiB range requests into the caller buffer; the datastore reader asks the copy for one read at a time', async () => {
    const data = randomBytes(8 * 1024 * 1024)
    const descriptor = Buffer.from(
      `# Disk DescriptorFile\nversion=1\nCID=aaaa0000\nparentCID=ffffffff\ncreateType="monolithicFlat"\nRW ${data.length / 512} FLAT "vm-flat.vmdk" 0\n`,
    )
    const ranges: string[] = []
    let open = 0
    let most = 0
    const srv = await serve((req, _n, s) => {
      const m = /range: bytes=(\d+)-(\d+)/.exec(req)!
      const file = req.includes('/folder/vm/vm.vmdk?') ? descriptor : data
      if (file === data) ranges.push(`${m[1]}-${m[2]}`)
      const part = file.subarray(Number(m[1]), Number(m[2]) + 1)
      open++
      most = Math.max(most, open)
      // answered after a moment, so requests sent together are seen together
      setTimeout(() => {
        open--
        s.write(
          Buffer.concat([
            Buffer.from(head('206 Partial Content', [`Content-Length: ${part.length}`, `Content-Range: bytes ${m[1]}-${m[2]}/${file.length}`])),
            part,
          ]),
        )
      }, 20)
      return null
    })
    const ranges$ = pool(srv.origin)
    const client = { sdkUrl: `${srv.origin}/sdk`, loginCookie: null, ranges: ranges$, call: async () => ({}) } as unknown as VimClient
    const http = new DatastoreHttp(client, 'DC0')
    const file = await http.open({ datastore: 'ds', path: 'vm/vm-flat.vmdk' })
    expect(file.size).toBe(data.length)
    ranges.length = 0
    const into = Buffer.alloc(4 * 1024 * 1024)
    const got = await file.read(MiB + 5, 3.5 * MiB, into)
    expect([got.buffer === into.buffer, got.length, got.equals(data.subarray(MiB + 5, MiB + 5 + 3.5 * MiB))]).toEqual([true, 3.5 * MiB, true])
    expect(ranges).toEqual([0, 1, 2, 3].map((i) => `${MiB + 5 + i * MiB}-${MiB + 5 + Math.min((i + 1) * MiB, 3.5 * MiB) - 1}`))
    expect(most).toBe(4)
    // a short read is one request
    ranges.length = 0
    expect((await file.read(10, 100)).equals(data.subarray(10, 110))).toBe(true)
    expect(ranges).toEqual(['10-109'])
    // the disk reader over the datastore: one read in flight, the copy loop's default overridden
    const disk = await openDatastoreVmdk(http, '[ds] vm/vm.vmdk', { label: 'vm', capacity: data.length })
    expect([disk.readAhead, disk.size]).toEqual([1, data.length])
    expect((await disk.read(3 * MiB, 2 * MiB)).equals(data.subarray(3 * MiB, 5 * MiB))).toBe(true)
    await disk.close()
  })
})
