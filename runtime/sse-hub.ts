/**
 * The SSE hub (DESIGN.md section 3): job events are stored with an increasing sequence number
 * (the SSE `id:`) and fanned out to every open `GET /migrations/stream`. `progress` events are
 * throttled to one per job every 500 ms: one that comes sooner is held, replaced by any later one,
 * and sent when the 500 ms are over (so the latest progress is never lost to the throttle), unless
 * a `migration` event of that job comes first (it carries the job's progress too). `migration`
 * events are never dropped.
 */
import type { EventsRepo, StoredEvent } from '../lib/store/events.ts'
import { TrailingThrottle } from '../lib/throttle.ts'
import type { Logger } from './logger.ts'

/** A live subscriber: receives events, is closed on shutdown. */
export interface Subscriber {
  jobId?: string
  send(e: StoredEvent): void
  close(): void
}

/** A `progress` event's data before its `at`. */
type ProgressData = { id: string; state: string; progress: unknown }

/** Minimum milliseconds between two `progress` events of one job. */
export const PROGRESS_INTERVAL_MS = 500

/** Fans job events out to SSE subscribers and stores them for `Last-Event-ID` replay. */
export class SseHub {
  private readonly subs = new Set<Subscriber>()
  /** Per job, the throttle of its `progress` events (it holds the latest one back). */
  private readonly progress = new Map<string, TrailingThrottle<ProgressData>>()
  private appends = 0
  /** Called with every job published (the metrics count from them); not SSE subscribers. */
  private readonly jobObservers: Array<(job: { id: string }) => void> = []

  constructor(
    private readonly events: EventsRepo,
    private readonly logger: Logger,
    private readonly replayWindow: number,
    private readonly now: () => Date = () => new Date(),
  ) {}

  /** Stores and broadcasts a `migration` event carrying the whole job. */
  async publishJob(job: { id: string }): Promise<void> {
    this.progress.get(job.id)?.drop()
    await this.publish(job.id, 'migration', job)
    for (const o of this.jobObservers) {
      try {
        o(job)
      } catch (e) {
        this.logger.warn({ err: e }, 'job observer failed')
      }
    }
  }

  /** Calls `observer` with every job published from now on (after it is stored and sent). */
  observeJobs(observer: (job: { id: string }) => void): void {
    this.jobObservers.push(observer)
  }

  /**
   * Stores and broadcasts a `progress` event `{id, state, progress, at}` (`at`: ISO-8601 time of
   * the sample, so a replayed history can be charted over time). When one for the same job went
   * out less than 500 ms ago (and not `force`), this one is held and sent when the 500 ms are over
   * (see the module comment). Returns whether it was sent now.
   */
  publishProgress(data: ProgressData, force = false): Promise<boolean> {
    let throttle = this.progress.get(data.id)
    if (!throttle) {
      throttle = new TrailingThrottle<ProgressData>(
        PROGRESS_INTERVAL_MS,
        (d) => this.publish(d.id, 'progress', { ...d, at: this.now().toISOString() }),
        (e) => this.logger.warn({ err: e }, 'held progress event failed'),
        () => this.now().getTime(),
      )
      this.progress.set(data.id, throttle)
    }
    return throttle.offer(data, force)
  }

  private async publish(jobId: string, event: string, data: unknown): Promise<void> {
    const stored = await this.events.append(jobId, event, data, this.now().toISOString())
    for (const s of this.subs) {
      if (s.jobId === undefined || s.jobId === jobId) {
        try {
          s.send(stored)
        } catch (e) {
          this.logger.warn({ err: e }, 'sse subscriber failed; dropping it')
          this.subs.delete(s)
        }
      }
    }
    if (++this.appends % 500 === 0) await this.events.prune(this.replayWindow).catch((e) => this.logger.warn({ err: e }, 'event prune failed'))
  }

  /** Adds a subscriber; returns the function that removes it. */
  subscribe(s: Subscriber): () => void {
    this.subs.add(s)
    return () => this.subs.delete(s)
  }

  /** Events after `seq` for replay, at most the replay window. */
  replay(seq: number, jobId?: string): Promise<StoredEvent[]> {
    return this.events.since(seq, this.replayWindow, jobId)
  }

  /** Number of open subscribers. */
  get size(): number {
    return this.subs.size
  }

  /** Closes every subscriber (graceful shutdown). */
  closeAll(): void {
    for (const t of this.progress.values()) t.drop()
    for (const s of this.subs) s.close()
    this.subs.clear()
  }
}
