/**
 * A trailing throttle: passes at most one value every `everyMs` milliseconds to `send`. A value
 * offered sooner is held, replaced by any later one, and sent when the interval ends, so the latest
 * value is never lost to the throttle. Used for job progress (the orchestrator's stored progress and
 * the SSE hub's `progress` events).
 */
export class TrailingThrottle<T> {
  /** When the last value went out (ms, from `now`); undefined before the first. */
  private last: number | undefined
  private held: { value: T; timer: ReturnType<typeof setTimeout> } | undefined

  /**
   * @param everyMs least time between two sends (milliseconds)
   * @param send receives each value let through; a rejection of a held value's send goes to `onError`
   * @param onError called with what a held value's `send` threw or rejected with
   * @param now the clock (milliseconds)
   */
  constructor(
    private readonly everyMs: number,
    private readonly send: (value: T) => void | Promise<void>,
    private readonly onError: (e: unknown) => void,
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * Sends `value` now when the interval since the last send is over (or `force`), dropping any
   * held value; otherwise holds it for the end of the interval. `send` is called synchronously when
   * the value goes now. Resolves to whether it went now; rejects with what `send` threw.
   */
  async offer(value: T, force = false): Promise<boolean> {
    const t = this.now()
    const wait = this.last === undefined ? 0 : this.everyMs - (t - this.last)
    if (!force && wait > 0) {
      if (this.held) this.held.value = value
      else {
        const timer = setTimeout(
          () => {
            const h = this.held
            if (h) this.offer(h.value, true).catch(this.onError)
          },
          Math.min(wait, this.everyMs),
        )
        timer.unref?.()
        this.held = { value, timer }
      }
      return false
    }
    this.drop()
    this.last = t
    await this.send(value)
    return true
  }

  /** Forgets the held value, if any (it is never sent). */
  drop(): void {
    if (!this.held) return
    clearTimeout(this.held.timer)
    this.held = undefined
  }
}
