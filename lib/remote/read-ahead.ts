/**
 * Sequential read-ahead over a {@link RemoteFile}. The disk readers read an image's data in file
 * order but in pieces as small as one cluster or grain (64 KiB: a qcow2 whose allocated clusters
 * alternate with holes, a stream-optimized VMDK's grains), and every read of a remote file is a
 * request of its own (a ranged `GET`, an SMB `READ` and its change check): a round trip per
 * 64 KiB. Once reads follow one another (each starts where the previous one ended), one request
 * fetches a window ahead and the next reads are served from it, the way the kernel's read-ahead
 * serves a file read sequentially.
 *
 * - The window grows with the sequential run: twice the bytes read in a row so far, from the
 *   read's own length up to `maxWindowBytes` (default 4 MiB), and once it is that large the next
 *   `ahead` windows (default 4) are fetched while the reader reads the current one: a reader
 *   that waits for each read still has that many requests in flight, which a link's
 *   bandwidth-delay product needs (a single window in flight leaves a 20 ms round trip idle
 *   between windows) and which a transport serves at once (HTTP's connection pool, SMB's
 *   outstanding `READ`s).
 * - A read that is not sequential, or of at least `maxWindowBytes` (the transport already splits
 *   and parallelises those), goes to the file as it is.
 * - At most `ahead + 2` windows are kept, in flight or fetched (the one read, the one before it
 *   for a read across their border, those ahead): memory stays at `(ahead + 2) x
 *   maxWindowBytes`. Reads issued while a window is in flight wait for it.
 * - The file's own checks hold: every window is a read of the file (identity compared on each
 *   request); a failed window is dropped, and its readers get its error.
 * The bytes fetched beyond what is read are at most `ahead + 1` windows per sequence broken off (the end
 * of a copy attempt), which stays inside the resume rule's one flush interval.
 * Off until `readAhead(true)`: the job turns it on for the copy, after the inspection, whose
 * header, table and digest reads must cost one pass over the export, not a window more per
 * member.
 */
import type { RemoteFile } from '../contracts/remote-file.ts'

/** Settings of {@link withReadAhead}; bytes. */
export interface ReadAheadOptions {
  maxWindowBytes?: number
  /** Full windows fetched ahead of the one being read (default 4). */
  ahead?: number
}

interface Window {
  pos: number
  end: number
  /** Resolves to the bytes the file gave for `[pos, end)` (fewer only at the object's end). */
  got: Promise<Buffer>
  /** The window's buffer, its users (the fetch while in flight, each read copying from it), and whether it was let go. */
  buf: Buffer
  busy: number
  dropped: boolean
}

/** `file` with sequential read-ahead (see the module comment); `close()` closes `file`. */
export function withReadAhead(file: RemoteFile, opts: ReadAheadOptions = {}): RemoteFile {
  const maxWindow = Math.max(64 * 1024, opts.maxWindowBytes ?? 4 * 1024 * 1024)
  const depth = Math.max(1, opts.ahead ?? 4)
  const keep = depth + 2
  const windows: Window[] = []
  let on = false
  let lastEnd = -1
  let run = 0

  // Full-size window buffers are reused once let go and unused: a fresh buffer of megabytes costs
  // the kernel's page faults and zeroing on every window, more than the copy out of it.
  const pool: Buffer[] = []
  const release = (w: Window): void => {
    if (w.dropped && w.busy === 0 && w.buf.length === maxWindow && pool.length < keep) pool.push(w.buf)
  }
  const drop = (w: Window): void => {
    w.dropped = true
    release(w)
  }
  /** Starts fetching `[pos, pos + size)` as a window (the oldest window is forgotten past `keep`). */
  const fetch = (pos: number, size: number): Window => {
    const buf = (size === maxWindow ? pool.pop() : undefined) ?? Buffer.allocUnsafe(size)
    const got = file.read(buf, pos).then((k) => buf.subarray(0, k))
    const w: Window = { pos, end: pos + size, got, buf, busy: 1, dropped: false }
    const settled = () => {
      w.busy--
      release(w)
    }
    got.then(settled, () => {
      const i = windows.indexOf(w)
      if (i >= 0) windows.splice(i, 1)
      w.dropped = true
      settled()
    })
    windows.push(w)
    if (windows.length > keep) drop(windows.shift()!)
    return w
  }
  /** Fetches the `depth` full windows from `pos` that are not fetched yet, up to the object's end. */
  const ahead = (pos: number): void => {
    for (let i = 0, p = pos; i < depth && p < file.size; i++, p += maxWindow)
      if (!windows.some((w) => w.pos === p)) fetch(p, Math.min(maxWindow, file.size - p))
  }

  const serve = async (w: Window, into: Buffer, pos: number, n: number): Promise<number> => {
    w.busy++
    try {
      const got = await w.got
      const from = pos - w.pos
      const k = Math.max(0, Math.min(n, got.length - from))
      got.copy(into, 0, from, from + k)
      return k
    } finally {
      w.busy--
      release(w)
    }
  }

  return {
    get name() {
      return file.name
    },
    get size() {
      return file.size
    },
    get identity() {
      return file.identity
    },
    async read(into: Buffer, pos: number): Promise<number> {
      const n = Math.max(0, Math.min(into.length, file.size - pos))
      if (n === 0 || !on) return file.read(into, pos)
      const sequential = pos === lastEnd
      lastEnd = pos + n
      run = sequential ? run + n : 0
      const hit = windows.find((w) => pos >= w.pos && pos + n <= w.end)
      if (hit) {
        // a reader at full window size gets the next windows fetched while it reads this one
        // (the read holds its window first: a window let go by the fetches is reused)
        const served = serve(hit, into, pos, n)
        if (hit.end - hit.pos === maxWindow) ahead(hit.end)
        return served
      }
      // a read across the end of a window into the next one (reads of odd sizes)
      const head = windows.find((w) => pos >= w.pos && pos < w.end)
      const tail = head && windows.find((w) => w.pos === head.end && pos + n <= w.end)
      if (head && tail) {
        const k = head.end - pos
        const [a, b] = await Promise.all([serve(head, into, pos, k), serve(tail, into.subarray(k), head.end, n - k)])
        if (tail.end - tail.pos === maxWindow) ahead(tail.end)
        return a + b
      }
      const size = Math.min(file.size - pos, maxWindow, Math.max(n, 2 * run))
      if (!sequential || n >= maxWindow || size <= n) return file.read(into, pos)
      return serve(fetch(pos, size), into, pos, n)
    },
    readAhead(v: boolean) {
      on = v
      if (!v) for (const w of windows.splice(0)) drop(w)
    },
    close() {
      windows.length = 0
      pool.length = 0
      file.close()
    },
  }
}
