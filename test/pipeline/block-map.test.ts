/**
 * KeptLoads (lib/pipeline/readers/block-map.ts): the last few loads kept, shared while they load,
 * and `peek` answering only what is loaded and still kept (the block-table readers' extents walk
 * reads entries through it without an `await`, so a wrong answer there would copy zeros for data).
 */
import { describe, expect, test } from 'bun:test'
import { KeptLoads } from '../../lib/pipeline/readers/block-map.ts'

describe('KeptLoads', () => {
  test('askers of a key share one load; peek answers once it resolved, and forgets what is no longer kept', async () => {
    const kept = new KeptLoads<number | null>(2)
    let loads = 0
    const load = (v: number | null) => async () => {
      loads++
      return v
    }
    const a = kept.get(1, load(10))
    expect(kept.get(1, load(99))).toBe(a)
    expect(kept.peek(1)).toBeUndefined() // still loading
    expect(await a).toBe(10)
    expect(kept.peek(1)).toBe(10)
    await kept.get(2, load(null))
    expect(kept.peek(2)).toBeNull() // loaded, and null: not "unknown"
    await kept.get(3, load(30)) // evicts key 1
    expect([kept.peek(1), kept.peek(2), kept.peek(3)]).toEqual([undefined, null, 30])
    expect(loads).toBe(3)
  })

  test('a load evicted before it resolved is never peeked; a failed load is dropped and loaded again', async () => {
    const kept = new KeptLoads<number>(1)
    let release!: (v: number) => void
    const slow = kept.get(1, () => new Promise<number>((r) => (release = r)))
    await kept.get(2, async () => 20) // evicts the slow one while it loads
    release(10)
    expect(await slow).toBe(10)
    expect(kept.peek(1)).toBeUndefined()
    const failed = kept.get(3, async () => {
      throw new Error('EIO')
    })
    await expect(failed).rejects.toThrow('EIO')
    expect(kept.peek(3)).toBeUndefined()
    expect(await kept.get(3, async () => 30)).toBe(30)
    expect(kept.peek(3)).toBe(30)
  })
})
