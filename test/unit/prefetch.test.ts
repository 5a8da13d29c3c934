/**
 * prefetch (lib/pipeline/prefetch.ts): the items of a source pulled ahead of the consumer, at most
 * `max` queued, in order; a source error after the items before it; an early stop closes the
 * source.
 */
import { describe, expect, test } from 'bun:test'
import { prefetch } from '../../lib/pipeline/prefetch.ts'

/** A source of `n` numbers that records how many were pulled and whether it was closed. */
function counted(n: number, failAt?: number) {
  const seen = { pulled: 0, closed: false }
  async function* gen(): AsyncGenerator<number> {
    try {
      for (let i = 0; i < n; i++) {
        await Promise.resolve()
        if (i === failAt) throw new Error(`source failed at ${i}`)
        seen.pulled++
        yield i
      }
    } finally {
      seen.closed = true
    }
  }
  return { seen, source: gen() }
}

/** Lets the pump run until it waits (for room in the queue or for the source). */
const settle = () => new Promise((r) => setTimeout(r, 5))

describe('prefetch', () => {
  test('yields every item in order', async () => {
    const { source } = counted(50)
    const got: number[] = []
    for await (const x of prefetch(source, 4)) got.push(x)
    expect(got).toEqual([...Array(50).keys()])
  })

  test('pulls the source while the consumer holds an item, never more than max ahead', async () => {
    const { seen, source } = counted(20)
    const it = prefetch(source, 3)[Symbol.asyncIterator]()
    expect((await it.next()).value).toBe(0)
    await settle()
    // the consumer holds item 0; items 1..3 were pulled meanwhile (3 queued), not item 4
    expect(seen.pulled).toBe(4)
    expect((await it.next()).value).toBe(1)
    await settle()
    expect(seen.pulled).toBe(5)
    await it.return(undefined)
  })

  test('a source error comes after the items before it', async () => {
    const { source } = counted(10, 3)
    const got: number[] = []
    let error: Error | null = null
    try {
      for await (const x of prefetch(source, 8)) got.push(x)
    } catch (e) {
      error = e as Error
    }
    expect(got).toEqual([0, 1, 2])
    expect(error?.message).toBe('source failed at 3')
  })

  test('a consumer that stops early closes the source before the loop ends', async () => {
    const { seen, source } = counted(1000)
    for await (const x of prefetch(source, 2)) if (x === 5) break
    expect(seen.closed).toBe(true)
    expect(seen.pulled).toBeLessThanOrEqual(9)
  })
})
