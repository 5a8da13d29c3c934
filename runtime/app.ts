/**
 * `createApp(config)`: the migrator as one `fetch(request) => Response` function, so the host
 * daemon can mount it in-process or proxy to it (DESIGN.md section 1). `serve-bun.ts` and
 * `serve-node.ts` only wrap it in a listening server.
 */
import { loadOrCreateToken } from '../lib/auth/api-token.ts'
import { MigError } from '../lib/errors.ts'
import { redactHostPaths } from '../lib/hostpath.ts'
import { createAuditStep, type ClientInfo } from './audit.ts'
import { InspectPool } from './inspect-pool.ts'
import { sweepUploads } from '../lib/uploads/sweep.ts'
import { createAuthStep } from './auth.ts'
import type { Config } from './config.ts'
import { createContext, type Ctx } from './context.ts'
import { HANDLERS } from './handlers.ts'
import type { Logger } from './logger.ts'
import { createRequestGuard } from './request-guard.ts'
import { buildRouter } from './router.ts'
import { withSecurityHeaders } from './security-headers.ts'
import { Supervisor, type SupervisorOptions } from './supervisor.ts'
import { TestBootService } from '../lib/jobs/test-boot.ts'

/** The running migrator: its fetch function, its context, and a clean shutdown. */
export interface App {
  /**
   * Answers `request`. `client.via` says how it arrived (runtime/auth.ts): `socket` and `tcp` from
   * the listeners of serve-bun.ts / serve-node.ts, omitted for a host daemon calling in-process;
   * `client.address` is the caller's address for the audit log.
   */
  fetch(request: Request, client?: ClientInfo): Promise<Response>
  ctx: Ctx
  /** Closes SSE streams, stops the sweeper and closes the store. Idempotent. */
  close(): Promise<void>
}

function errorResponse(e: MigError, extraHeaders: Record<string, string> = {}, redact: (s: string) => string = (s) => s): Response {
  return new Response(redact(JSON.stringify(e.toBody())), { status: e.status, headers: { 'content-type': 'application/json; charset=utf-8', ...extraHeaders } })
}

/**
 * Maps anything thrown by a handler to the error body of DESIGN.md section 3: a MigError keeps
 * its code and status; anything else is logged with its stack and answered as `E_MIG_INTERNAL`
 * without details (no stack or secret reaches the client).
 */
export function toErrorResponse(e: unknown, logger: Logger, req: { method: string; path: string }, redact?: (s: string) => string): Response {
  if (e instanceof MigError) {
    if (e.status >= 500) logger.error({ ...req, code: e.code, err: e }, e.message)
    const retry = e.details?.retry_after_seconds
    return errorResponse(e, typeof retry === 'number' ? { 'retry-after': String(retry) } : {}, redact)
  }
  logger.error({ ...req, err: e }, 'unexpected error')
  return errorResponse(new MigError('E_MIG_INTERNAL', 'internal error; see the server log'))
}

/** Options of {@link createApp} besides the configuration. */
export interface AppOptions {
  logger?: Logger
  now?: () => Date
  /** false: no job supervisor (tests that only exercise the API). */
  runJobs?: boolean
  supervisor?: Partial<SupervisorOptions>
  /**
   * A host daemon mounting the app in-process: the host names (`migrator.example`, `[fd00::5]`)
   * and origins (`https://migrator.example:8443`) its own server is reached by, added to
   * `config.allowedHosts` / `config.allowedOrigins` (runtime/request-guard.ts).
   */
  allowedHosts?: readonly string[]
  allowedOrigins?: readonly string[]
}

/**
 * Builds the app: prepares the data directory and store (see `createContext`), starts the job
 * supervisor (unless `runJobs: false`), removes uploads left half-received by a previous run,
 * starts the upload sweeper.
 *
 * Every request goes through, in this order: the request guard (Host 421, cross-site 403), the
 * authentication step (401; runtime/auth.ts), the router (content type 415 on state-changing routes, then the handler);
 * every response gets the headers of runtime/security-headers.ts; then the audit step
 * (runtime/audit.ts) writes the entry of a state-changing request and adds `X-Request-Id`.
 * With a TCP listener configured, the API token file is created at the first start.
 * Throws `KeyringError`, `TokenFileError` or `E_MIG_PERSIST_FAILED` when it cannot start.
 */
export async function createApp(config: Config, opts: AppOptions = {}): Promise<App> {
  const ctx = await createContext(config, opts)
  const supervisor = opts.runJobs === false ? null : new Supervisor(ctx, { ...config.supervisor, ...opts.supervisor })
  if (supervisor) {
    ctx.runner = supervisor
    supervisor.start()
    ctx.testBoots = new TestBootService(ctx)
    ctx.testBoots.start()
  }
  const inspectPool = new InspectPool({ ...config.inspect, retryAfterSeconds: 2 })
  ctx.inspect = (absPath, ictx, kind) => inspectPool.run(absPath, ictx, kind)
  const router = buildRouter(config.basePath, HANDLERS)
  const audit = createAuditStep(ctx, HANDLERS)
  const guard = createRequestGuard({
    listenHost: config.listen?.host ?? 'localhost',
    allowedHosts: [...config.allowedHosts, ...(opts.allowedHosts ?? [])],
    allowedOrigins: [...config.allowedOrigins, ...(opts.allowedOrigins ?? [])],
  })
  const { logger } = ctx
  if (config.listen !== null) loadOrCreateToken(ctx.paths.tokenFile)
  const auth = createAuthStep(config, ctx.paths.tokenFile, ctx.now)
  if ((config.listen?.host === '0.0.0.0' || config.listen?.host === '::') && config.allowedHosts.length === 0 && !opts.allowedHosts?.length) {
    logger.warn(
      { listen: config.listen?.host },
      'listening on every address, but only loopback names are answered (421 otherwise): set MIGRATOR_ALLOWED_HOSTS to the names clients use (docs/security.md)',
    )
  }

  const sweep = async (staleSeconds?: number) => {
    try {
      const removed = await sweepUploads(ctx.store, ctx.paths.uploads, ctx.now(), staleSeconds)
      if (removed.length) logger.info({ removed }, 'uploads expired')
    } catch (e) {
      logger.warn({ err: e }, 'upload sweep failed')
    }
  }
  await sweep(0)
  const sweeper = setInterval(() => void sweep(), config.sweepIntervalSeconds * 1000)
  sweeper.unref?.()

  let closed = false
  return {
    ctx,
    async fetch(request: Request, client: ClientInfo = {}): Promise<Response> {
      const started = performance.now()
      const requestId = audit.requestIdOf(request)
      const path = new URL(request.url).pathname
      const req = { method: request.method, path }
      let response: Response
      let refused: Response | null = null
      try {
        guard(request)
      } catch (e) {
        // a refusal is worth a line: a browser was pointed at the migrator from elsewhere
        logger.warn(
          { ...req, host: new URL(request.url).host, origin: request.headers.get('origin'), reason: e instanceof Error ? e.message : String(e) },
          'request refused',
        )
        refused = toErrorResponse(e, logger, req)
      }
      if (refused === null) refused = auth.check(request, client.via)
      if (refused !== null) {
        response = refused
      } else {
        try {
          response =
            ((await router.fetch(request, ctx)) as Response | undefined) ??
            errorResponse(new MigError('E_MIG_NOT_FOUND', `no route for ${request.method} ${path}`))
        } catch (e) {
          response = toErrorResponse(e, logger, req, (s) => redactHostPaths(s, config.importRoot, config.dataDir))
        }
      }
      response = withSecurityHeaders(response)
      response = await audit.record(request, response, requestId, client)
      logger.info({ ...req, status: response.status, ms: Math.round(performance.now() - started), request_id: requestId }, 'request')
      return response
    },
    async close() {
      if (closed) return
      closed = true
      clearInterval(sweeper)
      audit.close()
      await ctx.testBoots?.stop()
      await supervisor?.stop()
      await inspectPool.close()
      ctx.hub.closeAll()
      await ctx.store.close()
    },
  }
}
