/**
 * Builds the itty-router from the list of handler modules: each module exports `method`,
 * `path` (relative to the base path) and `handle(request, ctx, params)`.
 */
import { Router } from 'itty-router'
import { MigError } from '../lib/errors.ts'
import type { Ctx } from './context.ts'

/** A handler module (one file per endpoint under `handlers/`). */
export interface HandlerModule {
  method: 'GET' | 'POST' | 'DELETE' | 'PUT' | 'PATCH'
  path: string
  handle(request: Request, ctx: Ctx, params: Record<string, string>): Promise<Response>
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
    router[method](m.path, (req, ctx: Ctx) => m.handle(req as Request, ctx, decodeParams(req.params)))
  }
  router.all('*', (req) => {
    throw new MigError('E_MIG_NOT_FOUND', `no route for ${req.method} ${new URL(req.url).pathname}`)
  })
  return router
}
