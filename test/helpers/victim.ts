/**
 * The target of the cross-site tests: a real migrator server (Bun or Node) holding one of each
 * resource a hostile page would go after — a registered source, an upload, a job running (a
 * throttled copy), a job queued behind it (`MIGRATOR_MAX_JOBS=1`), a bulk plan — and a TCP
 * listener standing in for the source's vSphere endpoint that counts the connections the
 * server opens to it (`POST /sources/:id/test`, `GET /sources/:id/vms` connect out). A
 * snapshot of what the API lists tells whether anything changed.
 */
import { chmodSync, mkdirSync, openSync, closeSync, writeSync } from 'node:fs'
import { createServer, type Server } from 'node:net'
import { request as httpRequest } from 'node:http'
import { randomBytes } from 'node:crypto'
import * as path from 'node:path'
import { buildInput } from './inputs.ts'
import { offlinePlan, waitJob } from './jobs.ts'
import { startServer, type RunningServer } from './server.ts'
import { tempDir } from './tmp.ts'

const MiB = 1024 * 1024

/** Name prefix of the victim's jobs and plans (no domain is ever defined: `start: false`, cancelled mid-copy). */
export const VICTIM_PREFIX = 'i46-'

/** Basic credentials the victim server requires (the browser or client holds them). */
export const VICTIM_AUTH = 'operator:s3cret-pass'

/** An answer of {@link send}: status, headers, parsed JSON body (or the text, or null when empty). */
export interface Sent {
  status: number
  headers: Record<string, string | string[] | undefined>
  body: any
}

/**
 * One HTTP/1.1 request through node:http, so every header is exactly what the test says (`Host`,
 * `Origin`, `Sec-Fetch-*` included). `body` is sent as is.
 */
export function send(base: string, method: string, p: string, headers: Record<string, string> = {}, body?: string | Buffer): Promise<Sent> {
  const u = new URL(base + p)
  return new Promise((resolve, reject) => {
    const r = httpRequest(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname + u.search,
        method,
        headers: { ...(body === undefined ? {} : { 'content-length': String(Buffer.byteLength(body)) }), ...headers },
      },
      (res) => {
        const parts: Buffer[] = []
        // the SSE stream never ends: its status and headers are enough
        if (String(res.headers['content-type']).startsWith('text/event-stream')) {
          res.destroy()
          return resolve({ status: res.statusCode ?? 0, headers: res.headers, body: null })
        }
        res.on('data', (d) => parts.push(d))
        res.on('end', () => {
          const text = Buffer.concat(parts).toString('utf8')
          let parsed: any = text === '' ? null : text
          try {
            parsed = JSON.parse(text)
          } catch {}
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: parsed })
        })
      },
    )
    r.on('error', reject)
    if (body !== undefined) r.write(body)
    r.end()
  })
}

/** The victim: its server, the ids of its resources, the connection counter, and its snapshot. */
export interface Victim {
  srv: RunningServer
  base: string
  /** `Authorization` header of {@link VICTIM_AUTH}. */
  auth: Record<string, string>
  ids: { source: string; upload: string; running: string; queued: string; plan: string; planJob: string }
  /** Connections the server opened to the source's endpoint so far. */
  outbound(): number
  /** What the API lists: source, upload and plan ids, and each job's id and status. */
  snapshot(): Promise<string>
  /** A legitimate client's JSON call (Basic credentials, JSON content type, no Origin). */
  call(method: string, p: string, body?: unknown): Promise<Sent>
  /** Cancels the jobs, stops the server and the listener, removes the data directory. */
  close(): Promise<void>
}

/** A valid `POST /sources` body whose endpoint is the counting listener on `port`. */
export function sourceBody(name: string, port: number): Record<string, unknown> {
  return { name, kind: 'vim_api', endpoint: `https://127.0.0.1:${port}/sdk`, username: 'u', password: 'p' }
}

/**
 * Starts the victim under `runtime` with `env` (Basic auth on: {@link VICTIM_AUTH}) and creates
 * its resources with legitimate calls; returns once the first job copies and the others wait.
 */
export async function startVictim(runtime: 'bun' | 'node', env: Record<string, string> = {}): Promise<Victim> {
  const t = tempDir(`${VICTIM_PREFIX}victim-${runtime}-`)
  chmodSync(t.dir, 0o755)
  const dataDir = path.join(t.dir, 'data')
  const importRoot = path.join(dataDir, 'imports')
  mkdirSync(importRoot, { recursive: true, mode: 0o750 })
  // 48 MiB of data read at 256 KiB/s: the copy runs for minutes, longer than any test here
  const raw = path.join(t.dir, 'big.raw')
  const fd = openSync(raw, 'w')
  for (let at = 0; at < 48 * MiB; at += 4 * MiB) writeSync(fd, randomBytes(4 * MiB), 0, undefined, at)
  closeSync(fd)
  buildInput('qcow2', importRoot, 'big', [raw])

  let connections = 0
  const listener: Server = createServer((s) => {
    connections++
    s.destroy()
  })
  await new Promise<void>((r) => listener.listen(0, '127.0.0.1', r))
  const probePort = (listener.address() as { port: number }).port

  const srv = await startServer(runtime, dataDir, {
    MIGRATOR_BASIC_AUTH: VICTIM_AUTH,
    MIGRATOR_MAX_JOBS: '1',
    MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(256 * 1024),
    MIGRATOR_LOG_LEVEL: 'warn',
    ...env,
  })
  const base = srv.base
  const auth = { authorization: `Basic ${Buffer.from(VICTIM_AUTH).toString('base64')}` }
  const call = (method: string, p: string, body?: unknown) =>
    send(base, method, p, body === undefined ? auth : { ...auth, 'content-type': 'application/json' }, body === undefined ? undefined : JSON.stringify(body))
  const must = async (method: string, p: string, body: unknown, status: number) => {
    const r = await call(method, p, body)
    if (r.status !== status) throw new Error(`victim setup: ${method} ${p} answered ${r.status} ${JSON.stringify(r.body)}`)
    return r.body
  }
  try {
    const source = (await must('POST', '/sources', sourceBody(`${VICTIM_PREFIX}vc`, probePort), 201)).id
    const form = new FormData()
    form.append('file', new Blob([Buffer.alloc(4096, 7)]), 'small.img')
    const up = await fetch(`${base}/uploads`, { method: 'POST', headers: auth, body: form })
    if (up.status !== 201) throw new Error(`victim setup: upload answered ${up.status} ${await up.text()}`)
    const upload = ((await up.json()) as { id: string }).id
    const plan = (n: string) => offlinePlan('qcow2', 'big/big.qcow2', { name: `${VICTIM_PREFIX}${runtime}-${n}`, start: false })
    const running = (await must('POST', '/migrations', { plan: plan('run') }, 201)).id
    const queued = (await must('POST', '/migrations', { plan: plan('queued') }, 201)).id
    const bulk = await must('POST', '/plans', { name: `${VICTIM_PREFIX}bulk`, vms: [{ key: 'a', plan: plan('bulk') }] }, 201)
    await waitJob(base, running, (j) => j.status === 'running' && j.progress?.bytes_done > 0, 60_000, auth)
    const ids = { source, upload, running, queued, plan: bulk.id, planJob: bulk.vms[0].job_id }
    return {
      srv,
      base,
      auth,
      ids,
      outbound: () => connections,
      call,
      async snapshot() {
        const items = async (p: string) => ((await call('GET', p)).body as { items: any[] }).items
        return JSON.stringify({
          sources: (await items('/sources')).map((s) => s.id).sort(),
          uploads: (await items('/uploads')).map((u) => u.id).sort(),
          plans: (await items('/plans')).map((p) => p.id).sort(),
          jobs: (await items('/migrations')).map((j) => `${j.id}:${j.status}`).sort(),
        })
      },
      async close() {
        for (const id of [running, queued, ids.planJob]) await call('POST', `/migrations/${id}/cancel`)
        await waitJob(base, running, undefined, 60_000, auth).catch(() => {})
        await srv.stop()
        listener.close()
        t.cleanup()
      },
    }
  } catch (e) {
    await srv.stop()
    listener.close()
    t.cleanup()
    throw e
  }
}
