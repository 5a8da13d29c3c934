/**
 * The live import's NBD server (lib/live-import/nbd-server.ts) against real clients: the project's
 * NBD client, qemu-img (map, compare, convert) and qemu-io (a write refused), a reader that fails
 * then answers again (the wait for the source), and hostile byte streams (bad magic, oversized
 * options and requests, out-of-range reads, truncated frames) that never bring it down.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { exec } from '../../lib/exec.ts'
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs'
import { connect } from 'node:net'
import * as path from 'node:path'
import type { DiskExtent, DiskReader } from '../../lib/contracts/disk-reader.ts'
import { MigError } from '../../lib/errors.ts'
import { MAX_STATUS_DESCRIPTORS, NbdExportServer } from '../../lib/live-import/nbd-server.ts'
import { NbdClient, NBD_STATE_HOLE, NBD_STATE_ZERO } from '../../lib/nbd/client.ts'
import { openRawFileReader } from '../../lib/pipeline/readers/raw-file.ts'
import { tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024

describe('live import NBD server', () => {
  const t = tempDir('mig-li-nbd-')
  const src = path.join(t.dir, 'src.raw')
  const sock = path.join(t.dir, 's.sock')
  let server: NbdExportServer
  let reader: DiskReader
  const uri = () => `nbd+unix:///?socket=${sock}`

  beforeAll(async () => {
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', src, String(64 * MiB)])
    // unique data: two data runs with random bytes, the rest holes
    const a = Buffer.alloc(3 * MiB)
    for (let i = 0; i < a.length; i += 4) a.writeUInt32LE((Math.random() * 2 ** 32) >>> 0, i)
    const fd = openSync(src, 'r+')
    writeSync(fd, a, 0, a.length, MiB)
    writeSync(fd, a.subarray(0, MiB), 0, MiB, 40 * MiB)
    closeSync(fd)
    reader = await openRawFileReader(src)
    server = new NbdExportServer({ socketPath: sock, reader, label: 'disk0' })
    await server.listen()
  })

  afterAll(async () => {
    await server?.close()
    await reader?.close()
    t.cleanup()
  })

  // qemu runs as a child process (asynchronously: the server answers it from this process)
  const q = async (cmd: string, args: string[]) => exec(cmd, args, { timeoutMs: 60_000 })

  test('qemu-img reads the export as the source: map with holes, compare, convert', async () => {
    const map = JSON.parse((await q('qemu-img', ['map', '--output=json', uri()])).stdout) as Array<{ start: number; length: number; data: boolean }>
    const data = map.filter((m) => m.data)
    expect(data.reduce((s, m) => s + m.length, 0)).toBeLessThanOrEqual(4 * MiB + 8192)
    expect(data.some((m) => m.start <= MiB && m.start + m.length >= 4 * MiB)).toBe(true)
    expect(map.some((m) => !m.data && m.start <= 10 * MiB && m.start + m.length >= 30 * MiB)).toBe(true)
    expect((await q('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', src, uri()])).code).toBe(0)
    const out = path.join(t.dir, 'out.raw')
    expect((await q('qemu-img', ['convert', '-O', 'raw', uri(), out])).code).toBe(0)
    expect(readFileSync(out).equals(readFileSync(src))).toBe(true)
  })

  test('an export of many small extents: qemu (one extent per block status) maps, compares and converts it; other clients get at most MAX_STATUS_DESCRIPTORS per answer', async () => {
    // 64 KiB of unique data every 128 KiB over 32 MiB: 512 data extents and 512 holes, more than
    // qemu's client takes in one structured reply (1,000 bytes of payload)
    const many = path.join(t.dir, 'many.raw')
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', many, String(32 * MiB)])
    const fd = openSync(many, 'r+')
    for (let o = 0; o < 32 * MiB; o += 128 * 1024) writeSync(fd, randomBytes(64 * 1024), 0, 64 * 1024, o)
    closeSync(fd)
    const r = await openRawFileReader(many)
    const manySock = path.join(t.dir, 'many.sock')
    const srv = new NbdExportServer({ socketPath: manySock, reader: r, label: 'many' })
    await srv.listen()
    const manyUri = `nbd+unix:///?socket=${manySock}`
    try {
      const map = JSON.parse((await q('qemu-img', ['map', '--output=json', manyUri])).stdout) as Array<{ data: boolean }>
      expect(map.filter((m) => m.data).length).toBe(256)
      expect((await q('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', many, manyUri])).code).toBe(0)
      const out = path.join(t.dir, 'many-out.raw')
      const conv = await q('qemu-img', ['convert', '-O', 'raw', manyUri, out])
      expect([conv.code, conv.stderr]).toEqual([0, ''])
      expect(readFileSync(out).equals(readFileSync(many))).toBe(true)
      const c = await NbdClient.connect(manySock)
      const st = await c.blockStatus(0, 32 * MiB)
      expect(st.length).toBe(MAX_STATUS_DESCRIPTORS)
      expect(st.every((d, i) => d.offset === i * 64 * 1024 && d.length === 64 * 1024)).toBe(true)
      await c.disconnect()
    } finally {
      await srv.close()
      await r.close()
    }
  })

  test('the export is read-only: qemu-io cannot write it', async () => {
    const r = await q('qemu-io', ['-f', 'raw', '-c', 'write 0 4k', uri()])
    expect(`${r.stdout}${r.stderr}`).toMatch(/Permission denied|read-only|Operation not permitted/i)
    expect((await q('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', src, uri()])).code).toBe(0)
  })

  test("the project's NBD client: reads at any offset, block status, several clients at once", async () => {
    const c1 = await NbdClient.connect(sock)
    const c2 = await NbdClient.connect(sock)
    const file = readFileSync(src)
    const [x, y] = await Promise.all([c1.read(MiB + 12345, 70000), c2.read(40 * MiB - 100, 200)])
    expect(x.equals(file.subarray(MiB + 12345, MiB + 12345 + 70000))).toBe(true)
    expect(y.equals(file.subarray(40 * MiB - 100, 40 * MiB + 100))).toBe(true)
    const st = await c1.blockStatus(8 * MiB, 8 * MiB)
    expect(st[0]!.flags & (NBD_STATE_HOLE | NBD_STATE_ZERO)).toBe(NBD_STATE_HOLE | NBD_STATE_ZERO)
    await c1.disconnect()
    await c2.disconnect()
  })

  test('hostile clients: bad magic, oversized option, out-of-range and oversized reads, truncated frames; the server keeps serving', async () => {
    const raw = (bytes: Buffer, waitMs = 200) =>
      new Promise<Buffer>((resolve) => {
        const s = connect(sock)
        const got: Buffer[] = []
        s.on('data', (d) => got.push(d))
        s.on('error', () => {})
        s.on('connect', () => s.write(bytes))
        setTimeout(() => {
          s.destroy()
          resolve(Buffer.concat(got))
        }, waitMs)
      })
    // flags then a bad option magic: dropped
    await raw(Buffer.concat([Buffer.from([0, 0, 0, 3]), Buffer.alloc(16, 0xff)]))
    // an option of 4 GiB declared: dropped without allocating it
    const big = Buffer.alloc(20)
    big.writeUInt32BE(3, 0)
    big.writeBigUInt64BE(0x49484156454f5054n, 4)
    big.writeUInt32BE(7, 12)
    big.writeUInt32BE(0xffffffff, 16)
    await raw(big)
    // random garbage, a truncated frame
    await raw(Buffer.from(Array.from({ length: 4096 }, () => (Math.random() * 256) | 0)))
    await raw(Buffer.from([0, 0]))
    // a client in transmission sending out-of-range and oversized reads gets EINVAL, not a crash
    const c = await NbdClient.connect(sock)
    const e1 = await c.read(64 * MiB - 10, 20).catch((e) => e)
    expect(e1).toBeInstanceOf(MigError)
    await c.disconnect().catch(() => {})
    // still serving
    expect((await q('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', src, uri()])).code).toBe(0)
  })

  test('a source that fails is waited for: the read is held, then answered when the source is back', async () => {
    let failing = true
    const waits: boolean[] = []
    const flaky: DiskReader = {
      size: 8 * MiB,
      async *extents(from: number): AsyncIterable<DiskExtent> {
        yield { offset: from, length: 8 * MiB - from, zero: false }
      },
      async read(offset: number, length: number) {
        if (failing) throw new MigError('E_MIG_DISK_READ_FAILED', `source gone at ${offset}`)
        return Buffer.alloc(length, 0x5a)
      },
      async close() {},
    }
    const s2 = path.join(t.dir, 'flaky.sock')
    const srv = new NbdExportServer({ socketPath: s2, reader: flaky, label: 'flaky', onWaiting: (w) => waits.push(w), retryMs: { first: 50, max: 100 } })
    await srv.listen()
    const c = await NbdClient.connect(s2)
    const pending = c.read(4096, 4096)
    let answered = false
    pending.then(() => (answered = true))
    await Bun.sleep(400)
    expect(answered).toBe(false)
    expect(waits).toEqual([true])
    failing = false
    const got = await pending
    expect(got.equals(Buffer.alloc(4096, 0x5a))).toBe(true)
    expect(waits).toEqual([true, false])
    await c.disconnect()
    await srv.close()
  })
})
