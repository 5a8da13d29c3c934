// The trailing throttle of job progress (lib/throttle.ts), on a clock the test moves.
import { expect, test } from 'bun:test'
import { TrailingThrottle } from '../../lib/throttle.ts'

function throttle(everyMs: number) {
  let clock = 1_000_000
  const sent: number[] = []
  const errors: unknown[] = []
  const t = new TrailingThrottle<number>(
    everyMs,
    (v) => {
      if (v < 0) throw new Error(`bad ${v}`)
      sent.push(v)
    },
    (e) => errors.push(e),
    () => clock,
  )
  return { t, sent, errors, tick: (ms: number) => (clock += ms) }
}

test('the first value goes at once; later ones inside the interval are held and only the latest goes when it ends', async () => {
  const { t, sent, tick } = throttle(100)
  expect(await t.offer(1)).toBe(true)
  tick(10)
  expect(await t.offer(2)).toBe(false)
  expect(await t.offer(3)).toBe(false)
  expect(sent).toEqual([1])
  tick(90)
  await Bun.sleep(150)
  expect(sent).toEqual([1, 3])
  tick(200)
  expect(await t.offer(4)).toBe(true)
  expect(sent).toEqual([1, 3, 4])
})

test('force sends at once and drops what was held; drop forgets it', async () => {
  const { t, sent, tick } = throttle(100)
  await t.offer(1)
  tick(1)
  await t.offer(2)
  expect(await t.offer(5, true)).toBe(true)
  tick(1)
  await t.offer(6)
  t.drop()
  await Bun.sleep(150)
  expect(sent).toEqual([1, 5])
})

test('a send that throws rejects the offer when it goes at once, and reaches onError when it was held', async () => {
  const { t, errors, tick } = throttle(50)
  await expect(t.offer(-1)).rejects.toThrow('bad -1')
  tick(1)
  await t.offer(-2)
  tick(50)
  await Bun.sleep(100)
  expect(errors.map((e) => (e as Error).message)).toEqual(['bad -2'])
})
