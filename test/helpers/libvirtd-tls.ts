/**
 * A libvirtd of the test's own listening for `qemu+tls://127.0.0.1:<port>/system`, with a CA and
 * certificates made by `openssl` (RFC 5280 extensions GnuTLS wants: CA basic constraints, server
 * and client key usages, the server's IP address as subjectAltName).
 *
 * The shared libvirtd of this machine is never touched: the instance runs in a private mount
 * namespace (`unshare -m`) with tmpfs over `/run/libvirt`, `/etc/libvirt`, `/var/lib/libvirt`,
 * `/var/cache/libvirt` and `/var/log/libvirt`, so it has its own sockets, configuration and
 * (empty) domain list, and never sees the shared daemon's guests; `stdio_handler = "file"` since
 * no virtlogd runs there. The mounts go with the namespace when the daemon exits.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { accepts, freePort } from './server.ts'

/** A running TLS libvirtd: its port, URI, the PEMs a client needs, a CA it does not trust, and `stop`. */
export interface RunningTlsLibvirtd {
  port: number
  uri: string
  caPem: string
  clientCertPem: string
  clientKeyPem: string
  /** A CA that signed nothing of this daemon (a client that trusts it must refuse the server). */
  otherCaPem: string
  /** `virsh -c <uri>` with the client's PKI (throws on failure). */
  virsh(...args: string[]): string
  stop(): Promise<void>
}

const EXT = `[server]
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1
[client]
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
`

function openssl(args: string[]): void {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] })
}

function makeCa(dir: string, name: string): void {
  openssl([
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-days',
    '2',
    '-subj',
    `/CN=${name}`,
    '-keyout',
    path.join(dir, `${name}-key.pem`),
    '-out',
    path.join(dir, `${name}.pem`),
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
  ])
}

function makeCert(dir: string, ca: string, kind: 'server' | 'client'): void {
  const p = (n: string) => path.join(dir, n)
  openssl([
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-subj',
    `/O=migrator test/CN=${kind === 'server' ? '127.0.0.1' : 'migrator'}`,
    '-keyout',
    p(`${kind}key.pem`),
    '-out',
    p(`${kind}.csr`),
  ])
  openssl([
    'x509',
    '-req',
    '-in',
    p(`${kind}.csr`),
    '-CA',
    p(`${ca}.pem`),
    '-CAkey',
    p(`${ca}-key.pem`),
    '-CAcreateserial',
    '-days',
    '2',
    '-extfile',
    p('ext.cnf'),
    '-extensions',
    kind,
    '-out',
    p(`${kind}cert.pem`),
  ])
}

/** Starts the daemon in `dir` (certificates, configuration, pid file); resolves once it accepts connections. */
export async function startTlsLibvirtd(dir: string): Promise<RunningTlsLibvirtd> {
  mkdirSync(dir, { recursive: true, mode: 0o700 })
  const p = (n: string) => path.join(dir, n)
  writeFileSync(p('ext.cnf'), EXT)
  makeCa(dir, 'ca')
  makeCa(dir, 'otherca')
  makeCert(dir, 'ca', 'server')
  makeCert(dir, 'ca', 'client')
  const port = await freePort()
  writeFileSync(
    p('libvirtd.conf'),
    [
      'listen_tls = 1',
      'listen_tcp = 0',
      `tls_port = "${port}"`,
      'listen_addr = "127.0.0.1"',
      `key_file = "${p('serverkey.pem')}"`,
      `cert_file = "${p('servercert.pem')}"`,
      `ca_file = "${p('ca.pem')}"`,
      'auth_tls = "none"',
      '',
    ].join('\n'),
  )
  writeFileSync(
    p('run.sh'),
    `#!/bin/sh
set -e
for d in /run/libvirt /var/lib/libvirt /etc/libvirt /var/cache/libvirt /var/log/libvirt; do mount -t tmpfs -o mode=0755 tmpfs "$d"; done
mkdir -p /etc/libvirt/qemu /var/lib/libvirt/qemu/nvram /var/log/libvirt/qemu
echo 'stdio_handler = "file"' > /etc/libvirt/qemu.conf
exec libvirtd --listen --config '${p('libvirtd.conf')}' --pid-file '${p('libvirtd.pid')}'
`,
    { mode: 0o700 },
  )
  const child: ChildProcess = spawn('unshare', ['-m', '--propagation', 'private', p('run.sh')], { detached: true, stdio: ['ignore', 'ignore', 'pipe'] })
  let log = ''
  child.stderr!.on('data', (b: Buffer) => {
    log = (log + b.toString()).slice(-16384)
  })
  let exited = false
  child.on('exit', () => {
    exited = true
  })
  const stop = async () => {
    if (exited) return
    child.kill('SIGTERM')
    for (let i = 0; i < 100 && !exited; i++) await Bun.sleep(100)
    if (!exited) child.kill('SIGKILL')
  }
  let up = false
  for (let i = 0; i < 200 && !up && !exited; i++) {
    up = await accepts(port)
    if (!up) await Bun.sleep(100)
  }
  if (!up) {
    await stop()
    throw new Error(`the TLS libvirtd did not listen on ${port}: ${log.slice(-2000)}`)
  }
  const pki = p('pki')
  mkdirSync(pki, { mode: 0o700 })
  writeFileSync(path.join(pki, 'cacert.pem'), readFileSync(p('ca.pem')))
  writeFileSync(path.join(pki, 'clientcert.pem'), readFileSync(p('clientcert.pem')))
  writeFileSync(path.join(pki, 'clientkey.pem'), readFileSync(p('clientkey.pem')), { mode: 0o600 })
  const uri = `qemu+tls://127.0.0.1:${port}/system`
  return {
    port,
    uri,
    caPem: readFileSync(p('ca.pem'), 'utf8'),
    clientCertPem: readFileSync(p('clientcert.pem'), 'utf8'),
    clientKeyPem: readFileSync(p('clientkey.pem'), 'utf8'),
    otherCaPem: readFileSync(p('otherca.pem'), 'utf8'),
    virsh: (...args: string[]) =>
      execFileSync('virsh', ['-q', '-c', `${uri}?pkipath=${pki}`, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 60_000 }).trim(),
    stop,
  }
}
