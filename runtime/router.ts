/**
 * Builds the itty-router from the list of handler modules: each module exports `method`,
 * `path` (relative to the base path), `handle(request, ctx, params)` and, for a body that is
 * not JSON, `accepts`. Every state-changing route gets the content-type rule of
 * {@link checkContentType} before its handler runs.
 */
import { Router } from 'itty-router'
import { MigError } from '../lib/errors.ts'
import type { Ctx } from './context.ts'

/** A handler module (one file per endpoint under `handlers/`). */
export interface HandlerModule {
  method: 'GET' | 'POST' | 'DELETE' | 'PUT' | 'PATCH'
  path: string
  handle(request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response>
  /** The request body's media type on a state-changing route (default `application/json`). */
  accepts?: 'application/json' | 'multipart/form-data'
}

/** Methods that change state: their requests must carry the route's content type (docs/security.md). */
export const STATE_CHANGING = new Set(['POST', 'PUT', 'PATCH', 'DELETE'])

/**
 * The content-type rule of state-changing requests: a body must be declared with the route's
 * media type (`application/json`, or `multipart/form-data` for uploads); a request without a
 * `Content-Type` must have no body. A browser sends `application/json` cross-site only after a
 * CORS preflight the migrator never grants, so a page elsewhere cannot post a body it would
 * parse; multipart is a "simple" type, and for the upload the origin checks of
 * runtime/request-guard.ts are what protects.
 * Throws `E_MIG_BAD_REQUEST` with status 415.
 */
export function checkContentType(request: Request, accepts: NonNullable<HandlerModule['accepts']>): void {
  const declared = request.headers.get('content-type')
  const essence = declared === null ? null : (declared.split(';')[0] ?? '').trim().toLowerCase()
  if (essence === accepts) return
  const length = request.headers.get('content-length')
  const hasBody = request.headers.has('transfer-encoding') || (length !== null && length.trim() !== '0')
  if (essence === null && !hasBody && accepts === 'application/json') return
  const what = essence === null ? 'a body without Content-Type' : `Content-Type ${JSON.stringify(declared)}`
  throw new MigError(
    'E_MIG_BAD_REQUEST',
    `${request.method} ${new URL(request.url).pathname} refuses ${what}: send the body as ${accepts}${accepts === 'application/json' ? " with the header 'Content-Type: application/json'" : ''}`,
    { status: 415 },
  )
}

function decodeParams(raw: Record<string, string> | undefined): Record<string, string> {
  const out: Record<string, string> = Object.create(null)
  for (const [k, v] of Object.entries(raw ?? {})) {
    try {
      out[k] = decodeURIComponent(v)
    } catch {
      throw new MigError('E_MIG_BAD_REQUEST', `path parameter ${k} is not valid percent-encoding`)
    }
  }
  return out
}

/** A router answering `modules` under `basePath`; unmatched requests get `E_MIG_NOT_FOUND`. */
export function buildRouter(basePath: string, modules: readonly HandlerModule[]) {
  const router = Router<Request & { params?: Record<string, string> }, [Ctx]>({ base: basePath })
  for (const m of modules) {
    const method = m.method.toLowerCase() as 'get' | 'post' | 'delete' | 'put' | 'patch'
    const accepts = STATE_CHANGING.has(m.method) ? (m.accepts ?? 'application/json') : null
    router[method](m.path, (req, ctx: Ctx) => {
      if (accepts !== null) checkContentType(req as Request, accepts)
      return m.handle(req as Request, ctx, decodeParams(req.params))
    })
  }
  router.all('*', (req) => {
    throw new MigError('E_MIG_NOT_FOUND', `no route for ${req.method} ${new URL(req.url).pathname}`)
  })
  return router
}
