/**
 * lib/retry.ts: `sleep` waits its time and is cut short by its signal with the caller's error;
 * `retry` makes exactly the tries it is allowed, waits the delays asked between them, throws the
 * error as it is when it may not retry, and stops when its signal aborts. Real timers; the time
 * bounds leave room for a loaded machine (lower bounds are what the code guarantees).
 */
import { describe, expect, test } from 'bun:test'
import { MigError } from '../../lib/errors.ts'
import { retry, sleep } from '../../lib/retry.ts'

/** Upper slack of a timer on a loaded 2-core machine, ms. */
const SLACK = 250

/** Milliseconds `p` took to settle, and how (the value or the error). */
async function timed<T>(p: () => Promise<T>): Promise<{ ms: number; value?: T; error?: unknown }> {
  const t0 = performance.now()
  try {
    const value = await p()
    return { ms: performance.now() - t0, value }
  } catch (error) {
    return { ms: performance.now() - t0, error }
  }
}

describe('sleep', () => {
  test('resolves after the time asked, not before', async () => {
    const r = await timed(() => sleep(60))
    expect(r.error).toBeUndefined()
    expect(r.ms).toBeGreaterThanOrEqual(59)
    expect(r.ms).toBeLessThan(60 + SLACK)
  })

  test('with a signal that does not abort, resolves after its time', async () => {
    const r = await timed(() => sleep(40, new AbortController().signal))
    expect(r.error).toBeUndefined()
    expect(r.ms).toBeGreaterThanOrEqual(39)
  })

  test('an already aborted signal rejects at once with E_MIG_CANCELLED', async () => {
    const ac = new AbortController()
    ac.abort()
    const r = await timed(() => sleep(10_000, ac.signal))
    expect(r.ms).toBeLessThan(SLACK)
    expect(r.error).toBeInstanceOf(MigError)
    expect((r.error as MigError).code).toBe('E_MIG_CANCELLED')
  })

  test('an abort during the wait rejects then, with the error the caller names', async () => {
    const ac = new AbortController()
    setTimeout(() => ac.abort(), 30)
    const mine = new MigError('E_MIG_CANCELLED', 'boot check cancelled')
    const r = await timed(() => sleep(10_000, ac.signal, () => mine))
    expect(r.error).toBe(mine)
    expect(r.ms).toBeGreaterThanOrEqual(25)
    expect(r.ms).toBeLessThan(30 + SLACK)
  })
})

describe('retry', () => {
  test('retries until a try succeeds, with the fixed delay between tries', async () => {
    const tries: number[] = []
    const r = await timed(() =>
      retry(
        async (n) => {
          tries.push(n)
          if (n < 2) throw new Error(`try ${n} failed`)
          return 'ok'
        },
        { attempts: 5, delayMs: 40 },
      ),
    )
    expect(r.value).toBe('ok')
    expect(tries).toEqual([0, 1, 2])
    // two waits of 40 ms
    expect(r.ms).toBeGreaterThanOrEqual(78)
    expect(r.ms).toBeLessThan(80 + SLACK)
  })

  test('makes exactly `attempts` tries and throws the last error as it is', async () => {
    let calls = 0
    const errors: Error[] = []
    const r = await timed(() =>
      retry(
        async () => {
          calls++
          const e = new Error(`failure ${calls}`)
          errors.push(e)
          throw e
        },
        { attempts: 4 },
      ),
    )
    expect(calls).toBe(4)
    expect(r.error).toBe(errors[3])
  })

  test('a growing delay is asked with the failed try number and waited', async () => {
    const asked: number[] = []
    const starts: number[] = []
    const r = await timed(() =>
      retry(
        async () => {
          starts.push(performance.now())
          throw new Error('down')
        },
        {
          attempts: 3,
          delayMs: (n) => {
            asked.push(n)
            return 20 * 2 ** n
          },
        },
      ),
    )
    expect((r.error as Error).message).toBe('down')
    expect(asked).toEqual([0, 1]) // no wait after the last try
    expect(starts).toHaveLength(3)
    expect(starts[1]! - starts[0]!).toBeGreaterThanOrEqual(19)
    expect(starts[2]! - starts[1]!).toBeGreaterThanOrEqual(39)
    expect(r.ms).toBeLessThan(60 + SLACK)
  })

  test('an error shouldRetry refuses is thrown after that try, as it is', async () => {
    const fatal = new MigError('E_MIG_AUTH_FAILED', 'refused')
    const seen: Array<[unknown, number]> = []
    let calls = 0
    const r = await timed(() =>
      retry(
        async () => {
          calls++
          throw calls === 1 ? new Error('transient') : fatal
        },
        {
          attempts: 10,
          delayMs: 5,
          shouldRetry: (e, n) => {
            seen.push([e, n])
            return !(e instanceof MigError)
          },
        },
      ),
    )
    expect(calls).toBe(2)
    expect(r.error).toBe(fatal)
    expect(seen.map(([, n]) => n)).toEqual([0, 1])
  })

  test('attempts below 1 still make one try', async () => {
    let calls = 0
    const r = await timed(() =>
      retry(
        async () => {
          calls++
          throw new Error('no')
        },
        { attempts: 0, delayMs: 1000 },
      ),
    )
    expect(calls).toBe(1)
    expect((r.error as Error).message).toBe('no')
    expect(r.ms).toBeLessThan(SLACK)
  })

  test('an abort during the wait stops the retries with the abort error, no further try', async () => {
    const ac = new AbortController()
    let calls = 0
    const r = await timed(() =>
      retry(
        async () => {
          calls++
          if (calls === 1) setTimeout(() => ac.abort(), 30)
          throw new Error('busy')
        },
        { attempts: 5, delayMs: 10_000, signal: ac.signal, abortError: () => new MigError('E_MIG_CANCELLED', 'cancelled by operator') },
      ),
    )
    expect(calls).toBe(1)
    expect((r.error as MigError).code).toBe('E_MIG_CANCELLED')
    expect((r.error as MigError).message).toBe('cancelled by operator')
    expect(r.ms).toBeLessThan(30 + SLACK)
  })

  test('an aborted signal makes no try at all', async () => {
    const ac = new AbortController()
    ac.abort()
    let calls = 0
    const r = await timed(() =>
      retry(
        async () => {
          calls++
          return 1
        },
        { attempts: 3, signal: ac.signal },
      ),
    )
    expect(calls).toBe(0)
    expect((r.error as MigError).code).toBe('E_MIG_CANCELLED')
  })
})
