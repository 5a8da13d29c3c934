/**
 * The OpenAPI 3.1 description of the migrator's HTTP API, served at `{base}/openapi.json`
 * (handlers/openapi/get.ts). Request bodies are the zod schemas the handlers validate with,
 * converted by zod's own `z.toJSONSchema` (JSON Schema 2020-12, the dialect of OpenAPI 3.1), so
 * the description cannot drift from what the server accepts. Responses are described in words
 * (their shapes: docs/api.md); every error answers the error body of DESIGN.md section 3.
 *
 * {@link ROUTES} lists every route; test/unit/openapi.test.ts checks it against the router's
 * handler list both ways and validates the document against the OpenAPI 3.1 schema.
 */
import { z } from 'zod'
import { ERROR_CODES } from './errors.ts'
import { HostFileInspectBody } from './hostfiles.ts'
import { BulkPlanBody } from './jobs/bulk.ts'
import { SubmitPlanBody } from './plan.ts'
import { RemoteCredentialInput } from './remote/credentials.ts'
import { RemoteInspectBody } from './remote/ref.ts'
import { SourceInput } from './sources.ts'

/** One query parameter of a route. */
interface QueryParam {
  name: string
  description: string
  schema: Record<string, unknown>
}

/** One route: method and path as the router spells them (`:id`, `*`), what it does, its input and answers. */
export interface RouteDoc {
  method: 'GET' | 'POST' | 'DELETE'
  path: string
  summary: string
  /** JSON request body, validated with this schema. */
  body?: z.ZodType
  /** A body that is not JSON: its media type and a description. */
  rawBody?: { mediaType: string; schema: Record<string, unknown>; description: string }
  query?: QueryParam[]
  /** Success status and what it answers. */
  ok: [number, string]
  /** Media type of the success answer (default `application/json`; none for 204). */
  okMediaType?: string
  /** Error statuses this route answers besides 500 (each with the error body). */
  errors: number[]
}

/** Every route of the API, relative to the base path. */
export const ROUTES: readonly RouteDoc[] = [
  { method: 'GET', path: '/sources', summary: 'List registered live sources', ok: [200, '`{items: [source]}`'], errors: [503] },
  {
    method: 'POST',
    path: '/sources',
    summary: 'Register a live source (the password is sealed and never returned)',
    body: SourceInput,
    ok: [201, 'the source'],
    errors: [400, 409],
  },
  { method: 'GET', path: '/sources/:id', summary: 'Get a source', ok: [200, 'the source'], errors: [404] },
  { method: 'DELETE', path: '/sources/:id', summary: 'Remove a source', ok: [204, 'removed'], errors: [404, 409] },
  { method: 'POST', path: '/sources/:id/test', summary: 'Log in to the source', ok: [200, '`{ok, product, version}`'], errors: [404, 502] },
  { method: 'GET', path: '/sources/:id/vms', summary: "List the source's VMs", ok: [200, '`{items: [vm]}`'], errors: [404, 502] },
  { method: 'GET', path: '/sources/:id/vms/:vm_id', summary: "Inspect one of the source's VMs", ok: [200, 'the VM manifest'], errors: [404, 502] },
  { method: 'GET', path: '/migrations', summary: 'List migration jobs, newest first', ok: [200, '`{items: [job]}`'], errors: [503] },
  {
    method: 'POST',
    path: '/migrations',
    summary: 'Submit a migration plan',
    body: SubmitPlanBody,
    ok: [201, 'the job, `Queued`'],
    errors: [400, 403, 404],
  },
  {
    method: 'GET',
    path: '/migrations/stream',
    summary: 'Server-sent events of every job (`migration`, `progress`), replayed from `Last-Event-ID`',
    query: [
      { name: 'id', description: 'only this job', schema: { type: 'string' } },
      { name: 'last_event_id', description: 'replay the events after this id (as the `Last-Event-ID` header)', schema: { type: 'string' } },
    ],
    ok: [200, 'an event stream'],
    okMediaType: 'text/event-stream',
    errors: [400, 404],
  },
  { method: 'GET', path: '/migrations/:id', summary: 'Get a job', ok: [200, 'the job'], errors: [404] },
  { method: 'POST', path: '/migrations/:id/cancel', summary: 'Cancel a job', ok: [202, 'the job'], errors: [404, 409] },
  {
    method: 'GET',
    path: '/migrations/:id/serial-log',
    summary: "The last lines of the job's domain serial log",
    query: [{ name: 'lines', description: 'how many lines (default 50)', schema: { type: 'integer', minimum: 1, maximum: 200 } }],
    ok: [200, '`{id, domain, lines}`'],
    errors: [400, 404],
  },
  { method: 'POST', path: '/migrations/:id/cutover', summary: 'Cut a warm job waiting in `DeltaSyncing` over now', ok: [202, 'the job'], errors: [404, 409] },
  {
    method: 'POST',
    path: '/migrations/:id/test-boot',
    summary: 'Boot a disposable clone of the destination before the cutover (docs/test-boot.md)',
    ok: [202, 'the job, its `test_boot` requested'],
    errors: [404, 409],
  },
  { method: 'POST', path: '/plans', summary: 'Submit a bulk plan of many VMs', body: BulkPlanBody, ok: [201, 'the bulk plan'], errors: [400, 403, 404] },
  { method: 'GET', path: '/plans', summary: 'List bulk plans, newest first', ok: [200, '`{items: [bulk plan]}`'], errors: [503] },
  { method: 'GET', path: '/plans/:id', summary: 'Get a bulk plan', ok: [200, 'the bulk plan'], errors: [404] },
  { method: 'POST', path: '/plans/:id/cutover', summary: "The shared cutover of a bulk plan's warm VMs", ok: [202, 'the bulk plan'], errors: [404, 409] },
  { method: 'GET', path: '/uploads', summary: 'List uploads', ok: [200, '`{items: [upload]}`'], errors: [503] },
  {
    method: 'POST',
    path: '/uploads',
    summary: 'Upload an export (multipart field `file`, optional `sha256`)',
    rawBody: {
      mediaType: 'multipart/form-data',
      schema: {
        type: 'object',
        required: ['file'],
        properties: { file: { type: 'string', contentMediaType: 'application/octet-stream' }, sha256: { type: 'string', pattern: '^[0-9a-fA-F]{64}$' } },
      },
      description: 'the file, and optionally its SHA-256 (also accepted as the `sha256` query parameter)',
    },
    query: [{ name: 'sha256', description: "the file's expected SHA-256", schema: { type: 'string' } }],
    ok: [201, 'the upload'],
    errors: [400, 413, 422],
  },
  { method: 'GET', path: '/uploads/:id', summary: 'Get an upload', ok: [200, 'the upload'], errors: [404] },
  { method: 'DELETE', path: '/uploads/:id', summary: 'Remove an upload', ok: [204, 'removed'], errors: [404, 409] },
  { method: 'POST', path: '/uploads/:id/inspect', summary: 'Inspect an upload', ok: [200, '`{detected_kind, manifest}`'], errors: [404, 415, 422, 503] },
  {
    method: 'GET',
    path: '/metrics',
    summary: 'Metrics in the Prometheus text exposition format 0.0.4 (docs/operations.md)',
    ok: [200, 'the metrics, `text/plain; version=0.0.4`'],
    okMediaType: 'text/plain',
    errors: [503],
  },
  {
    method: 'GET',
    path: '/audit',
    summary: 'The audit log of state-changing requests, newest first (docs/operations.md)',
    query: [
      { name: 'since', description: 'entries at or after this RFC 3339 time', schema: { type: 'string', format: 'date-time' } },
      { name: 'until', description: 'entries before this RFC 3339 time', schema: { type: 'string', format: 'date-time' } },
      { name: 'kind', description: 'a resource (`migration`) or a kind (`migration.cancel`)', schema: { type: 'string' } },
      { name: 'limit', description: 'entries per page (default 100, at most 1000)', schema: { type: 'integer', minimum: 1, maximum: 1000 } },
      { name: 'cursor', description: "the previous page's `next_cursor`", schema: { type: 'integer', minimum: 1 } },
    ],
    ok: [200, '`{items: [{seq, at, client_address, user_agent, request_id, method, route, kind, resource_id, status, error_code}], next_cursor}`'],
    errors: [400, 503],
  },
  { method: 'GET', path: '/doctor', summary: "The host's pre-flight checks", ok: [200, '`{status, checks: [{id, status, found, fix}]}`'], errors: [] },
  {
    method: 'GET',
    path: '/host-files',
    summary: 'List a directory of the import root',
    query: [{ name: 'path', description: 'directory relative to the import root (default: the root)', schema: { type: 'string' } }],
    ok: [200, '`{path, items, truncated}`'],
    errors: [400, 403, 404],
  },
  {
    method: 'POST',
    path: '/host-files/inspect',
    summary: 'Inspect a file or folder of the import root',
    body: HostFileInspectBody,
    ok: [200, '`{detected_kind, manifest}`'],
    errors: [400, 403, 404, 415, 422, 503],
  },
  {
    method: 'POST',
    path: '/remote-files/inspect',
    summary: 'Inspect a remote input (http, https, s3) with ranged reads, without copying it',
    body: RemoteInspectBody,
    ok: [200, '`{detected_kind, manifest}`'],
    errors: [400, 404, 415, 422, 502],
  },
  {
    method: 'GET',
    path: '/remote-credentials',
    summary: 'List the credentials of remote inputs (never their secrets)',
    ok: [200, '`{items: [{id, name, kind, username, created_at, updated_at}]}`'],
    errors: [503],
  },
  {
    method: 'POST',
    path: '/remote-credentials',
    summary: 'Register a credential of remote inputs (HTTP basic, bearer, S3 keys); sealed, never returned',
    body: RemoteCredentialInput,
    ok: [201, '`{id, name, kind, username, created_at, updated_at}`'],
    errors: [400, 409, 415, 503],
  },
  {
    method: 'DELETE',
    path: '/remote-credentials/:id',
    summary: 'Remove a credential of remote inputs',
    ok: [204, 'removed'],
    errors: [404, 503],
  },
  {
    method: 'GET',
    path: '/openapi.json',
    summary: 'This description',
    ok: [200, 'the OpenAPI 3.1 document'],
    errors: [],
  },
  {
    method: 'GET',
    path: '/ui/*',
    summary: 'The web console (`/ui` redirects to `/ui/`)',
    ok: [200, 'a file of the console'],
    okMediaType: 'text/html',
    errors: [404, 503],
  },
]

/** A router path (`/sources/:id`, `/ui/*`) as an OpenAPI path template (`/sources/{id}`, `/ui/{path}`). */
export function openApiPath(routerPath: string): string {
  return routerPath.replace(/:([A-Za-z_]+)/g, '{$1}').replace(/\/\*$/, '/{path}')
}

const HTTP_REASONS: Record<number, string> = {
  400: 'bad request or invalid plan',
  403: 'path outside the import root',
  404: 'not found',
  409: 'conflict with the current state',
  413: 'over the upload cap',
  415: 'unsupported format',
  422: 'malformed archive or checksum mismatch',
  500: 'internal or job error',
  502: 'the source is unreachable or refused the credentials',
  503: 'store unavailable, or inspects busy (`Retry-After`)',
}

/** The error body every error answers (DESIGN.md section 3). */
const ERROR_BODY = {
  type: 'object',
  required: ['error'],
  properties: {
    error: {
      type: 'object',
      required: ['code', 'message'],
      properties: { code: { type: 'string', enum: [...ERROR_CODES] }, message: { type: 'string' }, details: { type: 'object' } },
    },
  },
}

/** A zod schema as the JSON Schema of what a client sends (`io: 'input'`), without the `$schema` key. */
function requestSchema(schema: z.ZodType): Record<string, unknown> {
  const { $schema: _dialect, ...rest } = z.toJSONSchema(schema, { target: 'draft-2020-12', io: 'input', unrepresentable: 'any' }) as Record<string, unknown>
  return rest
}

/** The version of the API described: the specification's (docs/spec/migrator-spec-v0.1.md). */
export const API_VERSION = '0.1'

/** The OpenAPI 3.1 document of the API mounted at `basePath` (e.g. `/api/v1/migrator`). */
export function openApiDocument(basePath: string): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {}
  for (const r of ROUTES) {
    const p = openApiPath(r.path)
    const params = [
      ...[...p.matchAll(/\{([A-Za-z_]+)\}/g)].map((m) => ({ name: m[1], in: 'path', required: true, schema: { type: 'string' } })),
      ...(r.query ?? []).map((q) => ({ name: q.name, in: 'query', required: false, description: q.description, schema: q.schema })),
    ]
    const [okStatus, okDescription] = r.ok
    const responses: Record<string, unknown> = {
      [okStatus]: okStatus === 204 ? { description: okDescription } : { description: okDescription, content: { [r.okMediaType ?? 'application/json']: {} } },
    }
    for (const status of [...r.errors, 500]) responses[status] = { $ref: `#/components/responses/E${status}` }
    const operation: Record<string, unknown> = {
      operationId: `${r.method.toLowerCase()}${p.replace(/[{}]/g, '').replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ?? '').toUpperCase())}`,
      summary: r.summary,
      ...(params.length ? { parameters: params } : {}),
      responses,
    }
    if (r.body) operation.requestBody = { required: true, content: { 'application/json': { schema: requestSchema(r.body) } } }
    if (r.rawBody)
      operation.requestBody = { required: true, description: r.rawBody.description, content: { [r.rawBody.mediaType]: { schema: r.rawBody.schema } } }
    paths[p] ??= {}
    paths[p][r.method.toLowerCase()] = operation
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'VM migrator',
      version: API_VERSION,
      description: 'Brings VMs from other hypervisors onto a KVM host with ZFS storage. Reference: docs/api.md; specification: docs/spec/.',
    },
    servers: [{ url: basePath }],
    paths,
    components: {
      schemas: { Error: ERROR_BODY },
      responses: Object.fromEntries(
        Object.entries(HTTP_REASONS).map(([status, description]) => [
          `E${status}`,
          { description, content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } },
        ]),
      ),
      securitySchemes: {
        bearer: {
          type: 'http',
          scheme: 'bearer',
          description:
            'the API token of <data dir>/api-token, on the TCP listener (MIGRATOR_LISTEN); the unix socket needs none (docs/security.md "Local users")',
        },
        basic: { type: 'http', scheme: 'basic', description: 'MIGRATOR_BASIC_AUTH, when the server is not behind the host daemon' },
      },
    },
  }
}
