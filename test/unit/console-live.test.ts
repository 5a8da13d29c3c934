// The web console's choice between two copies of one job (ui/src/live.ts `fresher`): API answers
// and stream events arrive on different connections, in either order.
import { describe, expect, test } from 'bun:test'
import type { Job } from '../../lib/job.ts'

// the console's modules read the page's address when loaded: the console's own path
Object.assign(globalThis, { location: new URL('http://127.0.0.1/api/v1/migrator/ui/') })
const { fresher } = await import('../../ui/src/live.ts')

const copy = (id: string, state: Job['state'], updated_at: string) => ({ id, state, updated_at }) as Job

describe('fresher', () => {
  const running = copy('a', 'CopyingFull', '2026-11-25T12:00:01.000Z')
  const cancelled = copy('a', 'Cancelled', '2026-11-25T12:00:02.000Z')

  test('a later copy replaces the held one; nothing held takes the new one', () => {
    expect(fresher(running, cancelled)).toBe(cancelled)
    expect(fresher(null, running)).toBe(running)
    expect(fresher(undefined, running)).toBe(running)
  })

  test('an older copy, or one taking a finished job back to running, is ignored', () => {
    expect(fresher(cancelled, running)).toBe(cancelled)
    // the cancel's 202 answer carries the time of the request: not older, still not applied
    expect(fresher(cancelled, copy('a', 'CopyingFull', '2026-11-25T12:00:03.000Z'))).toBe(cancelled)
    expect(fresher(copy('a', 'V2vProcessing', '2026-11-25T12:00:05.000Z'), running).state).toBe('V2vProcessing')
  })

  test('another job is never held back by this one', () => {
    const other = copy('b', 'Queued', '2026-11-25T11:00:00.000Z')
    expect(fresher(cancelled, other)).toBe(other)
  })
})
