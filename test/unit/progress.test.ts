/** ProgressTracker: totals, zero bytes, rate and ETA per job and per disk over a 5 s window, resume. */
import { describe, expect, test } from 'bun:test'
import { ProgressTracker } from '../../lib/pipeline/progress.ts'

const MiB = 1024 * 1024

describe('ProgressTracker', () => {
  test('rate and ETA per job and per disk, zero bytes per disk and in total', () => {
    let now = 0
    const p = new ProgressTracker(
      [
        { label: 'a', capacity_bytes: 100 * MiB },
        { label: 'b', capacity_bytes: 50 * MiB },
      ],
      new Map(),
      () => now,
    )
    expect(p.snapshot()).toMatchObject({ bytes_total: 150 * MiB, bytes_done: 0, rate_bytes_per_s: 0, eta_s: null })
    now = 2000
    p.add('a', 40 * MiB, 10 * MiB)
    const s = p.snapshot()
    expect([s.bytes_done, s.bytes_zero, s.rate_bytes_per_s, s.eta_s]).toEqual([40 * MiB, 10 * MiB, 20 * MiB, 6])
    expect(s.disks[0]).toEqual({
      label: 'a',
      capacity_bytes: 100 * MiB,
      bytes_done: 40 * MiB,
      bytes_zero: 10 * MiB,
      rate_bytes_per_s: 20 * MiB,
      eta_s: 3,
      watermark: 0,
      bytes_read: 0,
    })
    expect(s.disks[1]).toMatchObject({ bytes_done: 0, rate_bytes_per_s: 0, eta_s: null })
    now = 4000
    p.finish('a')
    p.add('b', 10 * MiB)
    const t = p.snapshot()
    expect(t.disks[0]).toMatchObject({ bytes_done: 100 * MiB, watermark: 100 * MiB, eta_s: 0 })
    expect(t.disks[1]).toMatchObject({ bytes_done: 10 * MiB, rate_bytes_per_s: 2.5 * MiB, eta_s: 16 })
    expect(t.rate_bytes_per_s).toBe(27.5 * MiB)
  })

  test('the rate window forgets samples older than 5 s; a resumed disk starts at its watermark', () => {
    let now = 0
    const p = new ProgressTracker([{ label: 'a', capacity_bytes: 100 * MiB }], new Map([['a', 30 * MiB]]), () => now)
    expect(p.snapshot().disks[0]).toMatchObject({ bytes_done: 30 * MiB, watermark: 30 * MiB })
    let rate = 0
    for (now = 1000; now <= 10_000; now += 1000) {
      p.add('a', now <= 5000 ? 10 * MiB : MiB)
      rate = p.snapshot().rate_bytes_per_s
    }
    // At 10 s the window holds 5..10 s, which moved 1 MiB per second.
    expect(rate).toBe(MiB)
    // An absolute position below the durable watermark never moves progress below it.
    p.setDone('a', 10 * MiB)
    expect(p.snapshot().disks[0].bytes_done).toBe(30 * MiB)
  })
})
