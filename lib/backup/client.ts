/**
 * Client of the host's backup API (spec 4 "Backup endpoints used by operators", spec 5.2), used to
 * take a restore point before risky storage work.
 *
 *   POST {base_url}/api/v1/backup/jobs/{job_id}/run   -> a run identifier
 *   GET  {base_url}/api/v1/backup/restore-points      -> restore points (possibly quiesced)
 *
 * HTTP Basic authentication; TLS trusted by a CA (PEM), by a pinned SHA-256 certificate
 * fingerprint (for self-signed endpoints), or explicitly insecure. The bodies are "not shown" in
 * the spec: the client accepts `run_id`/`id` for a run and a list (bare, `items` or `data`) of
 * `{id, run_id, job_id, created_at, quiesced}` for restore points.
 */
// The package file, not the bare 'undici' specifier: Bun substitutes a built-in shim for that
// specifier whose connector ignores `ca` and certificate pinning.
import { Agent, request } from 'undici/index.js'
import { tlsConnector } from '../tls.ts'
import { z } from 'zod'
import { MigError } from '../errors.ts'
import { sleep } from '../retry.ts'

/** How to reach the backup API. `baseUrl` is the host's `{base_url}` (the client adds `/api/v1`). */
export interface BackupClientOptions {
  baseUrl: string
  username: string
  password: string
  tls?: { ca_pem?: string; fingerprint256?: string; insecure?: boolean }
  /** Per-request timeout in milliseconds (default 30 000). */
  timeoutMs?: number
}

/** A restore point as the migrator records it. */
export interface RestorePoint {
  id: string
  run_id: string | null
  job_id: string | null
  created_at: string | null
  quiesced: boolean
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

const RunBody = z.union([
  z.looseObject({ run_id: z.union([z.string(), z.number()]) }).transform((b) => String(b.run_id)),
  z.looseObject({ id: z.union([z.string(), z.number()]) }).transform((b) => String(b.id)),
  z.looseObject({ data: z.looseObject({ run_id: z.union([z.string(), z.number()]) }) }).transform((b) => String(b.data.run_id)),
])

const PointBody = z
  .looseObject({
    id: z.union([z.string(), z.number()]).optional(),
    restore_point_id: z.union([z.string(), z.number()]).optional(),
    run_id: z.union([z.string(), z.number()]).nullish(),
    job_id: z.string().nullish(),
    created_at: z.string().nullish(),
    quiesced: z.boolean().nullish(),
  })
  .refine((p) => p.id !== undefined || p.restore_point_id !== undefined, 'a restore point needs an id')
  .transform(
    (p): RestorePoint => ({
      id: String(p.id ?? p.restore_point_id),
      run_id: p.run_id == null ? null : String(p.run_id),
      job_id: p.job_id ?? null,
      created_at: p.created_at ?? null,
      quiesced: p.quiesced === true,
    }),
  )
const PointsBody = z.union([
  z.array(PointBody),
  z.looseObject({ items: z.array(PointBody) }).transform((b) => b.items),
  z.looseObject({ data: z.array(PointBody) }).transform((b) => b.data),
])

/** The backup API client. Close it when done (it owns a connection pool). */
export class BackupClient {
  private readonly agent: Agent
  private readonly api: string
  private readonly auth: string
  private readonly timeoutMs: number

  /** Throws `E_MIG_BAD_REQUEST` for a base URL that is not http(s). */
  constructor(private readonly opts: BackupClientOptions) {
    let u: URL
    try {
      u = new URL(opts.baseUrl)
    } catch {
      throw new MigError('E_MIG_BAD_REQUEST', `backup API base URL ${JSON.stringify(opts.baseUrl)} is not a URL`)
    }
    if (u.protocol !== 'https:' && u.protocol !== 'http:') throw new MigError('E_MIG_BAD_REQUEST', `backup API base URL must be http(s), got ${u.protocol}`)
    this.api = `${u.origin}${u.pathname.replace(/\/+$/, '')}/api/v1`
    this.auth = 'Basic ' + Buffer.from(`${opts.username}:${opts.password}`).toString('base64')
    this.timeoutMs = opts.timeoutMs ?? 30_000
    const connect = tlsConnector({ ca_pem: opts.tls?.ca_pem, thumbprint: opts.tls?.fingerprint256, insecure: opts.tls?.insecure }, this.timeoutMs)
    this.agent = new Agent({ connect, headersTimeout: this.timeoutMs, bodyTimeout: this.timeoutMs })
  }

  private async call(method: 'GET' | 'POST', p: string, what: string): Promise<unknown> {
    let res
    try {
      res = await request(this.api + p, {
        method,
        dispatcher: this.agent,
        headers: { authorization: this.auth, accept: 'application/json' },
        signal: AbortSignal.timeout(this.timeoutMs),
      })
    } catch (e) {
      throw new MigError('E_MIG_SOURCE_UNREACHABLE', `backup API ${this.api}: ${what}: ${(e as Error).message}`, { cause: e })
    }
    const text = await res.body.text()
    if (res.statusCode === 401 || res.statusCode === 403)
      throw new MigError('E_MIG_AUTH_FAILED', `backup API ${this.api}: ${what}: credentials of ${this.opts.username} rejected (${res.statusCode})`)
    if (res.statusCode === 404) throw new MigError('E_MIG_NOT_FOUND', `backup API ${this.api}: ${what}: not found (404)`)
    if (res.statusCode < 200 || res.statusCode > 299)
      throw new MigError('E_MIG_SNAPSHOT_FAILED', `backup API ${this.api}: ${what}: HTTP ${res.statusCode}: ${text.slice(0, 200)}`)
    try {
      return text === '' ? {} : JSON.parse(text)
    } catch {
      throw new MigError('E_MIG_SNAPSHOT_FAILED', `backup API ${this.api}: ${what}: response is not JSON: ${text.slice(0, 120)}`)
    }
  }

  /**
   * Runs backup job `jobId` (a UUID); returns the run identifier. Throws `E_MIG_BAD_REQUEST`
   * (not a UUID), `E_MIG_AUTH_FAILED`, `E_MIG_NOT_FOUND` (unknown job), `E_MIG_SOURCE_UNREACHABLE`
   * (connection, TLS, timeout), `E_MIG_SNAPSHOT_FAILED` (the run failed or the body is malformed).
   */
  async runJob(jobId: string): Promise<string> {
    if (!UUID.test(jobId)) throw new MigError('E_MIG_BAD_REQUEST', `backup job id ${JSON.stringify(jobId)} is not a UUID`)
    const body = await this.call('POST', `/backup/jobs/${jobId}/run`, `run backup job ${jobId}`)
    const r = RunBody.safeParse(body)
    if (!r.success) throw new MigError('E_MIG_SNAPSHOT_FAILED', `backup API: run of job ${jobId} answered without a run identifier`)
    return r.data
  }

  /** Registered restore points. Same errors as {@link runJob}. */
  async listRestorePoints(): Promise<RestorePoint[]> {
    const r = PointsBody.safeParse(await this.call('GET', '/backup/restore-points', 'list restore points'))
    if (!r.success) throw new MigError('E_MIG_SNAPSHOT_FAILED', `backup API: malformed restore point list: ${r.error.issues[0]?.message ?? 'unexpected shape'}`)
    return r.data
  }

  /**
   * Polls the restore points until one of run `runId` is listed (every `pollMs`, default 2 s) and
   * returns it. `E_MIG_SNAPSHOT_FAILED` when none appears within `timeoutMs` (default 10 min), or
   * when `requireQuiesced` and the point is not quiesced.
   */
  async waitForRestorePoint(
    runId: string,
    opts: { timeoutMs?: number; pollMs?: number; requireQuiesced?: boolean; signal?: AbortSignal } = {},
  ): Promise<RestorePoint> {
    const deadline = Date.now() + (opts.timeoutMs ?? 600_000)
    for (;;) {
      if (opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', 'cancelled while waiting for the restore point')
      const point = (await this.listRestorePoints()).find((p) => p.run_id === runId)
      if (point) {
        if (opts.requireQuiesced && !point.quiesced)
          throw new MigError('E_MIG_SNAPSHOT_FAILED', `restore point ${point.id} of run ${runId} is not quiesced, and the plan requires it`)
        return point
      }
      if (Date.now() >= deadline)
        throw new MigError(
          'E_MIG_SNAPSHOT_FAILED',
          `backup run ${runId} registered no restore point within ${Math.round((opts.timeoutMs ?? 600_000) / 1000)} s`,
        )
      await sleep(Math.min(opts.pollMs ?? 2000, Math.max(0, deadline - Date.now())))
    }
  }

  /** Closes the connection pool. */
  close(): Promise<void> {
    return this.agent.close()
  }
}
