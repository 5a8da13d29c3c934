/**
 * Small HTTP helpers shared by handlers: JSON responses and bounded JSON request bodies.
 */
import { MigError } from '../lib/errors.ts'

/** A JSON response with `status` (default 200). */
export function json(data: unknown, status = 200, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(data), { status, headers: { 'content-type': 'application/json; charset=utf-8', ...headers } })
}

/** A `{"items": [...]}` list response (DESIGN.md section 3). */
export function list(items: unknown[], extra: Record<string, unknown> = {}): Response {
  return json({ items, ...extra })
}

/** 204 No Content. */
export function noContent(): Response {
  return new Response(null, { status: 204 })
}

/** Largest JSON request body accepted (bytes). */
export const MAX_JSON_BYTES = 1024 * 1024

/**
 * Reads a JSON request body of at most {@link MAX_JSON_BYTES} bytes, counting while streaming.
 * `E_MIG_BAD_REQUEST` for a missing, oversized or unparsable body, or one that is not an object.
 * `optional`: a missing or empty body (whitespace only) reads as `{}`.
 */
export async function readJson(request: Request, opts: { optional?: boolean } = {}): Promise<Record<string, unknown>> {
  if (!request.body) {
    if (opts.optional) return {}
    throw new MigError('E_MIG_BAD_REQUEST', 'request body required (JSON object)')
  }
  const reader = request.body.getReader()
  const parts: Uint8Array[] = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > MAX_JSON_BYTES) {
      await reader.cancel().catch(() => {})
      throw new MigError('E_MIG_BAD_REQUEST', `JSON body larger than ${MAX_JSON_BYTES} bytes`)
    }
    parts.push(value)
  }
  let parsed: unknown
  const text = Buffer.concat(parts).toString('utf8')
  if (opts.optional && text.trim() === '') return {}
  try {
    parsed = JSON.parse(text)
  } catch (e) {
    throw new MigError('E_MIG_BAD_REQUEST', `request body is not valid JSON: ${(e as Error).message}`)
  }
  const dup = duplicateJsonKey(text)
  if (dup !== null) throw new MigError('E_MIG_BAD_REQUEST', `request body has the key ${JSON.stringify(dup.slice(0, 64))} twice in one object`)
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new MigError('E_MIG_BAD_REQUEST', 'request body must be a JSON object')
  return parsed as Record<string, unknown>
}

/**
 * The first key that appears twice in one object of the JSON text `text` (already known to be
 * valid JSON), or null. JSON.parse keeps the last one silently (RFC 8259 4: names "SHOULD be
 * unique"); a request that says two things is refused instead.
 */
export function duplicateJsonKey(text: string): string | null {
  const stack: Array<Set<string> | null> = [] // a Set per open object, null per open array
  let expectKey = false
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!
    if (c === '{') {
      stack.push(new Set())
      expectKey = true
    } else if (c === '[') {
      stack.push(null)
      expectKey = false
    } else if (c === '}' || c === ']') {
      stack.pop()
      expectKey = false
    } else if (c === ',') expectKey = stack[stack.length - 1] instanceof Set
    else if (c === '"') {
      let j = i + 1
      while (text[j] !== '"') j += text[j] === '\\' ? 2 : 1
      if (expectKey) {
        const key = JSON.parse(text.slice(i, j + 1)) as string
        const keys = stack[stack.length - 1]!
        if (keys.has(key)) return key
        keys.add(key)
        expectKey = false
      }
      i = j
    }
  }
  return null
}

/** The request's query parameters (last value wins). */
export function query(request: Request): URLSearchParams {
  return new URL(request.url).searchParams
}
