// The live copy's area readers (lib/pipeline/reader-wrappers.ts): `allocatedOnly` (a full pass with
// CBT's allocated areas) and `restrictTo` (a delta pass's changed areas) yield their areas in
// order and pass the copy's buffer on to the snapshot reader, which fills it (no buffer per read),
// and its reads-in-flight wish.
import { describe, expect, test } from 'bun:test'
import type { DiskExtent, DiskReader } from '../../lib/contracts/disk-reader.ts'
import { allocatedOnly, restrictTo } from '../../lib/pipeline/reader-wrappers.ts'

const MiB = 1024 * 1024

/** A 16 MiB reader whose byte at `o` is `o & 0xff`, recording the buffers it was given. */
function inner(given: Array<Buffer | undefined>): DiskReader {
  return {
    size: 16 * MiB,
    readAhead: 1,
    async *extents(from: number): AsyncIterable<DiskExtent> {
      yield { offset: from, length: 16 * MiB - from, zero: false }
    },
    async read(offset, length, into) {
      given.push(into)
      const b = into && into.length >= length ? into.subarray(0, length) : Buffer.alloc(length)
      for (let i = 0; i < length; i++) b[i] = (offset + i) & 0xff
      return b
    },
    async close() {},
  }
}

const all = async (r: DiskReader, from = 0) => {
  const out: DiskExtent[] = []
  for await (const e of r.extents(from)) out.push(e)
  return out
}

describe('area readers', () => {
  const areas = [
    { offset: 8 * MiB, length: MiB },
    { offset: MiB, length: 2 * MiB },
  ]

  test('allocatedOnly: the areas as data, the rest as zero extents, in order', async () => {
    const given: Array<Buffer | undefined> = []
    const r = allocatedOnly(inner(given), areas)
    expect(await all(r, 2 * MiB)).toEqual([
      { offset: 2 * MiB, length: MiB, zero: false },
      { offset: 3 * MiB, length: 5 * MiB, zero: true },
      { offset: 8 * MiB, length: MiB, zero: false },
      { offset: 9 * MiB, length: 7 * MiB, zero: true },
    ])
    const into = Buffer.alloc(MiB)
    const got = await r.read(MiB + 3, 100, into)
    expect([given[0] === into, got.buffer === into.buffer, got[0], r.readAhead]).toEqual([true, true, (MiB + 3) & 0xff, 1])
  })

  test('restrictTo: only the areas, gaps left out; the buffer is passed on', async () => {
    const given: Array<Buffer | undefined> = []
    const r = restrictTo(inner(given), areas)
    expect(await all(r, 2 * MiB)).toEqual([
      { offset: 2 * MiB, length: MiB, zero: false },
      { offset: 8 * MiB, length: MiB, zero: false },
    ])
    const into = Buffer.alloc(MiB)
    const got = await r.read(8 * MiB, 4096, into)
    expect([given[0] === into, got.buffer === into.buffer, r.readAhead]).toEqual([true, true, 1])
  })
})
