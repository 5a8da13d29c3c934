// GET /openapi.json: the OpenAPI 3.1 description of this API (lib/openapi.ts), built from the
// zod schemas the handlers validate with.
import { openApiDocument } from '../../lib/openapi.ts'
import type { Ctx } from '../../runtime/context.ts'
import { json } from '../../runtime/http.ts'

export const method = 'GET'
export const path = '/openapi.json'

/** 200 with the OpenAPI 3.1 document, its server URL the configured base path. Never fails. */
export async function handle(_request: Request, ctx: Ctx): Promise<Response> {
  return json(openApiDocument(ctx.config.basePath))
}
