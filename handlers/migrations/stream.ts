// GET /migrations/stream: SSE stream of migration updates (spec 6, DESIGN.md section 3).
import { MigError } from '../../lib/errors.ts'
import type { StoredEvent } from '../../lib/store/events.ts'
import { query } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'

export const method = 'GET'
export const path = '/migrations/stream'

const encoder = new TextEncoder()

function frame(e: StoredEvent): Uint8Array {
  return encoder.encode(`id: ${e.seq}\nevent: ${e.event}\ndata: ${e.data}\n\n`)
}

/**
 * 200 `text/event-stream`. Events: `migration` (the whole job after each state change),
 * `progress` (`{id, state, progress}`, at most every 500 ms per job); a `: heartbeat` comment
 * every 15 s. `Last-Event-ID` (header, or `last_event_id` query) replays the stored events after
 * it; `?id=<job id>` filters one job. Throws `E_MIG_BAD_REQUEST` for a malformed event id.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const q = query(request)
  const jobId = q.get('id') ?? undefined
  const lastRaw = request.headers.get('last-event-id') ?? q.get('last_event_id')
  const last = lastRaw === null || lastRaw === '' ? null : Number(lastRaw)
  if (last !== null && (!Number.isSafeInteger(last) || last < 0)) throw new MigError('E_MIG_BAD_REQUEST', 'Last-Event-ID must be a non-negative integer')
  if (jobId !== undefined) await ctx.store.jobs.get(jobId)

  let cleanup = () => {}
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      let open = true
      let sentUpTo = last ?? 0
      const pending: StoredEvent[] = []
      let replaying = true
      const send = (e: StoredEvent) => {
        if (!open || e.seq <= sentUpTo) return
        sentUpTo = e.seq
        controller.enqueue(frame(e))
      }
      const close = () => {
        if (!open) return
        open = false
        cleanup()
        try {
          controller.close()
        } catch {}
      }
      const unsubscribe = ctx.hub.subscribe({ jobId, send: (e) => (replaying ? pending.push(e) : send(e)), close })
      const heartbeat = setInterval(() => open && controller.enqueue(encoder.encode(': heartbeat\n\n')), ctx.config.sseHeartbeatSeconds * 1000)
      cleanup = () => {
        clearInterval(heartbeat)
        unsubscribe()
      }
      request.signal?.addEventListener('abort', close)
      controller.enqueue(encoder.encode(`retry: 2000\n: connected\n\n`))
      try {
        if (last !== null) for (const e of await ctx.hub.replay(last, jobId)) send(e)
      } catch (e) {
        ctx.logger.warn({ err: e }, 'sse replay failed')
      }
      replaying = false
      for (const e of pending.splice(0)) send(e)
    },
    cancel() {
      cleanup()
    },
  })
  return new Response(body, {
    headers: {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    },
  })
}
