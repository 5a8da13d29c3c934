// GET /ui/*: the web console (single-page app built from ui/ by Vite), beside the API under the
// same base path and behind the same authentication.
import { consoleDir, readConsoleAsset } from '../../lib/ui/assets.ts'
import type { Ctx } from '../../runtime/context.ts'
import { CONSOLE_CSP } from '../../runtime/security-headers.ts'

export const method = 'GET'
export const path = '/ui/*'

const dir = consoleDir()

/**
 * 200 with the console file under `{base}/ui/` (`{base}/ui/` itself is `index.html`; `{base}/ui`
 * is redirected there, 308, so relative asset URLs resolve); hashed `assets/` are cacheable
 * forever, the rest revalidated. Served with the console's Content-Security-Policy (the other
 * browser headers are the app's, runtime/security-headers.ts). Throws `E_MIG_NOT_FOUND` (404) for an
 * unknown file, and with status 503 and the build command when the console is not built.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const prefix = `${ctx.config.basePath}/ui/`
  const pathname = new URL(request.url).pathname
  if (!pathname.startsWith(prefix)) return new Response(null, { status: 308, headers: { location: prefix } })
  let rel = pathname.slice(prefix.length)
  try {
    rel = decodeURIComponent(rel)
  } catch {}
  const asset = await readConsoleAsset(dir, rel)
  return new Response(asset.body, {
    headers: {
      'content-type': asset.contentType,
      'cache-control': asset.immutable ? 'public, max-age=31536000, immutable' : 'no-cache',
      'content-security-policy': CONSOLE_CSP,
    },
  })
}
