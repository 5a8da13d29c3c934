import { describe, expect, test } from 'bun:test'
import { MigError } from '../../lib/errors.ts'
import { CHUNK_BYTES, chunkExtents, isAllZero, splitZeroRuns, type Chunk } from '../../lib/pipeline/chunker.ts'
import type { DiskExtent } from '../../lib/contracts/disk-reader.ts'

const MiB = 1024 * 1024
const KiB = 1024
/** A data extent (or chunk) of `length` bytes at `offset`. */
const data = (offset: number, length: number) => ({ offset, length, zero: false })
/** A zero extent (or chunk) of `length` bytes at `offset`. */
const zero = (offset: number, length: number) => ({ offset, length, zero: true })

async function collect(extents: DiskExtent[], from: number, size: number): Promise<Chunk[]> {
  const out: Chunk[] = []
  async function* gen() {
    yield* extents
  }
  for await (const c of chunkExtents(gen(), { from, size })) out.push(c)
  return out
}

describe('chunkExtents', () => {
  test('cuts a data extent at absolute 4 MiB boundaries', async () => {
    const c = await collect([data(0, 10 * MiB)], 0, 10 * MiB)
    expect(c).toEqual([data(0, 4 * MiB), data(4 * MiB, 4 * MiB), data(8 * MiB, 2 * MiB)])
  })

  test('a resumed copy starts mid-window and realigns on the next boundary', async () => {
    const c = await collect([data(0, 10 * MiB)], 5 * MiB, 10 * MiB)
    expect(c).toEqual([data(5 * MiB, 3 * MiB), data(8 * MiB, 2 * MiB)])
  })

  test('merges adjacent zero extents into one run of any length', async () => {
    const c = await collect([zero(0, 8 * MiB), zero(8 * MiB, 100 * MiB), data(108 * MiB, 4 * MiB)], 0, 112 * MiB)
    expect(c).toEqual([zero(0, 108 * MiB), data(108 * MiB, 4 * MiB)])
  })

  test('data pieces separated by small zero extents in one window form one pieced chunk', async () => {
    const c = await collect([data(0, 64 * KiB), zero(64 * KiB, 64 * KiB), data(128 * KiB, 64 * KiB), zero(192 * KiB, 8 * MiB - 192 * KiB)], 0, 8 * MiB)
    expect(c).toEqual([
      {
        offset: 0,
        length: 192 * KiB,
        zero: false,
        pieces: [
          { offset: 0, length: 64 * KiB },
          { offset: 128 * KiB, length: 64 * KiB },
        ],
      },
      zero(192 * KiB, 8 * MiB - 192 * KiB),
    ])
  })

  test('gaps (restricted readers) are skipped and never bridged', async () => {
    const c = await collect([data(MiB, MiB), data(3 * MiB, MiB)], 0, 8 * MiB)
    expect(c).toEqual([data(MiB, MiB), data(3 * MiB, MiB)])
  })

  test('clips to the disk size and drops extents before `from`', async () => {
    const c = await collect([data(0, MiB), zero(MiB, 9 * MiB)], 2 * MiB, 6 * MiB)
    expect(c).toEqual([zero(2 * MiB, 4 * MiB)])
  })

  test('overlapping or unordered extents are E_MIG_DISK_READ_FAILED', async () => {
    let err: unknown
    try {
      await collect([data(0, 2 * MiB), data(MiB, MiB)], 0, 4 * MiB)
    } catch (e) {
      err = e
    }
    expect(err).toBeInstanceOf(MigError)
    expect((err as MigError).code).toBe('E_MIG_DISK_READ_FAILED')
  })
})

describe('zero detection', () => {
  test('isAllZero on zeros, a single set byte, and buffers over 4 MiB', () => {
    const b = Buffer.alloc(CHUNK_BYTES + 10)
    expect(isAllZero(b)).toBe(true)
    b[CHUNK_BYTES + 9] = 1
    expect(isAllZero(b)).toBe(false)
    expect(isAllZero(Buffer.alloc(0))).toBe(true)
  })

  test('splitZeroRuns cuts at absolute granularity and merges neighbours', () => {
    const buf = Buffer.alloc(64 * KiB)
    buf[5 * KiB] = 7 // block [4K, 8K)
    buf[6 * KiB] = 7
    buf[9 * KiB] = 1 // block [8K, 12K)
    buf[40 * KiB] = 1 // block [40K, 44K)
    // buffer starts at disk offset 2 KiB: first segment is partial
    const segs = splitZeroRuns(buf, 2 * KiB, 4 * KiB)
    expect(segs).toEqual([zero(2 * KiB, 2 * KiB), data(4 * KiB, 8 * KiB), zero(12 * KiB, 28 * KiB), data(40 * KiB, 4 * KiB), zero(44 * KiB, 22 * KiB)])
    const total = segs.reduce((a, s) => a + s.length, 0)
    expect(total).toBe(64 * KiB)
  })

  test('splitZeroRuns (16 granules compared at once first) gives the segments of a granule-by-granule scan', () => {
    /** The plain scan: one memcmp per granule. */
    const plain = (buf: Buffer, offset: number, g: number): Chunk[] => {
      const out: Chunk[] = []
      for (let o = offset; o < offset + buf.length; ) {
        const next = Math.min(offset + buf.length, (Math.floor(o / g) + 1) * g)
        const zero = buf.subarray(o - offset, next - offset).every((x) => x === 0)
        const last = out[out.length - 1]
        if (last && last.zero === zero) last.length += next - o
        else out.push({ offset: o, length: next - o, zero })
        o = next
      }
      return out
    }
    let seed = 7
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31
      return seed % n
    }
    let checked = 0
    for (const g of [512, 4 * KiB, 3 * KiB, 64 * KiB, CHUNK_BYTES]) {
      for (let round = 0; round < 12; round++) {
        const len = 1 + rand(g === CHUNK_BYTES ? 2 * CHUNK_BYTES : 40 * g)
        const buf = Buffer.alloc(len)
        // data in a few runs (some single bytes), the rest zeros
        for (let k = rand(6); k > 0; k--) {
          const at = rand(len)
          buf.fill(1 + rand(255), at, Math.min(len, at + 1 + rand(3 * g)))
        }
        const offset = rand(4) * g + (round % 3 === 0 ? rand(g) : 0) // aligned and not
        expect(splitZeroRuns(buf, offset, g)).toEqual(plain(buf, offset, g))
        checked++
      }
    }
    expect(checked).toBe(60)
  })
})
