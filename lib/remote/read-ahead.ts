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
 *   window is fetched while the reader reads the current one (a reader that waits for each read
 *   still has a request in flight).
 * - A read that is not sequential, or of at least `maxWindowBytes` (the transport already splits
 *   and parallelises those), goes to the file as it is.
 * - At most `windows` windows (default 4) are kept, in flight or fetched: memory stays at
 *   `windows x maxWindowBytes`. Reads issued while a window is in flight wait for it.
 * - The file's own checks hold: every window is a read of the file (identity compared on each
 *   request); a failed window is dropped, and its readers get its error.
 * The bytes fetched beyond what is read are at most two windows per sequence broken off (the end
 * of a copy attempt), which stays inside the resume rule's one flush interval.
 * Off until `readAhead(true)`: the job turns it on for the copy, after the inspection, whose
 * header, table and digest reads must cost one pass over the export, not a window more per
 * member.
 */
import type { RemoteFile } from '../contracts/remote-file.ts'

/** Settings of {@link withReadAhead}; bytes. */
export interface ReadAheadOptions {
  maxWindowBytes?: number
  windows?: number
}

interface Window {
  pos: number
  end: number
  /** Resolves to the bytes the file gave for `[pos, end)` (fewer only at the object's end). */
  got: Promise<Buffer>
}

/** `file` with sequential read-ahead (see the module comment); `close()` closes `file`. */
export function withReadAhead(file: RemoteFile, opts: ReadAheadOptions = {}): RemoteFile {
  const maxWindow = Math.max(64 * 1024, opts.maxWindowBytes ?? 4 * 1024 * 1024)
  const keep = Math.max(1, opts.windows ?? 4)
  const windows: Window[] = []
  let on = false
  let lastEnd = -1
  let run = 0

  /** Starts fetching `[pos, pos + size)` as a window (the oldest window is forgotten past `keep`). */
  const fetch = (pos: number, size: number): Window => {
    const buf = Buffer.allocUnsafe(size)
    const w: Window = { pos, end: pos + size, got: file.read(buf, pos).then((k) => buf.subarray(0, k)) }
    windows.push(w)
    if (windows.length > keep) windows.shift()
    w.got.catch(() => {
      const i = windows.indexOf(w)
      if (i >= 0) windows.splice(i, 1)
    })
    return w
  }
  /** Fetches the full window at `pos` unless one starts there or the object ends. */
  const ahead = (pos: number): void => {
    if (pos < file.size && !windows.some((w) => w.pos === pos)) fetch(pos, Math.min(maxWindow, file.size - pos))
  }

  const serve = async (w: Window, into: Buffer, pos: number, n: number): Promise<number> => {
    const got = await w.got
    const from = pos - w.pos
    const k = Math.max(0, Math.min(n, got.length - from))
    got.copy(into, 0, from, from + k)
    return k
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
        // a reader at full window size gets the next window fetched while it reads this one
        if (hit.end - hit.pos === maxWindow) ahead(hit.end)
        return serve(hit, into, pos, n)
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
      if (!v) windows.length = 0
    },
    close() {
      windows.length = 0
      file.close()
    },
  }
}
