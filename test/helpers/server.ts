/**
 * Starts the real migrator server as a child process under Bun or Node on 127.0.0.1, waits until
 * `GET {base}/migrations` answers 200, and stops it (SIGTERM, then SIGKILL after 10 s). The
 * server has a TCP listener (`MIGRATOR_LISTEN`) and its unix socket in its data directory
 * (`<dataDir>/api.sock`); its API token is read from `<dataDir>/api-token` and registered for the
 * test process's `fetch` (test/helpers/test-auth.ts).
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { createConnection, createServer } from 'node:net'
import * as path from 'node:path'
import { readToken, tokenPath } from '../../lib/auth/api-token.ts'
import { installAuthFetch, rawFetch, registerServer, unregisterServer } from './test-auth.ts'
import { REPO } from './tmp.ts'

// benches (bench/*.ts) start servers outside `bun test` and its preload
installAuthFetch()

/** Runtimes the integration suites run against: `MIGRATOR_TEST_RUNTIMES` (default `bun,node`). */
export const RUNTIMES = (process.env.MIGRATOR_TEST_RUNTIMES ?? 'bun,node').split(',').filter(Boolean) as Array<'bun' | 'node'>

/** A free TCP port on 127.0.0.1. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer()
    s.once('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port
      s.close(() => resolve(port))
    })
  })
}

/** Whether something accepts TCP connections on `host`:`port` (default 127.0.0.1; a server child is up). */
export function accepts(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createConnection({ host, port }, () => {
      s.destroy()
      resolve(true)
    })
    s.on('error', () => resolve(false))
  })
}

/** The text of file `f` (a server child's log), '' when it cannot be read. */
export function safeRead(f: string): string {
  try {
    return readFileSync(f, 'utf8')
  } catch {
    return ''
  }
}

/** A running server child. */
export interface RunningServer {
  base: string
  /** The server's unix socket (`MIGRATOR_SOCKET`, default `<dataDir>/api.sock`). */
  socket: string
  /** The API token of its data directory. */
  token: string
  child: ChildProcess
  stderr(): string
  stdout(): string
  /** SIGTERM and wait; returns the exit code. */
  stop(): Promise<number | null>
}

let nodeBuild: Promise<void> | null = null

/** Set by `scripts/test.ts` once it has built dist/ for the whole run. */
export const NODE_BUILD_DONE = 'MIGRATOR_TEST_NODE_BUILD_DONE'

/**
 * Compiles the server for Node (`npm run build:node`: tsc into dist/) once per test process, as
 * `npm run start:node` does; not at all under `scripts/test.ts`, which built it before the files
 * started (files running in parallel must not rewrite dist/ under each other's Node processes).
 * Type errors are the typecheck step's business; a missing output fails.
 */
export function ensureNodeBuild(): Promise<void> {
  if (process.env[NODE_BUILD_DONE] === '1' && existsSync(path.join(REPO, 'dist/runtime/serve-node.js'))) return Promise.resolve()
  nodeBuild ??= new Promise<void>((resolve, reject) => {
    execFile(path.join(REPO, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.node.json'], { cwd: REPO }, (_err, stdout) => {
      if (existsSync(path.join(REPO, 'dist/runtime/serve-node.js'))) resolve()
      else reject(new Error(`node build failed: ${stdout}`))
    })
  })
  return nodeBuild
}

/** The command line that serves the migrator under `runtime` (what `npm start` / `npm run start:node` run). */
export function serverCommand(runtime: 'bun' | 'node'): [string, string[]] {
  return runtime === 'bun'
    ? [path.join(REPO, 'node_modules/.bin/bun'), ['runtime/serve-bun.ts']]
    : [process.env.MIGRATOR_NODE ?? 'node', ['--enable-source-maps', 'dist/runtime/serve-node.js']]
}

/**
 * Spawns the server with `env` (merged over the test process's), waits until it is ready. A
 * `MIGRATOR_LISTEN` in `env` keeps its port (a restarted server on the same address). The
 * readiness probe sends the token of `<dataDir>/api-token`, or with `MIGRATOR_BASIC_AUTH` those
 * credentials (and then the token is not registered: such tests send their own credentials).
 */
export async function startServer(runtime: 'bun' | 'node', dataDir: string, env: Record<string, string> = {}): Promise<RunningServer> {
  if (runtime === 'node') await ensureNodeBuild()
  const port = env.MIGRATOR_LISTEN ? Number(env.MIGRATOR_LISTEN.split(':').pop()) : await freePort()
  const [cmd, args] = serverCommand(runtime)
  const socket = env.MIGRATOR_SOCKET ?? path.join(dataDir, 'api.sock')
  const child = spawn(cmd, args, {
    cwd: REPO,
    env: { ...process.env, MIGRATOR_DATA_DIR: dataDir, MIGRATOR_LOG_LEVEL: 'warn', MIGRATOR_SOCKET: socket, ...env, MIGRATOR_LISTEN: `127.0.0.1:${port}` },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let out = ''
  let err = ''
  child.stdout!.on('data', (d) => (out += d))
  child.stderr!.on('data', (d) => (err += d))
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  const base = `http://127.0.0.1:${port}/api/v1/migrator`
  const basic = env.MIGRATOR_BASIC_AUTH ? `Basic ${Buffer.from(env.MIGRATOR_BASIC_AUTH).toString('base64')}` : null
  const tokenFile = tokenPath(env.MIGRATOR_DATA_DIR ?? dataDir)
  let token: string | null = null
  const deadline = Date.now() + 30_000
  for (;;) {
    if (child.exitCode !== null) throw new Error(`${runtime} server exited with ${child.exitCode}: ${err}`)
    try {
      // the token file is written at start, before the server listens
      token ??= readToken(tokenFile)
      const authorization = basic ?? (token ? `Bearer ${token}` : null)
      if (authorization && (await rawFetch(`${base}/migrations`, { headers: { authorization } })).status === 200) break
    } catch {}
    if (Date.now() > deadline) {
      child.kill('SIGKILL')
      throw new Error(`${runtime} server not ready in 30 s: ${err}`)
    }
    await new Promise((r) => setTimeout(r, 100))
  }
  if (basic) unregisterServer(base)
  else registerServer(base, token!)
  return {
    base,
    socket,
    token: token!,
    child,
    stderr: () => err,
    stdout: () => out,
    async stop() {
      if (child.exitCode !== null) return child.exitCode
      child.kill('SIGTERM')
      const t = setTimeout(() => child.kill('SIGKILL'), 10_000)
      const code = await exited
      clearTimeout(t)
      return code
    },
  }
}
