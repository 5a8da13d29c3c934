/**
 * The remote object over HTTP(S) (lib/remote/http-object.ts) against a real nginx on 127.0.0.1
 * (test/helpers/nginx.ts): ranged reads, a server without ranges, TLS with a test CA and a pinned
 * thumbprint, basic auth, 404, DNS and refused connections, an object replaced between two
 * reads, and connections cut mid-answer by a proxy (retried, or failed with the offset).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { renameSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { openHttpObject } from '../../lib/remote/http-object.ts'
import { freePort } from '../helpers/server.ts'
import { makeTestCa, NGINX_USER, startCuttingProxy, startNginx, type RunningNginx } from '../helpers/nginx.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const FAST = { retryBaseMs: 10 }

describe('remote object over HTTP (real nginx)', () => {
  const t = tempDir('mig-remote-http-')
  const root = path.join(t.dir, 'www')
  const data = randomBytes(9 * MiB + 123)
  let web: RunningNginx
  let tlsWeb: RunningNginx
  let ca: ReturnType<typeof makeTestCa>

  beforeAll(async () => {
    ca = makeTestCa(path.join(t.dir, 'ca'))
    const { mkdirSync } = await import('node:fs')
    mkdirSync(root)
    writeFileSync(path.join(root, 'blob.bin'), data)
    writeFileSync(path.join(root, 'small.bin'), data.subarray(0, 100_000))
    web = await startNginx(root, path.join(t.dir, 'nginx'))
    tlsWeb = await startNginx(root, path.join(t.dir, 'nginx-tls'), { tls: { cert: ca.cert, key: ca.key } })
  }, 60_000)

  afterAll(async () => {
    await web?.stop()
    await tlsWeb?.stop()
    t.cleanup()
  })

  const readAll = async (o: { size: number; read(b: Buffer, p: number): Promise<number> }, chunk = 3 * MiB + 7) => {
    const out = Buffer.alloc(o.size)
    const parts: Promise<number>[] = []
    for (let at = 0; at < o.size; at += chunk) parts.push(o.read(out.subarray(at, Math.min(o.size, at + chunk)), at))
    await Promise.all(parts)
    return out
  }

  test('ranged reads give the exact bytes, several ranges in flight; a read past the end is short', async () => {
    const o = await openHttpObject(`${web.base}/blob.bin`, { pieceBytes: MiB })
    try {
      expect(o.size).toBe(data.length)
      expect((await readAll(o)).equals(data)).toBe(true)
      const tail = Buffer.alloc(1000)
      expect(await o.read(tail, data.length - 10)).toBe(10)
      expect(tail.subarray(0, 10).equals(data.subarray(data.length - 10))).toBe(true)
    } finally {
      o.close()
    }
    // every read was a 206 of at most 1 MiB (pieces), never the whole object
    const reqs = web.requests().filter((r) => r.uri === '/blob.bin')
    expect(reqs.every((r) => r.status === 206 && r.range.startsWith('bytes=') && r.bytes <= MiB)).toBe(true)
    expect(reqs.reduce((s, r) => s + r.bytes, 0)).toBeLessThan(data.length + 128 * 1024)
  })

  test('a server without ranges (max_ranges 0): a small object is read once whole; a larger one is E_MIG_UNSUPPORTED_FORMAT', async () => {
    const o = await openHttpObject(`${web.base}/noranges/blob.bin`)
    expect((await readAll(o)).equals(data)).toBe(true)
    o.close()
    const whole = web.requests().filter((r) => r.uri === '/noranges/blob.bin')
    expect(whole.map((r) => r.status)).toEqual([200, 200]) // the cut ranged open, then one whole GET
    const e = await thrown(() => openHttpObject(`${web.base}/noranges/blob.bin`, { wholeObjectLimit: 4 * MiB }))
    expect(e.code).toBe('E_MIG_UNSUPPORTED_FORMAT')
    expect(e.message).toContain('does not serve byte ranges')
  })

  test('401 without or with wrong credentials is E_MIG_AUTH_FAILED; the right ones read', async () => {
    for (const auth of [null, { kind: 'basic' as const, username: 'user', password: 'wrong' }]) {
      const e = await thrown(() => openHttpObject(`${web.base}/private/blob.bin`, { auth }))
      expect(e.code).toBe('E_MIG_AUTH_FAILED')
      expect(e.message).toContain('HTTP 401')
    }
    const o = await openHttpObject(`${web.base}/private/small.bin`, { auth: { kind: 'basic', ...NGINX_USER } })
    expect((await readAll(o)).equals(data.subarray(0, 100_000))).toBe(true)
    o.close()
  })

  test('404 is E_MIG_NOT_FOUND naming the URL; DNS and a refused port are E_MIG_SOURCE_UNREACHABLE naming the cause', async () => {
    const nf = await thrown(() => openHttpObject(`${web.base}/nope/disk.qcow2`))
    expect([nf.code, nf.message]).toEqual(['E_MIG_NOT_FOUND', `${web.base}/nope/disk.qcow2: HTTP 404: no such object on the server`])
    const dns = await thrown(() => openHttpObject('http://no-such-host.invalid/x.ova'))
    expect(dns.code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(dns.message).toContain('cannot resolve no-such-host.invalid (DNS')
    const port = await freePort()
    const refused = await thrown(() => openHttpObject(`http://127.0.0.1:${port}/x.ova`))
    expect(refused.code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(refused.message).toContain('ECONNREFUSED')
  })

  test('TLS: the test CA or the pinned thumbprint is trusted; no trust is E_MIG_SOURCE_UNREACHABLE (TLS)', async () => {
    for (const trust of [{ ca_pem: ca.caPem }, { thumbprint: ca.thumbprint }]) {
      const o = await openHttpObject(`${tlsWeb.base}/small.bin`, { trust })
      expect((await readAll(o)).equals(data.subarray(0, 100_000))).toBe(true)
      o.close()
    }
    const e = await thrown(() => openHttpObject(`${tlsWeb.base}/small.bin`))
    expect(e.code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(e.message).toContain('TLS: the server')
    const pin = await thrown(() => openHttpObject(`${tlsWeb.base}/small.bin`, { trust: { thumbprint: 'ab'.repeat(32) } }))
    expect(pin.code).toBe('E_MIG_SOURCE_UNREACHABLE')
  })

  test('the object replaced between two reads: E_MIG_DISK_READ_FAILED, the new bytes are never returned', async () => {
    const f = path.join(root, 'swap.bin')
    writeFileSync(f, data)
    const o = await openHttpObject(`${web.base}/swap.bin`)
    try {
      const first = Buffer.alloc(MiB)
      await o.read(first, MiB)
      expect(first.equals(data.subarray(MiB, 2 * MiB))).toBe(true)
      // same size, new content and mtime: a new ETag
      await new Promise((r) => setTimeout(r, 1100))
      writeFileSync(`${f}.new`, randomBytes(data.length))
      renameSync(`${f}.new`, f)
      const second = Buffer.alloc(MiB)
      const e = await thrown(() => o.read(second, 4 * MiB))
      expect(e.code).toBe('E_MIG_DISK_READ_FAILED')
      expect(e.message).toContain('the object changed on the server since the copy began (HTTP 412')
      expect(e.details.offset).toBe(4 * MiB)
    } finally {
      o.close()
    }
  })

  test('connections cut mid-answer: retried with backoff and completed; cut every time: failed with the offset reached', async () => {
    const flaky = await startCuttingProxy(web.port, 200_000, 3)
    try {
      const o = await openHttpObject(`${flaky.base}/blob.bin`, { ...FAST, pieceBytes: 2 * MiB, connections: 2 })
      expect((await readAll(o, 4 * MiB)).equals(data)).toBe(true)
      o.close()
      expect(flaky.connections).toBeGreaterThan(3) // the cut ones and their replacements
    } finally {
      await flaky.close()
    }
    const dead = await startCuttingProxy(web.port, 300_000, Number.POSITIVE_INFINITY)
    try {
      const o = await openHttpObject(`${dead.base}/blob.bin`, { ...FAST, retries: 3, pieceBytes: 2 * MiB })
      const e = await thrown(() => o.read(Buffer.alloc(2 * MiB), 6 * MiB))
      o.close()
      expect(e.code).toBe('E_MIG_DISK_READ_FAILED')
      expect(e.message).toContain('at offset 6291456 failed 4 times')
      expect(e.details.offset).toBe(6 * MiB)
    } finally {
      await dead.close()
    }
  })
})
