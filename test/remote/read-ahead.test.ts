/**
 * withReadAhead (lib/remote/read-ahead.ts) over a RemoteFile test double: an in-memory object
 * that counts its reads (the transports themselves are tested against nginx, s3rver and smbd in
 * the integ tests, which go through the read-ahead too).
 */
import { describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import type { RemoteFile } from '../../lib/contracts/remote-file.ts'
import { withReadAhead } from '../../lib/remote/read-ahead.ts'

const KiB = 1024
const MiB = 1024 * KiB

/** An object of `data` whose reads are recorded (`[pos, length]`); `failAt` fails reads covering that offset. */
function memoryFile(data: Buffer, failAt?: number) {
  const reads: Array<[number, number]> = []
  let closed = false
  const file: RemoteFile = {
    name: 'mem://object',
    size: data.length,
    identity: 'v1',
    async read(into, pos) {
      const n = Math.max(0, Math.min(into.length, data.length - pos))
      reads.push([pos, n])
      await new Promise((r) => setTimeout(r, 1))
      if (failAt !== undefined && failAt >= pos && failAt < pos + n) throw new Error(`read at ${pos} failed`)
      data.copy(into, 0, pos, pos + n)
      return n
    },
    close() {
      closed = true
    },
  }
  return { file, reads, closed: () => closed }
}

/**
 * Reads `f` whole (`size` bytes) as the copy loop does: chunk after chunk of `chunk` bytes, each
 * chunk's reads of `piece` bytes issued at once. Returns the bytes read.
 */
async function readInChunks(f: RemoteFile, size: number, chunk: number, piece: number): Promise<Buffer> {
  const out = Buffer.alloc(size)
  for (let at = 0; at < size; at += chunk) {
    const pieces: Promise<number>[] = []
    for (let p = at; p < Math.min(size, at + chunk); p += piece) pieces.push(f.read(out.subarray(p, Math.min(size, p + piece)), p))
    await Promise.all(pieces)
  }
  return out
}

describe('withReadAhead', () => {
  test('64 KiB reads in file order, issued many at once: the bytes of the object, a request per window of up to 4 MiB', async () => {
    const data = randomBytes(16 * MiB + 5 * KiB)
    const m = memoryFile(data)
    const f = withReadAhead(m.file)
    f.readAhead!(true)
    const out = await readInChunks(f, data.length, 4 * MiB, 64 * KiB)
    expect(out.equals(data)).toBe(true)
    expect(m.reads.length).toBeLessThan(16)
    expect(Math.max(...m.reads.map(([, n]) => n))).toBe(4 * MiB)
    // nothing fetched twice, nothing past the end
    expect(m.reads.reduce((s, [, n]) => s + n, 0)).toBe(data.length)
    expect(f.size).toBe(data.length)
    expect(f.identity).toBe('v1')
    f.close()
    expect(m.closed()).toBe(true)
  })

  test('windows ahead in flight, their buffers reused once let go: the bytes of the object over many windows, a window never overwritten while read', async () => {
    // 64 KiB windows, 2 ahead: 4 kept, so the object's 160 windows reuse a few buffers many times
    const data = randomBytes(10 * MiB + 3)
    const m = memoryFile(data)
    // the distinct buffers the windows were fetched into
    const buffers = new Set<ArrayBufferLike>()
    const read = m.file.read.bind(m.file)
    m.file.read = (into, pos) => {
      buffers.add(into.buffer)
      return read(into, pos)
    }
    const f = withReadAhead(m.file, { maxWindowBytes: 64 * KiB, ahead: 2 })
    f.readAhead!(true)
    // reads of 16 KiB issued 16 at a time, across the borders of four windows
    const out = await readInChunks(f, data.length, 256 * KiB, 16 * KiB)
    expect(out.equals(data)).toBe(true)
    // at most the windows ahead of the last read fetched beyond what was read, and never past the end
    expect(m.reads.reduce((s, [, n]) => s + n, 0)).toBeLessThanOrEqual(data.length)
    // served from windows (one request per 64 KiB, not per read), into a few reused buffers
    expect(m.reads.length).toBeLessThan(data.length / (64 * KiB) + 8)
    expect(buffers.size).toBeLessThan(16)
    f.close()
  })

  test('reads of odd sizes, one at a time: the next window is fetched ahead; reads across two windows fetch nothing twice', async () => {
    const data = randomBytes(24 * MiB + 777)
    const m = memoryFile(data)
    const f = withReadAhead(m.file)
    f.readAhead!(true)
    const out = Buffer.alloc(data.length)
    let pos = 0
    for (let i = 0; pos < data.length; i++) {
      const n = 40_000 + ((i * 7919) % 90_000)
      pos += await f.read(out.subarray(pos, Math.min(data.length, pos + n)), pos)
    }
    expect(out.equals(data)).toBe(true)
    expect(m.reads.reduce((s, [, n]) => s + n, 0)).toBeLessThanOrEqual(data.length + 256 * KiB)
    expect(m.reads.length).toBeLessThan(20)
  })

  test('reads out of order and large reads go to the file as they are; the first reads of a run fetch little ahead', async () => {
    const data = randomBytes(32 * MiB)
    const m = memoryFile(data)
    const f = withReadAhead(m.file)
    f.readAhead!(true)
    const b = Buffer.alloc(64 * KiB)
    for (const pos of [20 * MiB, 3 * MiB, 9 * MiB, 1 * MiB]) {
      expect(await f.read(b, pos)).toBe(64 * KiB)
      expect(b.equals(data.subarray(pos, pos + 64 * KiB))).toBe(true)
    }
    expect(m.reads).toEqual([
      [20 * MiB, 64 * KiB],
      [3 * MiB, 64 * KiB],
      [9 * MiB, 64 * KiB],
      [1 * MiB, 64 * KiB],
    ])
    // a second read in a row: a window of twice the run (128 KiB), not 4 MiB
    expect(await f.read(b, 1 * MiB + 64 * KiB)).toBe(64 * KiB)
    expect(m.reads.at(-1)).toEqual([1 * MiB + 64 * KiB, 128 * KiB])
    const big = Buffer.alloc(8 * MiB)
    expect(await f.read(big, 1 * MiB + 128 * KiB)).toBe(8 * MiB)
    expect(big.equals(data.subarray(1 * MiB + 128 * KiB, 9 * MiB + 128 * KiB))).toBe(true)
    expect(m.reads.at(-1)).toEqual([1 * MiB + 128 * KiB, 8 * MiB])
    // the end of the object: short only there
    expect(await f.read(Buffer.alloc(MiB), data.length - 100)).toBe(100)
    expect(await f.read(Buffer.alloc(MiB), data.length)).toBe(0)
  })

  test('off until readAhead(true) (an inspection reads what it asks); off again drops the windows', async () => {
    const data = randomBytes(2 * MiB)
    const m = memoryFile(data)
    const f = withReadAhead(m.file)
    const b = Buffer.alloc(64 * KiB)
    for (let p = 0; p < MiB; p += 64 * KiB) await f.read(b, p)
    expect(m.reads.every(([, n]) => n === 64 * KiB)).toBe(true)
    expect(m.reads.length).toBe(16)
    f.readAhead!(true)
    for (let p = MiB; p < 2 * MiB; p += 64 * KiB) await f.read(b, p)
    expect(m.reads.length).toBeLessThan(16 + 8)
    f.readAhead!(false)
    await f.read(b, MiB + 64 * KiB)
    expect(m.reads.at(-1)).toEqual([MiB + 64 * KiB, 64 * KiB])
  })

  test('a failed window fails the reads waiting on it and is dropped: the next read asks the file again', async () => {
    const data = randomBytes(8 * MiB)
    const m = memoryFile(data, 700 * KiB)
    const f = withReadAhead(m.file)
    f.readAhead!(true)
    const b = Buffer.alloc(64 * KiB)
    for (let p = 0; p < 512 * KiB; p += 64 * KiB) await f.read(b, p)
    for (let p = 512 * KiB; p < 576 * KiB; p += 64 * KiB) await f.read(b, p)
    // both wait on the window the first of them starts, [576 KiB, 1728 KiB), which fails
    const waiting = [f.read(Buffer.alloc(64 * KiB), 576 * KiB), f.read(Buffer.alloc(64 * KiB), 640 * KiB)]
    const results = await Promise.allSettled(waiting)
    expect(results.map((r) => r.status)).toEqual(['rejected', 'rejected'])
    const before = m.reads.length
    await expect(f.read(b, 640 * KiB)).rejects.toThrow('failed')
    expect(m.reads.length).toBe(before + 1)
  })
})
