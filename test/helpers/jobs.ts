/**
 * Helpers for tests that drive jobs through the HTTP API: JSON calls, submitting a plan, waiting
 * for a state, reading the SSE stream, and measuring destination images.
 */
import { expect } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { closeSync, openSync, readSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { readLivePid } from '../../lib/exec.ts'
import { sanitizeLabel } from '../../lib/manifest.ts'
import { workerPidFile } from '../../runtime/supervisor.ts'

/** A JSON call: status and parsed body (null for an empty body). */
export async function call(
  base: string,
  method: string,
  p: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: any }> {
  const res = await fetch(base + p, {
    method,
    headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text === '' ? null : JSON.parse(text) }
}

/** Submits `plan`; throws unless the server answers 201. Returns the job. */
export async function submit(base: string, plan: Record<string, unknown>): Promise<any> {
  const r = await call(base, 'POST', '/migrations', { plan })
  if (r.status !== 201) throw new Error(`submit: ${r.status} ${JSON.stringify(r.body)}`)
  return r.body
}

/** An offline plan for an input under the import root (`rel` is relative to it). */
export function offlinePlan(kind: string, rel: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { source: { Offline: kind }, source_ref: { kind: 'offline_host_path', path: rel }, mode: 'Cold', ...extra }
}

/** A plan for the VM `vmId` of the vim_api source `sourceId` (registered with POST /sources), in `mode` ('Cold' or 'Warm'), with `extra` (name, start, cutover...). */
export function livePlan(sourceId: string, vmId: string, mode: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { source: { Live: 'vim_api' }, source_ref: { kind: 'live_vm', source_id: sourceId, vm_id: vmId }, mode, ...extra }
}

/**
 * Waits (up to `timeoutMs`) until job `id` carries a `last_error` whose message matches `pattern`,
 * checks that it is the non-fatal notice `code` of a job still running in `CopyingFull`, and
 * returns the job then (its notice logged).
 */
export async function waitNotice(base: string, id: string, pattern: RegExp, code: string, timeoutMs: number): Promise<any> {
  const job = await waitJob(base, id, (j) => pattern.test(j.last_error?.message ?? '') || !['running', 'queued'].includes(j.status), timeoutMs)
  console.log(`job ${id}: ${JSON.stringify(job.last_error)} at ${job.progress.bytes_done} bytes`)
  expect([job.status, job.state, job.last_error?.code, job.last_error?.fatal]).toEqual(['running', 'CopyingFull', code, false])
  return job
}

/** Polls `GET /migrations/:id` every 100 ms until `pred(job)` holds (default: a terminal status); `headers` go with each poll (e.g. Basic credentials). */
export async function waitJob(
  base: string,
  id: string,
  pred: (job: any) => boolean = (j) => ['completed', 'failed', 'cancelled'].includes(j.status),
  timeoutMs = 120_000,
  headers: Record<string, string> = {},
): Promise<any> {
  const deadline = Date.now() + timeoutMs
  let job: any = null
  while (Date.now() < deadline) {
    job = (await call(base, 'GET', `/migrations/${id}`, undefined, headers)).body
    if (pred(job)) return job
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`job ${id} did not reach the expected state in ${timeoutMs} ms; last: ${JSON.stringify(job)?.slice(0, 600)}`)
}

/** One SSE event as received. */
export interface SseEvent {
  id: number
  event: string
  data: any
}

/**
 * Reads `GET /migrations/stream` in the background (optionally from `lastEventId`), parsing events
 * into `events`. `close()` ends the connection.
 */
export function openStream(base: string, lastEventId?: number): { events: SseEvent[]; ready: Promise<void>; close(): void } {
  const events: SseEvent[] = []
  const ac = new AbortController()
  let readyResolve!: () => void
  const ready = new Promise<void>((r) => (readyResolve = r))
  void (async () => {
    try {
      const res = await fetch(`${base}/migrations/stream`, {
        signal: ac.signal,
        headers: lastEventId === undefined ? {} : { 'last-event-id': String(lastEventId) },
      })
      readyResolve()
      const reader = res.body!.getReader()
      const dec = new TextDecoder()
      let buf = ''
      for (;;) {
        const { value, done } = await reader.read()
        if (done) break
        buf += dec.decode(value, { stream: true })
        let cut: number
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, cut)
          buf = buf.slice(cut + 2)
          const f: Record<string, string> = {}
          for (const line of block.split('\n')) {
            const m = /^(\w+): ?(.*)$/.exec(line)
            if (m) f[m[1]] = m[2]
          }
          if (f.event && f.data) events.push({ id: Number(f.id), event: f.event, data: JSON.parse(f.data) })
        }
      }
    } catch {
      readyResolve()
    }
  })()
  return { events, ready, close: () => ac.abort() }
}

/** Path of a job's destination image in the file sink. */
export function volumePath(dataDir: string, jobId: string, label: string): string {
  return path.join(dataDir, 'volumes', 'migrations', jobId, `${sanitizeLabel(label)}.img`)
}

/** Bytes the file system allocated for `file` (st_blocks x 512). */
export function allocatedBytes(file: string): number {
  return statSync(file).blocks * 512
}

/** Bytes of `file` in `block`-sized blocks that are not all zero (the data a sparse copy must hold). */
export function nonZeroBytes(file: string, block = 4096): number {
  const fd = openSync(file, 'r')
  const buf = Buffer.alloc(4 << 20)
  let pos = 0
  let total = 0
  try {
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, pos)
      if (n <= 0) break
      for (let o = 0; o < n; o += block) {
        const end = Math.min(o + block, n)
        for (let i = o; i < end; i++) {
          if (buf[i] !== 0) {
            total += end - o
            break
          }
        }
      }
      pos += n
    }
  } finally {
    closeSync(fd)
  }
  return total
}

/**
 * Pid of the worker running job `jobId` of the server on `dataDir` (its pid file
 * `<dataDir>/workers/<jobId>.pid`, runtime/supervisor.ts), or null when there is none or the
 * process is gone (a killed server leaves its file behind).
 */
export function workerPid(dataDir: string, jobId: string): number | null {
  return readLivePid(workerPidFile(dataDir, jobId))
}

/**
 * Server environment for jobs that boot a test disk under TCG: the domain must stay up 1 s and
 * print `marker` on its serial console within 20 s.
 */
export function bootCheckEnv(marker: string): Record<string, string> {
  return { MIGRATOR_DOMAIN_TYPE: 'qemu', MIGRATOR_BOOT_GRACE_SECONDS: '1', MIGRATOR_BOOT_TIMEOUT_SECONDS: '20', MIGRATOR_BOOT_SERIAL_PATTERN: marker }
}

/** Waits (up to `timeoutMs`) until `stream` has carried a `migration` event of job `id` in `state`: the last event may arrive just after a GET reads it. */
export async function streamSaw(stream: { events: SseEvent[] }, id: string, state: string, timeoutMs = 5000): Promise<void> {
  for (const end = Date.now() + timeoutMs; Date.now() < end; await new Promise((r) => setTimeout(r, 100))) {
    if (stream.events.some((e) => e.event === 'migration' && e.data.id === id && e.data.state === state)) return
  }
}
