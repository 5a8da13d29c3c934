/**
 * The browser-facing response headers of the migrator, written once here (docs/security.md):
 * the console's Content-Security-Policy, the one of every other response, and the headers every
 * response carries. `createApp` adds them to each response that does not set its own; the
 * console's static handler sets {@link CONSOLE_CSP}.
 */

/**
 * CSP of the web console (`{base}/ui/`): its scripts, styles and the calls it makes (fetch,
 * EventSource, XMLHttpRequest) come from its own origin only, no inline script or style element,
 * no plugin, no `<base>`, forms post only to itself, and no page may frame it (clickjacking).
 * `'wasm-unsafe-eval'` lets the console compile WebAssembly (hash-wasm computes an upload's
 * SHA-256 in the browser); it allows no JavaScript `eval`. `img-src data:` is for the `data:,`
 * favicon of `ui/index.html`. Styles set from script through
 * the CSSOM (Preact's `style={{...}}`) are not inline styles and need no `'unsafe-inline'`.
 */
export const CONSOLE_CSP = [
  "default-src 'self'",
  "script-src 'self' 'wasm-unsafe-eval'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ')

/** CSP of every API response (JSON, SSE, errors): nothing is loaded from it, nothing may frame it. */
export const API_CSP = "default-src 'none'; frame-ancestors 'none'"

/**
 * Headers every response carries unless it set them itself: the API CSP, no framing (the legacy
 * header for browsers without `frame-ancestors`), no MIME sniffing, no Referer leaving the
 * console (it would carry job and upload ids), and no cross-origin embedding of a response as
 * an image, script or other no-cors resource.
 */
export const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  'content-security-policy': API_CSP,
  'x-frame-options': 'DENY',
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cross-origin-resource-policy': 'same-origin',
}

/**
 * `response` with each of {@link SECURITY_HEADERS} it does not already carry. The headers are
 * set in place; a response whose headers are immutable (one obtained by `fetch`) is copied first.
 */
export function withSecurityHeaders(response: Response): Response {
  let out = response
  for (const [name, value] of Object.entries(SECURITY_HEADERS)) {
    if (out.headers.has(name)) continue
    try {
      out.headers.set(name, value)
    } catch {
      out = new Response(out.body, out)
      out.headers.set(name, value)
    }
  }
  return out
}
