/**
 * Waiting and retrying, the one place the code waits between tries: `sleep` (a delay an
 * AbortSignal cuts short) and `retry` (a bounded number of tries of an async operation, a fixed
 * or growing delay between them, a predicate choosing which errors are retried). Loops whose
 * retry depends on more than the error (an HTTP status answered, a closed client, a new name
 * between tries) keep their own loop and wait with `sleep`.
 */
import { setTimeout as delay } from 'node:timers/promises'
import { MigError } from './errors.ts'

/** The error a wait cut short by its signal rejects with when the caller names none. */
function defaultAbortError(): MigError {
  return new MigError('E_MIG_CANCELLED', 'cancelled')
}

/**
 * Resolves after `ms` milliseconds (below 1: the next timer tick). With `signal`: rejects with
 * `abortError()` (default `E_MIG_CANCELLED` "cancelled") at once when the signal is aborted
 * already, or as soon as it aborts (the timer is then cleared).
 */
export async function sleep(ms: number, signal?: AbortSignal, abortError: () => unknown = defaultAbortError): Promise<void> {
  if (!signal) {
    await delay(ms)
    return
  }
  if (signal.aborted) throw abortError()
  try {
    await delay(ms, undefined, { signal })
  } catch (e) {
    if (signal.aborted) throw abortError()
    throw e
  }
}

/** How {@link retry} retries. */
export interface RetryOptions {
  /** Tries in all, the first included; at least one is made (a value below 1 counts as 1). */
  attempts: number
  /**
   * The wait after failed try `n` (0 for the first) before the next one, ms: a number for a fixed
   * delay, a function for a growing one (`(n) => 250 * 2 ** n`: 250, 500, 1000 ...). Default 0:
   * the next try at once.
   */
  delayMs?: number | ((n: number) => number)
  /** Whether the error of failed try `n` (0-based) is retried; default: every error. */
  shouldRetry?: (error: unknown, n: number) => boolean
  /**
   * Stops the retries: no try starts once it is aborted, and a wait between tries rejects as soon
   * as it aborts, with `abortError()` (default `E_MIG_CANCELLED` "cancelled"). A try under way is
   * not interrupted (pass the signal into `fn` for that).
   */
  signal?: AbortSignal
  abortError?: () => unknown
}

/**
 * Calls `fn` (given the try's number, 0 for the first) until it resolves, and resolves with its
 * value. An error is thrown as it is when `shouldRetry` refuses it or it came from the last of
 * `attempts` tries; else the next try follows after `delayMs`. Rejects with `abortError()` when
 * `signal` aborts (see {@link RetryOptions.signal}).
 */
export async function retry<T>(fn: (n: number) => Promise<T>, opts: RetryOptions): Promise<T> {
  const attempts = Math.max(1, opts.attempts)
  const abortError = opts.abortError ?? defaultAbortError
  for (let n = 0; ; n++) {
    if (opts.signal?.aborted) throw abortError()
    try {
      return await fn(n)
    } catch (e) {
      if (n + 1 >= attempts || (opts.shouldRetry && !opts.shouldRetry(e, n))) throw e
      const ms = typeof opts.delayMs === 'function' ? opts.delayMs(n) : (opts.delayMs ?? 0)
      if (ms > 0) await sleep(ms, opts.signal, abortError)
    }
  }
}
