/**
 * The audit step of every request (docs/operations.md "Audit log"): each request gets a request
 * id (the client's `X-Request-Id` when it is a plain token, else a new UUID), answered in the
 * `X-Request-Id` header; each state-changing request (POST, PUT, PATCH, DELETE), refused or not,
 * is written to the store's audit log with its time, client address, user agent, request id,
 * method, route, kind, resource id and outcome (status, `E_MIG_*` code). Request and response
 * bodies are never written, nor any header but the user agent: no password, key or token reaches
 * the log. Entries older than `MIGRATOR_AUDIT_RETENTION_DAYS` are pruned at start and hourly.
 */
import { randomUUID } from 'node:crypto'
import type { Via } from './auth.ts'
import type { Ctx } from './context.ts'
import { STATE_CHANGING, type HandlerModule } from './router.ts'

/**
 * What the listening server knows of the client: the listener it came through (runtime/auth.ts;
 * absent for a host daemon calling in-process) and its address (null for a unix socket or when
 * unknown).
 */
export interface ClientInfo {
  via?: Via
  address?: string | null
}

/** The audit step of `createApp`. */
export interface AuditStep {
  /** The request id of `request`: its `X-Request-Id` when a plain token of at most 128 characters, else a new UUID. */
  requestIdOf(request: Request): string
  /**
   * Writes the entry of `request` answered with `response` when the method changes state (a
   * store failure is logged, never answered), and returns `response` with `X-Request-Id`.
   */
  record(request: Request, response: Response, requestId: string, client: ClientInfo): Promise<Response>
  /** Stops the pruning timer. */
  close(): void
}

/** A route of the audit: the router's method and path template, matched by `pattern`, and its kind. */
interface AuditRoute {
  method: string
  template: string
  pattern: RegExp
  kind: string
}

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/
const USER_AGENT_MAX = 512
const PATH_MAX = 256
const HOUR_MS = 3600_000

/**
 * The kind of a route, `<resource>.<action>`: the resource is the first path segment in the
 * singular with `_` (`remote-credentials` -> `remote_credential`); the action is `create` (POST
 * on the collection), `delete`, or the last segment (`cancel`, `cutover`, `test_boot`, `inspect`).
 */
export function auditKindOf(method: string, template: string): string {
  const parts = template.split('/').filter(Boolean)
  const resource = (parts[0] ?? 'unknown').replace(/-/g, '_').replace(/s$/, '')
  const last = parts[parts.length - 1] ?? ''
  const action = method === 'DELETE' ? 'delete' : parts.length === 1 ? 'create' : last.startsWith(':') ? 'update' : last.replace(/-/g, '_')
  return `${resource}.${action}`
}

function routesOf(modules: readonly HandlerModule[]): AuditRoute[] {
  return modules
    .filter((m) => STATE_CHANGING.has(m.method))
    .map((m) => ({
      method: m.method,
      template: m.path,
      pattern: new RegExp(`^${m.path.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/:[A-Za-z_]+/g, '([^/]+)')}/?$`),
      kind: auditKindOf(m.method, m.path),
    }))
}

/** The `id` of a JSON body (a created resource) or its error's `E_MIG_*` code; nulls when not JSON. */
async function answerFacts(response: Response): Promise<{ id: string | null; code: string | null }> {
  if (!(response.headers.get('content-type') ?? '').includes('application/json')) return { id: null, code: null }
  try {
    const body = (await response.clone().json()) as { id?: unknown; error?: { code?: unknown } }
    const code = typeof body?.error?.code === 'string' && body.error.code.startsWith('E_MIG_') ? body.error.code : null
    return { id: typeof body?.id === 'string' ? body.id.slice(0, 128) : null, code }
  } catch {
    return { id: null, code: null }
  }
}

/** Builds the audit step over the routes of `modules` mounted at `ctx.config.basePath`. */
export function createAuditStep(ctx: Ctx, modules: readonly HandlerModule[]): AuditStep {
  const routes = routesOf(modules)
  const base = ctx.config.basePath.replace(/\/+$/, '')
  const prune = async () => {
    try {
      const before = new Date(ctx.now().getTime() - ctx.config.auditRetentionDays * 86_400_000).toISOString()
      const removed = await ctx.store.audit.prune(before)
      if (removed) ctx.logger.info({ removed, before }, 'audit log pruned')
    } catch (e) {
      ctx.logger.warn({ err: e }, 'audit log prune failed')
    }
  }
  void prune()
  const timer = setInterval(() => void prune(), HOUR_MS)
  timer.unref?.()
  return {
    requestIdOf(request) {
      const given = request.headers.get('x-request-id')
      return given !== null && REQUEST_ID.test(given) ? given : randomUUID()
    },
    async record(request, response, requestId, client) {
      let out = response
      try {
        out.headers.set('x-request-id', requestId)
      } catch {
        out = new Response(out.body, out)
        out.headers.set('x-request-id', requestId)
      }
      if (!STATE_CHANGING.has(request.method)) return out
      const fullPath = new URL(request.url).pathname
      const rel = fullPath.startsWith(`${base}/`) ? fullPath.slice(base.length) : null
      let route: AuditRoute | undefined
      let param: string | null = null
      if (rel !== null) {
        for (const r of routes) {
          const m = r.method === request.method ? r.pattern.exec(rel) : null
          if (m) {
            route = r
            param = m[1] === undefined ? null : safeDecode(m[1]).slice(0, 128)
            break
          }
        }
      }
      const facts = await answerFacts(out)
      try {
        await ctx.store.audit.append({
          at: ctx.now().toISOString(),
          client_address: client.address ?? null,
          user_agent: request.headers.get('user-agent')?.slice(0, USER_AGENT_MAX) ?? null,
          request_id: requestId,
          method: request.method,
          route: route?.template ?? fullPath.slice(0, PATH_MAX),
          kind: route?.kind ?? 'unknown.request',
          resource_id: param ?? (out.status < 300 ? facts.id : null),
          status: out.status,
          error_code: out.status >= 400 ? facts.code : null,
        })
      } catch (e) {
        ctx.logger.error({ err: e, request_id: requestId, method: request.method, path: fullPath }, 'audit entry not written')
      }
      return out
    },
    close() {
      clearInterval(timer)
    },
  }
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s)
  } catch {
    return s
  }
}
