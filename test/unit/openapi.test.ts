/**
 * The OpenAPI 3.1 description (lib/openapi.ts, served by handlers/openapi/get.ts): every route
 * of the router is in it and every route in it is one of the router's; the document is valid
 * OpenAPI 3.1 (@seriousme/openapi-schema-validator, the official 3.1 JSON schema); its request
 * bodies are the handlers' own zod schemas.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { Validator } from '@seriousme/openapi-schema-validator'
import * as openapiGet from '../../handlers/openapi/get.ts'
import { openApiDocument, openApiPath, ROUTES } from '../../lib/openapi.ts'
import type { Ctx } from '../../runtime/context.ts'
import { HANDLERS } from '../../runtime/handlers.ts'
import { testCtx } from '../helpers/env.ts'

type Doc = {
  openapi: string
  servers: { url: string }[]
  paths: Record<string, Record<string, { requestBody?: { content: Record<string, { schema: Record<string, unknown> }> } }>>
}

let ctx: Ctx
let cleanup: () => Promise<void>
let served: Doc
beforeAll(async () => {
  const t = await testCtx({ MIGRATOR_BASE_PATH: '/api/v1/migrator' })
  ctx = t.ctx
  cleanup = t.cleanup
  const res = await openapiGet.handle(new Request('http://127.0.0.1/api/v1/migrator/openapi.json'), ctx)
  expect(res.status).toBe(200)
  served = (await res.json()) as Doc
})
afterAll(async () => {
  await cleanup()
})

/** `METHOD /template` of every operation of a document. */
function operations(doc: Doc): string[] {
  return Object.entries(doc.paths).flatMap(([p, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${p}`))
}

describe('GET /openapi.json', () => {
  test('is registered and served as OpenAPI 3.1 with the configured base path', () => {
    expect(HANDLERS.some((m) => m.method === 'GET' && m.path === '/openapi.json')).toBe(true)
    expect(served.openapi).toBe('3.1.0')
    expect(served.servers).toEqual([{ url: '/api/v1/migrator' }])
  })

  test('every route of the router is documented, and every documented route exists', () => {
    const routed = HANDLERS.map((m) => `${m.method} ${openApiPath(m.path)}`).sort()
    expect(operations(served).sort()).toEqual(routed)
    expect(ROUTES.map((r) => `${r.method} ${r.path}`).sort()).toEqual(HANDLERS.map((m) => `${m.method} ${m.path}`).sort())
  })

  test('is valid OpenAPI 3.1 for the validator, which refuses a broken document', async () => {
    const ok = await new Validator().validate(structuredClone(served) as unknown as Record<string, unknown>)
    expect(ok.errors ?? []).toEqual([])
    expect(ok.valid).toBe(true)
    const broken = structuredClone(openApiDocument('/x')) as { paths: Record<string, Record<string, { responses?: unknown }>> }
    delete broken.paths['/sources']?.get?.responses
    ;(broken.paths['/sources'] as Record<string, unknown>).get = { ...broken.paths['/sources']?.get, responses: 'none' }
    expect((await new Validator().validate(broken as unknown as Record<string, unknown>)).valid).toBe(false)
  })

  test("request bodies are the handlers' zod schemas (the plan's fields and rules)", () => {
    const plan = served.paths['/migrations']?.post?.requestBody?.content['application/json']?.schema as {
      properties: { plan: { properties: Record<string, unknown>; required: string[] } }
      additionalProperties: boolean
    }
    expect(plan.additionalProperties).toBe(false)
    expect(plan.properties.plan.required).toEqual(expect.arrayContaining(['source', 'source_ref', 'mode']))
    expect(Object.keys(plan.properties.plan.properties)).toEqual(expect.arrayContaining(['cutover', 'precopy_interval_seconds', 'networks', 'checks']))
    const checks = plan.properties.plan.properties.checks as { description: string; maxItems: number; items: { properties: Record<string, unknown> } }
    expect(checks.description).toContain('Services that answer')
    expect(checks.maxItems).toBe(32)
    expect(Object.keys(checks.items.properties)).toEqual(['name', 'tcp', 'http', 'on_failure'])
    const source = served.paths['/sources']?.post?.requestBody?.content['application/json']?.schema as { required: string[]; properties: object }
    expect(source.required).toEqual(expect.arrayContaining(['name', 'kind', 'endpoint', 'username']))
    // the password, or for libvirt_remote the private key and pinned host key (which one: by kind)
    expect(Object.keys(source.properties)).toEqual(expect.arrayContaining(['password', 'private_key', 'known_hosts', 'client_cert']))
  })
})
