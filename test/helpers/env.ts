/**
 * Test scaffolding: configurations, handler contexts and in-process apps over temporary data dirs.
 */
import { tempDir } from './tmp.ts'
import { createApp, type App } from '../../runtime/app.ts'
import { loadConfig, type Config } from '../../runtime/config.ts'
import { createContext, type Ctx } from '../../runtime/context.ts'

/** A configuration over `dataDir` with silent logs; `env` overrides variables. */
export function testConfig(dataDir: string, env: Record<string, string> = {}): Config {
  return loadConfig({ MIGRATOR_DATA_DIR: dataDir, MIGRATOR_LOG_LEVEL: 'silent', ...env })
}

/** A handler context over a new temporary data dir (for unit tests that call handlers directly). */
export async function testCtx(env: Record<string, string> = {}, now?: () => Date): Promise<{ ctx: Ctx; dir: string; cleanup(): Promise<void> }> {
  const t = tempDir()
  const ctx = await createContext(testConfig(t.dir, env), { now })
  return {
    ctx,
    dir: t.dir,
    async cleanup() {
      ctx.hub.closeAll()
      await ctx.store.close()
      t.cleanup()
    },
  }
}

/** An in-process app over a new temporary data dir. */
export async function testApp(env: Record<string, string> = {}): Promise<{ app: App; dir: string; cleanup(): Promise<void> }> {
  const t = tempDir()
  const app = await createApp(testConfig(t.dir, env))
  return {
    app,
    dir: t.dir,
    async cleanup() {
      await app.close()
      t.cleanup()
    },
  }
}

/** Builds a request to `pathname` (relative to the API base) with an optional JSON body. */
export function req(method: string, pathname: string, body?: unknown, headers: Record<string, string> = {}): Request {
  const init: RequestInit = { method, headers: { ...headers } }
  if (body !== undefined) {
    init.body = typeof body === 'string' ? body : JSON.stringify(body)
    ;(init.headers as Record<string, string>)['content-type'] = 'application/json'
  }
  return new Request(`http://127.0.0.1/api/v1/migrator${pathname}`, init)
}

/** Asserts-friendly view of an error response. */
export async function errorOf(res: Response): Promise<{ status: number; code: string; message: string; details?: any }> {
  const body = (await res.json()) as { error: { code: string; message: string; details?: unknown } }
  return { status: res.status, ...body.error }
}

export { CORPUS, REPO, tempDir, thrown } from './tmp.ts'
