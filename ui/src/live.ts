/**
 * Live job state from the SSE stream (`GET /migrations/stream`, docs/api.md "Resources"): an
 * EventSource that follows `migration` and `progress` events, resumes after a lost connection
 * with `Last-Event-ID` (the browser's own reconnect, or a new EventSource with
 * `?last_event_id=` when the browser gave up), and reports whether the connection is up.
 */
import type { Job, JobState, Progress } from '../../lib/job.ts'
import { API_BASE } from './api.ts'

/** `live`: the stream is open; `lost`: it dropped and the console is reconnecting. */
export type Connection = 'connecting' | 'live' | 'lost'

/** A `progress` event: `{id, state, progress, at}` (`at`: ISO time of the sample). */
export interface ProgressEvent {
  id: string
  state: JobState
  progress: Progress
  at?: string
}

/** What a stream reports to its owner. `open` fires on every (re)connection: time to catch up. */
export interface StreamHandlers {
  migration(job: Job): void
  progress(p: ProgressEvent): void
  connection(c: Connection): void
  open?(): void
}

/** Milliseconds before a new EventSource replaces one the browser closed for good. */
const REOPEN_MS = 2000

/**
 * Opens the stream (optionally of one job, optionally replaying from event `from`, 0 = the whole
 * kept history). Returns the function that closes it.
 */
export function openStream(opts: { id?: string; from?: number }, h: StreamHandlers): () => void {
  let es: EventSource | null = null
  let last: string | null = opts.from === undefined ? null : String(opts.from)
  let closed = false
  let timer: ReturnType<typeof setTimeout> | undefined
  const connect = () => {
    if (closed) return
    const q = new URLSearchParams()
    if (opts.id) q.set('id', opts.id)
    if (last !== null) q.set('last_event_id', last)
    const src = new EventSource(`${API_BASE}/migrations/stream?${q}`)
    es = src
    src.onopen = () => {
      h.connection('live')
      h.open?.()
    }
    src.onerror = () => {
      if (closed) return
      h.connection('lost')
      if (src.readyState === EventSource.CLOSED) {
        src.close()
        timer = setTimeout(connect, REOPEN_MS)
      }
    }
    src.addEventListener('migration', (e) => {
      const m = e as MessageEvent<string>
      if (m.lastEventId) last = m.lastEventId
      h.migration(JSON.parse(m.data) as Job)
    })
    src.addEventListener('progress', (e) => {
      const m = e as MessageEvent<string>
      if (m.lastEventId) last = m.lastEventId
      h.progress(JSON.parse(m.data) as ProgressEvent)
    })
  }
  h.connection('connecting')
  connect()
  return () => {
    closed = true
    clearTimeout(timer)
    es?.close()
  }
}

/** `job` with a progress event applied (state and progress), unless the event is stale. */
export function applyProgress(job: Job, p: ProgressEvent): Job {
  if (TERMINAL.has(job.state) && !TERMINAL.has(p.state)) return job
  return { ...job, state: p.state, progress: p.progress }
}

/**
 * The copy of one job to keep when `next` arrives and `prev` is held: API answers and stream
 * events travel on different connections and can arrive in either order (a cancel's 202 answer,
 * still `CopyingFull`, after the stream's `Cancelled`). `next`, unless it is the same job and
 * would take it from a finished state back to a running one or is older (`updated_at`).
 */
export function fresher(prev: Job | null | undefined, next: Job): Job {
  if (!prev || prev.id !== next.id) return next
  if (TERMINAL.has(prev.state) && !TERMINAL.has(next.state)) return prev
  return Date.parse(next.updated_at) < Date.parse(prev.updated_at) ? prev : next
}

/** States a job never leaves. */
export const TERMINAL: ReadonlySet<JobState> = new Set(['Completed', 'Failed', 'Cancelled'])
