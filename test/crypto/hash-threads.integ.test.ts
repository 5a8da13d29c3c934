/**
 * Hashing threads (lib/crypto/hash-threads.ts) and the script thread they run on
 * (lib/script-thread.ts): SHA-1s of SharedArrayBuffer views computed in place on a thread equal
 * the reference digests; other views go through WebCrypto, XXH64 stays on the caller's thread; a
 * shared buffer goes to a thread once and is let go with the caller's; a handler's error and a
 * dead thread are rejections, never hangs; the same code runs under Node (compiled).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import * as path from 'node:path'
import { sha1Hex, xxh64Hex } from '../../lib/crypto/hash-threads.ts'
import { ScriptThread, ScriptThreadError } from '../../lib/script-thread.ts'
import { ensureNodeBuild } from '../helpers/server.ts'

const MiB = 1024 * 1024
const REPO = path.resolve(import.meta.dir, '../..')

/** `n` random bytes at offset 4096 of a SharedArrayBuffer (a view not at the buffer's start). */
function sharedView(n: number): Buffer {
  const b = Buffer.from(new SharedArrayBuffer(n + 8192), 4096, n)
  randomBytes(n).copy(b)
  return b
}

describe('hashing threads', () => {
  test('SHA-1 of many SharedArrayBuffer views at once, and of ordinary buffers, equals node:crypto', async () => {
    const views = Array.from({ length: 24 }, (_, i) => sharedView(MiB - i * 4096))
    const got = await Promise.all(views.map((v) => sha1Hex(v)))
    expect(got).toEqual(views.map((v) => createHash('sha1').update(v).digest('hex')))
    const plain = randomBytes(MiB + 3)
    expect(await sha1Hex(plain)).toBe(createHash('sha1').update(plain).digest('hex'))
  })

  test('XXH64 of a SharedArrayBuffer view and of an ordinary buffer (both at the call) equals Bun.hash.xxHash64', async () => {
    const v = sharedView(MiB)
    expect(await xxh64Hex(v)).toBe(Bun.hash.xxHash64(v).toString(16).padStart(16, '0'))
    const plain = randomBytes(4099)
    expect(await xxh64Hex(plain)).toBe(Bun.hash.xxHash64(plain).toString(16).padStart(16, '0'))
  })

  test('a changed byte changes the digest (the thread reads the memory it was given, not a stale copy)', async () => {
    const v = sharedView(MiB)
    const before = await sha1Hex(v)
    v[MiB - 1] = (v[MiB - 1]! + 1) & 0xff
    const after = await sha1Hex(v)
    expect(after).not.toBe(before)
    expect(after).toBe(createHash('sha1').update(v).digest('hex'))
  })
})

describe('script thread', () => {
  const threads: Array<ScriptThread<unknown, unknown>> = []
  afterAll(async () => {
    for (const t of threads) await t.close()
  })

  test('answers in call order; a handler that throws is a ScriptThreadError with its errno code; later calls still run', async () => {
    const t = new ScriptThread<number, number>(
      `(n) => { if (n < 0) { const e = new Error('negative ' + n); e.code = 'EDOM'; throw e } return n * 2 }`,
      'doubler',
    )
    threads.push(t as ScriptThread<unknown, unknown>)
    const calls = [1, 2, -3, 4].map((n) => t.call(n).catch((e: unknown) => e))
    const out = await Promise.all(calls)
    expect(out[0]).toBe(2)
    expect(out[1]).toBe(4)
    expect(out[2]).toBeInstanceOf(ScriptThreadError)
    expect((out[2] as ScriptThreadError).code).toBe('EDOM')
    expect((out[2] as ScriptThreadError).message).toBe('negative -3')
    expect(out[3]).toBe(8)
    expect(t.pending).toBe(0)
  })

  test('a SharedArrayBuffer goes to the thread once: later views of it arrive as the same buffer there, at their offsets, reading its memory as it is at the call', async () => {
    // The thread answers whether the view's buffer is the one of its previous call, and the view's first byte.
    const t = new ScriptThread<{ data: Uint8Array; tag: number }, [boolean, number, number]>(
      `(() => { let prev = null; return (m) => { const same = m.data.buffer === prev; prev = m.data.buffer; return [same, m.data[0], m.tag] } })()`,
      'shared views',
    )
    threads.push(t as ScriptThread<unknown, unknown>)
    const a = Buffer.from(new SharedArrayBuffer(4 * MiB))
    const b = Buffer.from(new SharedArrayBuffer(MiB))
    for (let i = 0; i < 4; i++) a[i * MiB] = 10 + i
    b[0] = 99
    const got = await Promise.all([0, 1, 2, 3].map((i) => t.call({ data: a.subarray(i * MiB, (i + 1) * MiB), tag: i })))
    expect(got).toEqual([
      [false, 10, 0],
      [true, 11, 1],
      [true, 12, 2],
      [true, 13, 3],
    ])
    expect(await t.call({ data: b, tag: 4 })).toEqual([false, 99, 4])
    a[2 * MiB] = 77 // changed after the buffer went over: the thread sees the change
    expect(await t.call({ data: a.subarray(2 * MiB), tag: 5 })).toEqual([false, 77, 5])
    expect(await t.call({ data: a.subarray(2 * MiB), tag: 6 })).toEqual([true, 77, 6])
  })

  test('a SharedArrayBuffer the caller let go of is let go by the thread too (memory stays flat over many buffers)', async () => {
    const t = new ScriptThread<{ data: Uint8Array }, number>('(m) => m.data[0]', 'forgetful')
    threads.push(t as ScriptThread<unknown, unknown>)
    const rss = () => process.memoryUsage().rss
    const start = rss()
    const after: number[] = []
    // 5 rounds of 40 buffers of 8 MiB, each touched whole: 320 MiB more per round if the thread kept
    // them. Without the thread's collection, 168-1,263 MiB were left after a round (Bun collects a
    // thread's heap at times of its own); with it, 0-8 MiB.
    for (let round = 0; round < 5; round++) {
      for (let i = 0; i < 40; i++) {
        const buf = Buffer.from(new SharedArrayBuffer(8 * MiB)).fill(round + 1)
        expect(await t.call({ data: buf.subarray(0, MiB) })).toBe(round + 1)
      }
      Bun.gc(true)
      await Bun.sleep(20)
      await t.call({ data: Buffer.from(new SharedArrayBuffer(16)) }) // carries the ids to forget
      after.push(rss())
    }
    expect(Math.max(...after) - start).toBeLessThan(160 * MiB)
  })

  test('a thread that dies rejects what was pending and every later call, naming the thread', async () => {
    const t = new ScriptThread<number, number>(`(n) => { if (n === 0) process.exit(7); return n }`, 'fragile')
    threads.push(t as ScriptThread<unknown, unknown>)
    expect(await t.call(5)).toBe(5)
    const dying = await t.call(0).catch((e: Error) => e)
    expect(dying).toBeInstanceOf(ScriptThreadError)
    expect((dying as Error).message).toContain('fragile: thread exited with code 7')
    const later = await t.call(1).catch((e: Error) => e)
    expect((later as Error).message).toContain('fragile')
    await t.drain() // settles, never hangs
  })

  test('under Node (compiled output): SHA-1 of a SharedArrayBuffer view on a thread equals node:crypto; XXH64 (hash-wasm) equals the XXH64 reference vectors', async () => {
    await ensureNodeBuild()
    const script = `
      const { sha1Hex, xxh64Hex } = require(${JSON.stringify(path.join(REPO, 'dist/lib/crypto/hash-threads.js'))})
      const b = Buffer.from(new SharedArrayBuffer(1 << 20)); b.fill(7, 0, 1000)
      Promise.all([sha1Hex(b), xxh64Hex(new Uint8Array(0)), xxh64Hex(Buffer.from('a')), xxh64Hex(Buffer.from('abc'))]).then(([h, e, a, abc]) =>
        console.log(JSON.stringify({ h, want: require('node:crypto').createHash('sha1').update(b).digest('hex'), xxh: [e, a, abc] })))
    `
    const out = JSON.parse(execFileSync('node', ['-e', script], { encoding: 'utf8', timeout: 30_000 }))
    expect(out.h).toBe(out.want)
    const ref = (s: string) => Bun.hash.xxHash64(Buffer.from(s)).toString(16).padStart(16, '0')
    expect(out.xxh).toEqual([ref(''), ref('a'), ref('abc')])
  })

  test('under Node with --expose-gc (as job workers run): buffers the caller let go of are let go by the thread too', async () => {
    await ensureNodeBuild()
    // The test above under Node: without the thread's collection, memory grew by 320 MiB a round
    // (0, 320, 640, 960, 1280 MiB over the first round, 3 of 3 runs). With it, the first round
    // leaves 8-178 MiB once (18 runs; a CI run failed on 163 MiB against the old 160 MiB bound on
    // the total) and later rounds add 0-8 MiB: so the bound is on the growth after the first round,
    // plus one round's worth on the total.
    const script = `
      const { ScriptThread } = require(${JSON.stringify(path.join(REPO, 'dist/lib/script-thread.js'))})
      const t = new ScriptThread('(m) => m.data[0]', 'forgetful')
      const after = []
      ;(async () => {
        for (let round = 0; round < 5; round++) {
          for (let i = 0; i < 40; i++) {
            const buf = Buffer.from(new SharedArrayBuffer(${8 * MiB})).fill(round + 1)
            if ((await t.call({ data: buf.subarray(0, ${MiB}) })) !== round + 1) throw new Error('wrong answer')
          }
          gc()
          await new Promise((r) => setTimeout(r, 20))
          await t.call({ data: Buffer.from(new SharedArrayBuffer(16)) })
          after.push(process.memoryUsage().rss)
        }
        await t.close()
        console.log(JSON.stringify(after))
      })()
    `
    const after: number[] = JSON.parse(execFileSync('node', ['--expose-gc', '-e', script], { encoding: 'utf8', timeout: 60_000 }))
    expect(after).toHaveLength(5)
    expect(Math.max(...after.slice(1)) - after[1]!).toBeLessThan(100 * MiB)
    expect(Math.max(...after) - after[0]!).toBeLessThan(320 * MiB)
  })
})
