/**
 * A real nginx (Debian `nginx-light`) serving a directory on 127.0.0.1 for the remote-input
 * tests (lib/remote/): its own configuration, prefix, logs and temp paths in a temp directory,
 * one process (`master_process off`), stopped by `stop()`. Locations:
 * - `/` static files (byte ranges on, strong ETags);
 * - `/noranges/` the same files with `max_ranges 0` (every Range request answered 200 whole);
 * - `/private/` HTTP basic auth (`user` / `secret`, nginx's `{PLAIN}` scheme).
 * With `tls`, the server speaks HTTPS with that certificate and key.
 * And a TCP proxy that cuts its answers (`startCuttingProxy`), for dropped connections.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { createConnection, createServer, type Server, type Socket } from 'node:net'
import * as path from 'node:path'
import { accepts, freePort, safeRead } from './server.ts'

/** A running nginx. `requests()` are the access log's lines parsed (method, uri, range, status, bytes sent). */
export interface RunningNginx {
  base: string
  port: number
  requests(): Array<{ method: string; uri: string; range: string; status: number; bytes: number }>
  stop(): Promise<void>
}

/** The credentials of `/private/`. */
export const NGINX_USER = { username: 'user', password: 'secret' }

/**
 * Starts nginx serving `root` with its state under `dir` (created). `tls`: PEM certificate and key
 * files. Resolves once it accepts connections; throws with nginx's error log otherwise. `host`:
 * the address it listens on (default 127.0.0.1); `netns`: the network namespace it runs in;
 * `port`: the port (default a free one; given, to start it again where a stopped one listened).
 */
export async function startNginx(
  root: string,
  dir: string,
  opts: { tls?: { cert: string; key: string }; host?: string; netns?: string; port?: number } = {},
): Promise<RunningNginx> {
  const host = opts.host ?? '127.0.0.1'
  mkdirSync(dir, { recursive: true })
  const port = opts.port ?? (await freePort())
  const p = (n: string) => path.join(dir, n)
  writeFileSync(p('htpasswd'), `${NGINX_USER.username}:{PLAIN}${NGINX_USER.password}\n`)
  const conf = `
daemon off;
master_process off;
pid ${p('nginx.pid')};
error_log ${p('error.log')} warn;
events { worker_connections 128; }
http {
  log_format mig '$request_method $uri "$http_range" $status $body_bytes_sent';
  access_log ${p('access.log')} mig;
  client_body_temp_path ${p('body')};
  proxy_temp_path ${p('proxy')};
  fastcgi_temp_path ${p('fastcgi')};
  uwsgi_temp_path ${p('uwsgi')};
  scgi_temp_path ${p('scgi')};
  default_type application/octet-stream;
  sendfile on;
  keepalive_requests 100000;
  server {
    listen ${host}:${port}${opts.tls ? ' ssl' : ''};
    ${opts.tls ? `ssl_certificate ${opts.tls.cert}; ssl_certificate_key ${opts.tls.key};` : ''}
    root ${root};
    location /noranges/ { alias ${root}/; max_ranges 0; }
    location /private/ { alias ${root}/; auth_basic "migrator test"; auth_basic_user_file ${p('htpasswd')}; }
  }
}
`
  writeFileSync(p('nginx.conf'), conf)
  const argv = ['nginx', '-p', dir, '-c', p('nginx.conf')]
  // `ip netns exec` runs nginx in place of itself: the child's pid is nginx's
  if (opts.netns) argv.unshift('ip', 'netns', 'exec', opts.netns)
  const child: ChildProcess = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'ignore', 'pipe'] })
  let err = ''
  child.stderr!.on('data', (d) => (err += d))
  const exited = new Promise<void>((r) => child.once('exit', () => r()))
  const deadline = Date.now() + 10_000
  for (;;) {
    if (child.exitCode !== null) throw new Error(`nginx exited with ${child.exitCode}: ${err} ${safeRead(p('error.log'))}`)
    if (await accepts(port, host)) break
    if (Date.now() > deadline) {
      child.kill('SIGKILL')
      throw new Error(`nginx not listening in 10 s: ${err}`)
    }
    await new Promise((r) => setTimeout(r, 50))
  }
  return {
    base: `${opts.tls ? 'https' : 'http'}://${host}:${port}`,
    port,
    requests: () =>
      safeRead(p('access.log'))
        .split('\n')
        .filter(Boolean)
        .map((l) => {
          const m = /^(\S+) (\S+) "([^"]*)" (\d+) (\d+)$/.exec(l)
          if (!m) throw new Error(`access log line ${l}`)
          return { method: m[1]!, uri: m[2]!, range: m[3] === '-' ? '' : m[3]!, status: Number(m[4]), bytes: Number(m[5]) }
        }),
    async stop() {
      if (child.exitCode !== null) return
      child.kill('SIGQUIT')
      const t = setTimeout(() => child.kill('SIGKILL'), 5000)
      await exited
      clearTimeout(t)
    },
  }
}

/** A running cutting proxy: `connections` counts the connections it took, `bytes` the answer bytes it forwarded. */
export interface CuttingProxy {
  base: string
  connections: number
  bytes: number
  close(): Promise<void>
}

/**
 * A TCP proxy on 127.0.0.1 in front of `port` that forwards each connection's answer and cuts
 * the connection once it forwarded `cutAfter` bytes of answer, for the first `cuts` connections
 * (every connection when `cuts` is Infinity); later connections pass. `how` the client's side is
 * cut: `fin` ends it in order (what a server closing an idle or restarting session sends), `rst`
 * resets it (a crashed server or a middlebox); the server's side is destroyed either way.
 */
export async function startCuttingProxy(port: number, cutAfter: number, cuts: number, how: 'fin' | 'rst' = 'rst'): Promise<CuttingProxy> {
  const sockets = new Set<Socket>()
  const proxy: CuttingProxy & { server?: Server } = {
    base: '',
    connections: 0,
    bytes: 0,
    close: async () => {
      for (const s of sockets) s.destroy()
      await new Promise<void>((r) => server.close(() => r()))
    },
  }
  const server = createServer((client) => {
    const n = proxy.connections++
    const upstream = createConnection({ host: '127.0.0.1', port })
    sockets.add(client).add(upstream)
    let sent = 0
    const cut = n < cuts
    client.on('data', (d) => upstream.write(d))
    upstream.on('data', (d: Buffer) => {
      if (!cut) {
        proxy.bytes += d.length
        return void client.write(d)
      }
      const room = cutAfter - sent
      if (room > 0) {
        proxy.bytes += Math.min(room, d.length)
        client.write(room >= d.length ? d : d.subarray(0, room))
      }
      sent += d.length
      if (sent >= cutAfter) {
        if (how === 'rst') client.resetAndDestroy()
        else client.end()
        upstream.destroy()
      }
    })
    const end = () => {
      client.destroy()
      upstream.destroy()
      sockets.delete(client)
      sockets.delete(upstream)
    }
    client.on('close', end)
    upstream.on('close', end)
    client.on('error', end)
    upstream.on('error', end)
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()))
  proxy.base = `http://127.0.0.1:${(server.address() as { port: number }).port}`
  return proxy
}

/**
 * A test CA and a server certificate it signed for 127.0.0.1 (openssl, in `dir`): PEM paths, and
 * the CA's PEM text and the server certificate's SHA-256 thumbprint.
 */
export function makeTestCa(dir: string): { caPem: string; cert: string; key: string; thumbprint: string } {
  mkdirSync(dir, { recursive: true })
  const f = (n: string) => path.join(dir, n)
  const run = (args: string[]) => execFileSync('openssl', args, { stdio: ['ignore', 'pipe', 'pipe'] })
  run(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=migrator test CA', '-keyout', f('ca.key'), '-out', f('ca.pem')])
  run(['req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=127.0.0.1', '-keyout', f('server.key'), '-out', f('server.csr')])
  writeFileSync(f('ext.cnf'), 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n')
  run([
    'x509',
    '-req',
    '-in',
    f('server.csr'),
    '-CA',
    f('ca.pem'),
    '-CAkey',
    f('ca.key'),
    '-CAcreateserial',
    '-days',
    '2',
    '-extfile',
    f('ext.cnf'),
    '-out',
    f('server.pem'),
  ])
  const fp = run(['x509', '-in', f('server.pem'), '-noout', '-fingerprint', '-sha256']).toString()
  return { caPem: readFileSync(f('ca.pem'), 'utf8'), cert: f('server.pem'), key: f('server.key'), thumbprint: fp.split('=')[1]!.trim() }
}
