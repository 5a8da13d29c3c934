/**
 * Inflating stream-optimized VMDK grains off the job's event loop: qemu inflates a
 * stream-optimized VMDK (the disk of nearly every OVA) one grain after another on one thread;
 * `zlib.inflateSync` is faster than that on one thread, and the grains of one read split between
 * the {@link ScriptThread}s here use every core (figures: docs/benchmarks.md).
 *
 * A batch names grains by numbers into two `SharedArrayBuffer` views: `src` holds the compressed
 * bytes as read from the file, `dst` receives the inflated bytes the read asked for. Each grain
 * is inflated whole (zlib format, RFC 1950, as qemu's `uncompress()` reads it), never to more
 * than its grain size (`maxOutputLength`: a deflate bomb stops there), and the asked part of it
 * is copied into `dst`. Each inflation leaves its output buffer and zlib state to the thread's
 * garbage collector, which lets them pile up (a copy of a 1 GiB disk peaked at 815 MiB): a thread
 * collects its heap whole after every {@link GC_EVERY} bytes it inflated: that keeps a job's peak
 * RSS well under the 200 MiB a job may take, at a small cost in speed; no collection doubles the
 * peak, and Bun's quick collection (`Bun.gc(false)`) leaves it too close to the bound (the
 * measurements: docs/benchmarks.md).
 */
import { availableParallelism } from 'node:os'
import { ScriptThread } from '../../script-thread.ts'

/**
 * One grain of a batch, bytes: its compressed data at `src[srcOffset, srcOffset + srcLength)`,
 * the grain's size `grainBytes` (the most it may inflate to), and the part of the inflated grain
 * the read wants, `[skip, skip + length)`, written at `dst[dstOffset]`.
 */
export interface GrainJob {
  srcOffset: number
  srcLength: number
  grainBytes: number
  skip: number
  length: number
  dstOffset: number
}

/** What a batch answers: null when every grain was inflated, else the first failing grain's index in the batch and why. */
export type BatchFailure = { index: number; message: string } | null

/** Numbers per grain in a batch message, in {@link GrainJob} field order. */
const FIELDS = 6

/** Bytes inflated by a thread between two collections of its heap. */
const GC_EVERY = 16 * 1024 * 1024

/** The thread: inflates each grain of `m.jobs` (flat numbers) from `m.src` into `m.dst`. */
const HANDLER = `(() => {
  const { inflateSync } = require('node:zlib')
  let sinceGc = 0
  return (m) => {
    if (sinceGc > ${GC_EVERY}) {
      sinceGc = 0
      if (typeof Bun !== 'undefined') Bun.gc(true)
      else if (typeof gc === 'function') gc()
    }
    const j = m.jobs
    for (let i = 0; i < j.length; i += ${FIELDS}) {
      const [srcOffset, srcLength, grainBytes, skip, length, dstOffset] = j.slice(i, i + ${FIELDS})
      let out
      try {
        out = inflateSync(m.src.subarray(srcOffset, srcOffset + srcLength), { maxOutputLength: grainBytes, chunkSize: Math.max(64, grainBytes) })
      } catch (e) {
        const why = e && e.code === 'ERR_BUFFER_TOO_LARGE' ? 'inflates to more than the grain size (' + grainBytes + ' bytes)' : String((e && e.message) || e)
        return { index: i / ${FIELDS}, message: why }
      }
      if (out.length < skip + length) return { index: i / ${FIELDS}, message: 'inflates to ' + out.length + ' bytes, fewer than the ' + (skip + length) + ' read' }
      m.dst.set(out.subarray(skip, skip + length), dstOffset)
      sinceGc += out.length
    }
    return null
  }
})()`

/** Inflating threads: one per core, at most 4. */
const THREADS = Math.max(1, Math.min(4, availableParallelism()))

let threads: Array<ScriptThread<{ src: Uint8Array; dst: Uint8Array; jobs: number[] }, BatchFailure>> | null = null

/**
 * Inflates `jobs` from `src` into `dst` (both views on `SharedArrayBuffer`s, left unchanged by
 * the caller until the promise settles), the grains split in order among the inflating threads.
 * Resolves null when all were inflated, else the failure of the lowest failing grain (`index` in
 * `jobs`; the grains after it in its thread's share were not written). Rejects only if a thread
 * died (`ScriptThreadError`).
 */
export async function inflateGrains(src: Uint8Array, dst: Uint8Array, jobs: GrainJob[]): Promise<BatchFailure> {
  threads ??= Array.from({ length: THREADS }, (_, i) => new ScriptThread(HANDLER, `inflating thread ${i + 1}`))
  const per = Math.ceil(jobs.length / THREADS)
  const calls: Array<Promise<BatchFailure>> = []
  for (let t = 0; t * per < jobs.length; t++) {
    const flat: number[] = []
    for (const g of jobs.slice(t * per, (t + 1) * per)) flat.push(g.srcOffset, g.srcLength, g.grainBytes, g.skip, g.length, g.dstOffset)
    calls.push(threads[t]!.call({ src, dst, jobs: flat }))
  }
  const answers = await Promise.all(calls)
  for (let t = 0; t < answers.length; t++) {
    const a = answers[t]
    if (a) return { index: t * per + a.index, message: a.message }
  }
  return null
}
