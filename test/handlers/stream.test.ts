import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import * as stream from '../../handlers/migrations/stream.ts'
import { req, testCtx, thrown } from '../helpers/env.ts'
import type { Ctx } from '../../runtime/context.ts'

let ctx: Ctx
let cleanup: () => Promise<void>
beforeAll(async () => ({ ctx, cleanup } = await testCtx({ MIGRATOR_SSE_HEARTBEAT_SECONDS: '1' })))
afterAll(() => cleanup())

interface Sse {
  id?: number
  event?: string
  data?: any
  comment?: string
}

/** Reads SSE frames from a response until `until` says stop (or 5 s pass). */
async function readFrames(res: Response, until: (frames: Sse[]) => boolean): Promise<Sse[]> {
  const reader = res.body!.getReader()
  const frames: Sse[] = []
  let buf = ''
  const deadline = Date.now() + 5000
  while (!until(frames) && Date.now() < deadline) {
    const { value, done } = await reader.read()
    if (done) break
    buf += new TextDecoder().decode(value)
    let i
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i)
      buf = buf.slice(i + 2)
      const f: Sse = {}
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) f.comment = line.slice(1).trim()
        else if (line.startsWith('id: ')) f.id = Number(line.slice(4))
        else if (line.startsWith('event: ')) f.event = line.slice(7)
        else if (line.startsWith('data: ')) f.data = JSON.parse(line.slice(6))
      }
      frames.push(f)
    }
  }
  await reader.cancel()
  return frames
}

const job = (id: string, state: string) => ({ id, state })

describe('GET /migrations/stream', () => {
  test('live events in order with increasing ids, progress throttled to one per 500 ms per job, heartbeats', async () => {
    const res = await stream.handle(req('GET', '/migrations/stream'), ctx)
    expect(res.headers.get('content-type')).toContain('text/event-stream')
    const pending = readFrames(res, (f) => f.filter((x) => x.event).length >= 4 && f.some((x) => x.comment === 'heartbeat'))
    await Bun.sleep(20)
    await ctx.hub.publishJob(job('a', 'Queued'))
    expect(await ctx.hub.publishProgress({ id: 'a', state: 'CopyingFull', progress: { bytes_done: 1 } })).toBe(true)
    expect(await ctx.hub.publishProgress({ id: 'a', state: 'CopyingFull', progress: { bytes_done: 2 } })).toBe(false)
    expect(await ctx.hub.publishProgress({ id: 'b', state: 'CopyingFull', progress: { bytes_done: 3 } })).toBe(true)
    await ctx.hub.publishJob(job('a', 'Completed'))
    const frames = (await pending).filter((f) => f.event)
    expect(frames.map((f) => [f.event, f.data.id])).toEqual([
      ['migration', 'a'],
      ['progress', 'a'],
      ['progress', 'b'],
      ['migration', 'a'],
    ])
    expect(frames.map((f) => f.data.state ?? f.data.progress)).toEqual(['Queued', 'CopyingFull', 'CopyingFull', 'Completed'])
    for (let i = 1; i < frames.length; i++) expect(frames[i].id!).toBeGreaterThan(frames[i - 1].id!)
    expect(ctx.hub.size).toBe(0)
  })

  test('a progress event the throttle held goes out once the 500 ms are over: the latest one only', async () => {
    const res = await stream.handle(req('GET', '/migrations/stream'), ctx)
    const held = (f: Sse[]) => f.filter((x) => x.event && x.data.id === 'held')
    const pending = readFrames(res, (f) => held(f).length >= 2)
    await Bun.sleep(20)
    const progress = (n: number) => ({ id: 'held', state: 'CopyingFull', progress: { bytes_done: n } })
    expect(await ctx.hub.publishProgress(progress(1))).toBe(true)
    expect(await ctx.hub.publishProgress(progress(2))).toBe(false)
    expect(await ctx.hub.publishProgress(progress(3))).toBe(false)
    const frames = held(await pending)
    expect(frames.map((f) => [f.event, f.data.progress.bytes_done])).toEqual([
      ['progress', 1],
      ['progress', 3],
    ])
    expect(Date.parse(frames[1].data.at) - Date.parse(frames[0].data.at)).toBeGreaterThanOrEqual(490)
  })

  test('Last-Event-ID replays what the client missed; ?id= filters one job', async () => {
    const first = (await ctx.store.events.since(0, 1))[0].seq
    const res = await stream.handle(req('GET', '/migrations/stream', undefined, { 'last-event-id': String(first) }), ctx)
    const frames = (await readFrames(res, (f) => f.filter((x) => x.event).length >= 3)).filter((f) => f.event)
    expect(frames.map((f) => [f.event, f.data.id])).toEqual([
      ['progress', 'a'],
      ['progress', 'b'],
      ['migration', 'a'],
    ])
    const only = await stream.handle(new Request(`http://127.0.0.1/api/v1/migrator/migrations/stream?id=b&last_event_id=0`), ctx).catch((e) => e)
    expect(only.code).toBe('E_MIG_NOT_FOUND')
  })

  test('?id=<job> replays only that job; a bad Last-Event-ID is E_MIG_BAD_REQUEST', async () => {
    const j = await ctx.store.jobs.create({
      id: crypto.randomUUID(),
      plan: {} as any,
      strategy: 'offline',
      effective_mode: 'Cold',
      now: new Date().toISOString(),
    })
    await ctx.hub.publishJob(j)
    await ctx.hub.publishJob(job('other', 'Queued'))
    const res = await stream.handle(new Request(`http://127.0.0.1/api/v1/migrator/migrations/stream?id=${j.id}&last_event_id=0`), ctx)
    const frames = (await readFrames(res, (f) => f.filter((x) => x.event).length >= 1)).filter((f) => f.event)
    expect(frames.map((f) => f.data.id)).toEqual([j.id])
    expect((await thrown(() => stream.handle(req('GET', '/migrations/stream', undefined, { 'last-event-id': 'abc' }), ctx))).code).toBe('E_MIG_BAD_REQUEST')
  })

  test('shutdown closes open streams', async () => {
    const res = await stream.handle(req('GET', '/migrations/stream'), ctx)
    const reader = res.body!.getReader()
    await reader.read()
    expect(ctx.hub.size).toBe(1)
    ctx.hub.closeAll()
    const end = await reader.read()
    expect(end.done).toBe(true)
  })
})
