/**
 * Prefetch of an async iterable: the items are pulled by a background pump into a
 * bounded queue while the consumer is busy with earlier ones, so a slow producer (the extents of
 * a disk from NBD block status or `qemu-img map`) runs side by side with the consumer (a
 * `qemu-img convert` per range) instead of in series with it.
 */

/**
 * Yields the items of `source` in order, pulling up to `max` items (at least 1) ahead of the
 * consumer. An error of `source` is thrown at the place of the item it replaced (items before it
 * are yielded first). When the consumer stops early (break, return, throw), the pump is stopped
 * and `source` is closed (its `return()`, e.g. a child process killed) before this generator
 * finishes. Memory: at most `max` items queued.
 */
export async function* prefetch<T>(source: AsyncIterable<T>, max: number): AsyncGenerator<T> {
  const it = source[Symbol.asyncIterator]()
  const limit = Math.max(1, Math.floor(max))
  const queue: T[] = []
  let done = false
  let failure: { error: unknown } | null = null
  let stopped = false
  // One waiter on each side: the consumer waiting for an item, the pump waiting for room.
  let wakeConsumer: (() => void) | null = null
  let wakePump: (() => void) | null = null
  const wake = (w: (() => void) | null) => w?.()

  const pump = (async () => {
    try {
      while (!stopped) {
        if (queue.length >= limit) {
          await new Promise<void>((r) => (wakePump = r))
          wakePump = null
          continue
        }
        const r = await it.next()
        if (r.done) break
        queue.push(r.value)
        wake(wakeConsumer)
      }
    } catch (e) {
      failure = { error: e }
    } finally {
      done = true
      wake(wakeConsumer)
    }
  })()

  try {
    for (;;) {
      if (queue.length > 0) {
        const item = queue.shift() as T
        wake(wakePump)
        yield item
        continue
      }
      if (done) {
        if (failure) throw (failure as { error: unknown }).error
        return
      }
      await new Promise<void>((r) => (wakeConsumer = r))
      wakeConsumer = null
    }
  } finally {
    stopped = true
    wake(wakePump)
    await pump
    if (!failure) await it.return?.(undefined)
  }
}
