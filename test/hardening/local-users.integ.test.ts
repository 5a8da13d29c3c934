/**
 * A local unprivileged user gets nothing from the migrator (docs/security.md "Local users"), on
 * the real server under Bun and Node:
 *
 * - the default configuration (the unix socket only, no TCP listener): the socket's directory is
 *   made 0750 and the socket 0660 root:root; as `nobody` (`runuser`), connecting fails with
 *   EACCES and every route of the API is refused at the connect, also once the directory is
 *   opened; nothing is stored; root's CLI over the socket does the same requests; a host daemon
 *   proxying `{base_url}/api/v1/migrator` to the socket (a node:http proxy in this file) works; a
 *   live socket is not taken by a second server, a stale one is replaced;
 * - a TCP listener: as `nobody`, every route (SSE stream and upload included) answers 401
 *   `E_MIG_AUTH_FAILED` and nothing is stored; root's CLI with `--url` reads the token file and
 *   succeeds; a token of another server is refused; `migrator token rotate` ends the old token;
 * - the console on TCP (Chromium): the login link printed at start opens it once (a second use
 *   is refused), and a page from another origin cannot use the session.
 *
 * `curl` and `python3` run as `nobody` (Debian packages); the same requests as root show the
 * refusals come from the credentials, not from a broken request.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { Database } from 'bun:sqlite'
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { chmodSync, existsSync, lstatSync, mkdirSync, readdirSync, statSync } from 'node:fs'
import { createServer, request as httpRequest, type Server } from 'node:http'
import * as path from 'node:path'
import { chromium } from 'playwright-core'
import { HANDLERS } from '../../runtime/handlers.ts'
import { runCli } from '../helpers/cli.ts'
import { ensureNodeBuild, freePort, RUNTIMES, serverCommand, startServer, type RunningServer } from '../helpers/server.ts'
import { rawFetch, unregisterServer } from '../helpers/test-auth.ts'
import { REPO, tempDir } from '../helpers/tmp.ts'

const BASE_PATH = '/api/v1/migrator'
const ID = '0b7c1e52-8f43-4f0e-9d5a-6a1f2b3c4d5e'
const SERVER_ENV = { MIGRATOR_LIBVIRT_URI: 'test:///default', MIGRATOR_DOMAIN_TYPE: 'qemu' }

/** Every route of the API (runtime/handlers.ts) with its parameters filled in, and the console login. */
const ROUTES: Array<{ method: string; path: string }> = [
  ...HANDLERS.map((h) => ({ method: h.method, path: h.path.replace(/:[a-z_]+/gi, ID).replace('*', 'index.html') })),
  { method: 'GET', path: '/ui/login?ticket=1.aaaaaaaaaaaaaaaaaaaaaa.bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb' },
]

const MULTIPART = '--x\r\nContent-Disposition: form-data; name="file"; filename="a.img"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--x--\r\n'

/** `curl` run as `user` for one route: exit code, HTTP status (null when no answer), body. */
function curlAs(user: 'nobody' | 'root', route: { method: string; path: string }, target: { socket: string } | { base: string }) {
  const url = 'socket' in target ? `http://localhost${BASE_PATH}${route.path}` : `${target.base}${route.path}`
  const args = ['-sS', '--max-time', '10', '-o', '-', '-w', '\n%{http_code}', '-X', route.method]
  if ('socket' in target) args.push('--unix-socket', target.socket)
  let input: string | undefined
  if (route.method !== 'GET' && route.method !== 'DELETE') {
    const upload = route.path === '/uploads'
    args.push('-H', `content-type: ${upload ? 'multipart/form-data; boundary=x' : 'application/json'}`, '--data-binary', '@-')
    input = upload ? MULTIPART : JSON.stringify({ name: 'lu-src', kind: 'vim_api', endpoint: 'https://127.0.0.1:1/sdk', username: 'u', password: 'p' })
  }
  args.push(url)
  const cmd = user === 'root' ? ['curl', args] : ['runuser', ['-u', 'nobody', '--', 'curl', ...args]]
  const r = spawnSync(cmd[0] as string, cmd[1] as string[], { input, encoding: 'utf8', cwd: '/' })
  const lines = r.stdout.split('\n')
  const code = Number(lines.pop())
  return { exit: r.status, status: code > 0 ? code : null, body: lines.join('\n'), stderr: r.stderr }
}

/** The errno name of connecting to the unix socket `file` as nobody ('OK' when it connects). */
function connectAsNobody(file: string): string {
  const py =
    'import socket,sys,errno\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1]); print("OK")\nexcept OSError as e: print(errno.errorcode[e.errno])'
  return spawnSync('runuser', ['-u', 'nobody', '--', 'python3', '-c', py, file], { encoding: 'utf8', cwd: '/' }).stdout.trim()
}

/** Row count of every table of the server's store (read-only): the proof nothing was stored. */
function storeRows(dataDir: string): Record<string, number> {
  const db = new Database(path.join(dataDir, 'migrator.db', 'migrator.sqlite'), { readonly: true })
  try {
    const tables = db.query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").all() as Array<{ name: string }>
    return Object.fromEntries(tables.map((t) => [t.name, (db.query(`SELECT count(*) AS n FROM "${t.name}"`).get() as { n: number }).n]))
  } finally {
    db.close()
  }
}

/** The highest sequence number of the audit log (0 when empty). */
function auditSeq(dataDir: string): number {
  const db = new Database(path.join(dataDir, 'migrator.db', 'migrator.sqlite'), { readonly: true })
  try {
    return (db.query('SELECT coalesce(max(seq), 0) AS n FROM audit_log').get() as { n: number }).n
  } finally {
    db.close()
  }
}

/** The audit log's entries after sequence number `seq`, in order: method, status, `E_MIG_*` code. */
function auditAfter(dataDir: string, seq: number): Array<{ method: string; status: number; error_code: string | null }> {
  const db = new Database(path.join(dataDir, 'migrator.db', 'migrator.sqlite'), { readonly: true })
  try {
    return db.query('SELECT method, status, error_code FROM audit_log WHERE seq > ? ORDER BY seq').all(seq) as Array<{
      method: string
      status: number
      error_code: string | null
    }>
  } finally {
    db.close()
  }
}

/** Files under the import root and the upload area (what an upload or a registration would add). */
function importFiles(dataDir: string): string[] {
  const root = path.join(dataDir, 'imports')
  return readdirSync(root, { recursive: true }).map(String).sort()
}

/** Every server child this file spawned itself: killed after the file, whatever a timed-out hook left. */
const children: ChildProcess[] = []

/** A server of the default configuration: no MIGRATOR_LISTEN, the socket at `socket`. */
async function startSocketServer(
  runtime: 'bun' | 'node',
  dataDir: string,
  socket: string,
): Promise<{ child: ChildProcess; out(): string; stop(): Promise<void> }> {
  if (runtime === 'node') await ensureNodeBuild()
  const [cmd, args] = serverCommand(runtime)
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    ...SERVER_ENV,
    MIGRATOR_DATA_DIR: dataDir,
    MIGRATOR_SOCKET: socket,
    MIGRATOR_LOG_LEVEL: 'warn',
  }
  delete env.MIGRATOR_LISTEN
  const child = spawn(cmd, args, { cwd: REPO, env, stdio: ['ignore', 'pipe', 'pipe'] })
  children.push(child)
  let out = ''
  child.stdout!.on('data', (d) => (out += d))
  child.stderr!.on('data', (d) => (out += d))
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  const deadline = Date.now() + 60_000
  for (;;) {
    if (child.exitCode !== null) throw new Error(`${runtime} server exited ${child.exitCode}: ${out}`)
    // ready: the socket answers and the start-up lines were printed (they follow the listen)
    if (out.includes('migrator: console from your machine') && curlAs('root', { method: 'GET', path: '/migrations' }, { socket }).status === 200) break
    if (Date.now() > deadline) {
      child.kill('SIGKILL')
      throw new Error(`${runtime} server not ready: ${out}`)
    }
    await Bun.sleep(100)
  }
  return {
    child,
    out: () => out,
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM')
      await exited
    },
  }
}

/** A host daemon's proxy: `http://127.0.0.1:PORT{path}` forwarded as is to the unix socket. */
function startProxy(socket: string): Promise<{ base: string; server: Server }> {
  const server = createServer((req, res) => {
    const up = httpRequest({ socketPath: socket, path: req.url, method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers)
      r.pipe(res)
    })
    up.on('error', (e) => {
      res.writeHead(502)
      res.end(String(e))
    })
    req.pipe(up)
  })
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve({ base: `http://127.0.0.1:${(server.address() as { port: number }).port}${BASE_PATH}`, server })),
  )
}

const t = tempDir('lu-local-users-')
chmodSync(t.dir, 0o755)
afterAll(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL')
  t.cleanup()
})

for (const runtime of RUNTIMES) {
  describe(`${runtime}: the default configuration (the unix socket only)`, () => {
    const dataDir = path.join(t.dir, `${runtime}-sock`, 'data')
    const runDir = path.join(t.dir, `${runtime}-sock`, 'run')
    const socket = path.join(runDir, 'api.sock')
    let srv: Awaited<ReturnType<typeof startSocketServer>>

    beforeAll(async () => {
      mkdirSync(path.dirname(dataDir), { mode: 0o755 })
      srv = await startSocketServer(runtime, dataDir, socket)
    }, 180_000)
    afterAll(async () => {
      await srv?.stop()
    })

    test('the socket is root:root 0660 in a 0750 directory; no TCP listener, no token file; start-up prints the ssh -L way', () => {
      const st = lstatSync(socket)
      expect(st.isSocket()).toBe(true)
      expect([st.mode & 0o777, st.uid, st.gid]).toEqual([0o660, 0, 0])
      expect(statSync(runDir).mode & 0o777).toBe(0o750)
      // the private bind directory is gone
      expect(readdirSync(runDir)).toEqual(['api.sock'])
      expect(existsSync(path.join(dataDir, 'api-token'))).toBe(false)
      expect(srv.out()).toContain(`ssh -L 8080:${socket} root@<this host>, then open http://localhost:8080${BASE_PATH}/ui/`)
    })

    test('as nobody: connect fails with EACCES and every route is refused; nothing is stored', async () => {
      const rows = storeRows(dataDir)
      const files = importFiles(dataDir)
      expect(connectAsNobody(socket)).toBe('EACCES')
      for (const route of ROUTES) {
        const r = curlAs('nobody', route, { socket })
        expect({ route, exit: r.exit, status: r.status }).toEqual({ route, exit: 7, status: null })
      }
      // with the directory opened, the socket's own mode still refuses
      chmodSync(runDir, 0o755)
      try {
        expect(connectAsNobody(socket)).toBe('EACCES')
        for (const route of ROUTES) expect({ route, exit: curlAs('nobody', route, { socket }).exit }).toEqual({ route, exit: 7 })
      } finally {
        chmodSync(runDir, 0o750)
      }
      expect(storeRows(dataDir)).toEqual(rows)
      expect(importFiles(dataDir)).toEqual(files)
      // the same requests as root reach the handlers (the refusals above were the socket's)
      expect(curlAs('root', { method: 'GET', path: '/migrations' }, { socket }).status).toBe(200)
      expect(curlAs('root', { method: 'GET', path: `/migrations/${ID}` }, { socket }).status).toBe(404)
    }, 120_000)

    test('as root, the CLI over the socket: sources add and list, jobs, uploads, host-files, doctor (how the API is reachable)', async () => {
      const cli = (args: string[], env: Record<string, string> = {}) => runCli(['--socket', socket, ...args], { env })
      const add = await cli(['sources', 'add', 'lu-vc', 'vim_api', 'https://127.0.0.1:1/sdk', '--username', 'admin', '--insecure'], {
        MIGRATOR_SOURCE_PASSWORD: 'pw',
      })
      expect(add.stderr).toBe('')
      expect(add.code).toBe(0)
      const list = await cli(['--json', 'sources', 'list'])
      expect(JSON.parse(list.stdout).map((s: { name: string }) => s.name)).toEqual(['lu-vc'])
      expect(JSON.parse((await cli(['--json', 'jobs'])).stdout)).toEqual([])
      expect((await cli(['uploads', 'list'])).code).toBe(0)
      expect((await cli(['host-files', 'ls'])).code).toBe(0)
      const doctor = await cli(['--json', 'doctor'])
      const checks = JSON.parse(doctor.stdout).checks as Array<{ id: string; status: string; found: string }>
      expect(checks.find((c) => c.id === 'api-socket')).toMatchObject({
        status: 'ok',
        found: expect.stringContaining(`${socket}: owner uid 0, group root, mode 0660`),
      })
      expect(checks.find((c) => c.id === 'api-tcp')).toMatchObject({ status: 'ok', found: expect.stringContaining('no TCP listener') })
      // nobody's CLI gets nothing either
      const nobody = spawnSync('runuser', ['-u', 'nobody', '--', path.join(REPO, 'cli/migrator'), '--socket', socket, 'jobs'], { encoding: 'utf8', cwd: '/' })
      expect(nobody.status).toBe(1)
      expect(nobody.stderr).toContain('cannot reach the migrator')
    }, 120_000)

    test('a host daemon proxying {base_url}/api/v1/migrator to the socket: JSON, a write and the SSE stream work through it', async () => {
      const proxy = await startProxy(socket)
      try {
        const list = await rawFetch(`${proxy.base}/sources`)
        expect(list.status).toBe(200)
        const created = await rawFetch(`${proxy.base}/remote-credentials`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ name: 'lu-share', kind: 'smb', username: 'u', password: 'p' }),
        })
        expect([201, 400]).toContain(created.status) // the handler answered (a field rule may differ); the transport worked
        const stream = await rawFetch(`${proxy.base}/migrations/stream`, { headers: { accept: 'text/event-stream' } })
        expect(stream.status).toBe(200)
        expect(stream.headers.get('content-type')).toContain('text/event-stream')
        await stream.body?.cancel()
      } finally {
        proxy.server.closeAllConnections()
        await new Promise((r) => proxy.server.close(r))
      }
    }, 60_000)

    test('a live socket is not taken by a second server; a stale one (server killed) is replaced', async () => {
      const [cmd, args] = serverCommand(runtime)
      const env: Record<string, string> = {
        ...(process.env as Record<string, string>),
        ...SERVER_ENV,
        MIGRATOR_DATA_DIR: path.join(t.dir, `${runtime}-second`),
        MIGRATOR_SOCKET: socket,
      }
      delete env.MIGRATOR_LISTEN
      const second = spawnSync(cmd, args, { cwd: REPO, env, encoding: 'utf8', timeout: 60_000 })
      expect(second.status).toBe(1)
      expect(second.stderr).toContain(`another server is listening on ${socket}`)
      expect(curlAs('root', { method: 'GET', path: '/migrations' }, { socket }).status).toBe(200)

      srv.child.kill('SIGKILL')
      await srv.stop()
      expect(lstatSync(socket).isSocket()).toBe(true) // left behind by the killed server
      srv = await startSocketServer(runtime, dataDir, socket)
      expect(curlAs('root', { method: 'GET', path: '/sources' }, { socket }).body).toContain('lu-vc')
      expect(lstatSync(socket).mode & 0o777).toBe(0o660)
    }, 120_000)
  })

  describe(`${runtime}: a TCP listener needs the token`, () => {
    const dataDir = path.join(t.dir, `${runtime}-tcp`)
    let srv: RunningServer
    let other: RunningServer

    beforeAll(async () => {
      srv = await startServer(runtime, dataDir, SERVER_ENV)
      other = await startServer(runtime, path.join(t.dir, `${runtime}-tcp-other`), SERVER_ENV)
      // this file sends its credentials itself
      unregisterServer(srv.base)
      unregisterServer(other.base)
    }, 180_000)
    afterAll(async () => {
      await srv?.stop()
      await other?.stop()
    })

    test('the token file is 0600, 43 base64url characters; start-up prints the login link', async () => {
      const deadline = Date.now() + 10_000
      while (!srv.stdout().includes('migrator: console: open') && Date.now() < deadline) await Bun.sleep(100)
      const st = statSync(path.join(dataDir, 'api-token'))
      expect(st.mode & 0o777).toBe(0o600)
      expect(srv.token).toMatch(/^[A-Za-z0-9_-]{43}$/)
      expect(srv.stdout()).toMatch(new RegExp(`migrator: console: open ${srv.base.replace(/[.]/g, '\\.')}/ui/login\\?ticket=\\d+\\.[\\w-]{22}\\.[\\w-]{43} `))
    })

    test('as nobody: every route, the SSE stream and an upload answer 401 E_MIG_AUTH_FAILED; nothing is stored but the refusals in the audit log', () => {
      const rows = storeRows(dataDir)
      const files = importFiles(dataDir)
      const seq = auditSeq(dataDir)
      for (const route of ROUTES) {
        const r = curlAs('nobody', route, { base: srv.base })
        expect({ route, status: r.status }).toEqual({ route, status: 401 })
        expect(JSON.parse(r.body).error.code).toBe('E_MIG_AUTH_FAILED')
      }
      // every refused state-changing request is audited (runtime/audit.ts), nothing else is written
      const changing = ROUTES.filter((r) => !['GET', 'HEAD'].includes(r.method))
      const refusals = auditAfter(dataDir, seq)
      expect(refusals.map((e) => `${e.method} ${e.status} ${e.error_code}`)).toEqual(changing.map((r) => `${r.method} 401 E_MIG_AUTH_FAILED`))
      const { audit_log, sqlite_sequence, ...others } = storeRows(dataDir)
      const { audit_log: auditBefore, sqlite_sequence: _seqBefore, ...othersBefore } = rows
      expect(others).toEqual(othersBefore)
      expect(audit_log).toBe(auditBefore! + changing.length)
      expect(sqlite_sequence).toBeLessThanOrEqual(1)
      expect(importFiles(dataDir)).toEqual(files)
    }, 120_000)

    test('a wrong token, a token of another server and a Basic header are refused; the right token is accepted', async () => {
      const get = (authorization?: string) => rawFetch(`${srv.base}/migrations`, { headers: authorization ? { authorization } : {} })
      expect((await get()).status).toBe(401)
      expect((await get()).headers.get('www-authenticate')).toBe('Bearer realm="migrator"')
      expect((await get(`Bearer ${other.token}`)).status).toBe(401)
      expect((await get(`Bearer ${srv.token.slice(0, -1)}`)).status).toBe(401)
      expect((await get(`Basic ${Buffer.from('root:x').toString('base64')}`)).status).toBe(401)
      expect((await get(`Bearer ${srv.token}`)).status).toBe(200)
      expect((await rawFetch(`${other.base}/migrations`, { headers: { authorization: `Bearer ${other.token}` } })).status).toBe(200)
    })

    test('as root, the CLI with --url reads the token file of MIGRATOR_DATA_DIR; without it, 401 with the way', async () => {
      const ok = await runCli(['--url', srv.base, '--json', 'jobs'], { env: { MIGRATOR_DATA_DIR: dataDir } })
      expect(ok.stderr).toBe('')
      expect(JSON.parse(ok.stdout)).toEqual([])
      const add = await runCli(['--url', srv.base, 'sources', 'add', 'lu-tcp', 'vim_api', 'https://127.0.0.1:1/sdk', '--username', 'a', '--insecure'], {
        env: { MIGRATOR_DATA_DIR: dataDir, MIGRATOR_SOURCE_PASSWORD: 'pw' },
      })
      expect(add.code).toBe(0)
      const wrongDir = await runCli(['--url', srv.base, 'jobs'], { env: { MIGRATOR_DATA_DIR: path.join(t.dir, `${runtime}-tcp-other`) } })
      expect(wrongDir.code).toBe(1)
      expect(wrongDir.stderr).toContain('E_MIG_AUTH_FAILED: authentication required')
      expect(wrongDir.stderr).toContain('the token was refused')
      const doctor = await runCli(['--url', srv.base, '--json', 'doctor'], { env: { MIGRATOR_DATA_DIR: dataDir } })
      const tcp = JSON.parse(doctor.stdout).checks.find((c: { id: string }) => c.id === 'api-tcp')
      expect(tcp).toMatchObject({
        status: 'ok',
        found: expect.stringContaining(`every request needs the token of ${path.join(dataDir, 'api-token')} (mode 0600`),
      })
    }, 60_000)

    if (runtime === RUNTIMES[0]) {
      test('Chromium: the printed link opens the console once; a page from another origin cannot use the session', async () => {
        const link = /migrator: console: open (\S+)/.exec(srv.stdout())![1]!
        const attacker = createServer((_req, res) => {
          res.writeHead(200, { 'content-type': 'text/html' })
          res.end(`<!doctype html><script>
            window.results = Promise.all([
              fetch(${JSON.stringify(`${srv.base}/sources`)}, { method: 'POST', mode: 'no-cors', credentials: 'include', headers: { 'content-type': 'text/plain' }, body: '{"name":"evil","kind":"vim_api","endpoint":"https://127.0.0.1:1/sdk","username":"u","password":"p"}' }).then(() => 'sent', (e) => 'error ' + e),
              fetch(${JSON.stringify(`${srv.base}/sources`)}, { credentials: 'include' }).then((r) => r.text(), (e) => 'error ' + e),
            ])
          </script>`)
        })
        const attackerPort = await freePort()
        await new Promise<void>((r) => attacker.listen(attackerPort, '127.0.0.1', () => r()))
        const profile = path.join(t.dir, 'chromium-profile')
        const context = await chromium.launchPersistentContext(profile, {
          executablePath: process.env.MIGRATOR_CHROMIUM ?? '/usr/bin/chromium',
          headless: true,
          args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking'],
        })
        try {
          const page = context.pages()[0] ?? (await context.newPage())
          // without the session, the console's files are refused too
          expect((await page.goto(`${srv.base}/ui/`))!.status()).toBe(401)
          const opened = await page.goto(link)
          expect(opened!.status()).toBe(200)
          expect(page.url()).toBe(`${srv.base}/ui/`)
          const cookie = (await context.cookies()).find((c) => c.name.startsWith('migrator_session_'))!
          expect([cookie.httpOnly, cookie.sameSite, cookie.path]).toEqual([true, 'Strict', BASE_PATH])
          // the console's own requests carry the session
          await page.waitForSelector('body *')
          expect(await page.evaluate(async (u) => (await fetch(u)).status, `${srv.base}/sources`)).toBe(200)
          // a second use of the link is refused
          expect((await page.goto(link))!.status()).toBe(401)
          // another origin (same host, other port: same site, so the cookie goes along) is refused by the Origin guard
          // another origin: localhost (another site: the cookie stays home) and 127.0.0.1 on another
          // port (the same site: the cookie goes along); the Origin guard refuses both, and the
          // page can read nothing (a no-cors POST may even fail in the page, as the 403 carries
          // Cross-Origin-Resource-Policy)
          for (const origin of [`http://localhost:${attackerPort}`, `http://127.0.0.1:${attackerPort}`]) {
            await page.goto(`${origin}/`)
            const [, read] = (await page.evaluate('window.results')) as [string, string]
            expect(read).toStartWith('error ')
            const deadline = Date.now() + 10_000
            while (!srv.stdout().includes(`"origin":"${origin}"`) && Date.now() < deadline) await Bun.sleep(100)
            const refused = srv
              .stdout()
              .split('\n')
              .filter((l) => l.includes(`"origin":"${origin}"`))
              .map((l) => JSON.parse(l) as { msg: string; method: string })
            expect(refused.map((l) => l.msg)).toContain('request refused')
            expect(refused.map((l) => l.method)).toContain('POST')
          }
          const sources = (await (await rawFetch(`${srv.base}/sources`, { headers: { authorization: `Bearer ${srv.token}` } })).json()) as {
            items: Array<{ name: string }>
          }
          expect(sources.items.map((s) => s.name)).not.toContain('evil')
        } finally {
          await context.close()
          attacker.close()
        }
      }, 120_000)
    }

    test('migrator token rotate: the old token and its sessions are refused at once, the new one works; login-link prints a fresh link', async () => {
      const old = srv.token
      const r = await runCli(['token', 'rotate'], { env: { MIGRATOR_DATA_DIR: dataDir } })
      expect(r.code).toBe(0)
      expect(statSync(path.join(dataDir, 'api-token')).mode & 0o777).toBe(0o600)
      expect((await rawFetch(`${srv.base}/migrations`, { headers: { authorization: `Bearer ${old}` } })).status).toBe(401)
      const ok = await runCli(['--url', srv.base, '--json', 'jobs'], { env: { MIGRATOR_DATA_DIR: dataDir } })
      expect(ok.code).toBe(0)
      const link = await runCli(['--url', srv.base, 'login-link'], { env: { MIGRATOR_DATA_DIR: dataDir } })
      expect(link.stdout).toStartWith(`${srv.base}/ui/login?ticket=`)
      const login = await rawFetch(link.stdout.trim(), { redirect: 'manual' })
      expect(login.status).toBe(303)
      const session = login.headers.get('set-cookie')!.split(';')[0]!
      expect((await rawFetch(`${srv.base}/migrations`, { headers: { cookie: session } })).status).toBe(200)
      expect((await rawFetch(link.stdout.trim(), { redirect: 'manual' })).status).toBe(401)
    }, 60_000)
  })
}
