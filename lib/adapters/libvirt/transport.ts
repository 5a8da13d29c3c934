/**
 * The transport of the `libvirt_remote` adapter: the local files a connection needs and the two
 * programs that use them.
 *
 * - A private directory (mode 0700, under the OS temp dir) holding the private key (0600), the
 *   pinned `known_hosts`, an `ssh_config` (that key only, that known_hosts only, strict host key
 *   checking unless the operator chose `tls.insecure`, batch mode: never a prompt) and an `ssh`
 *   wrapper running `ssh -F ssh_config`; for TLS, the `pkipath` directory libvirt reads
 *   (`cacert.pem`, `clientcert.pem`, `clientkey.pem`, https://libvirt.org/kbase/tlscerts.html).
 *   {@link LibvirtTransport.close} removes it; a new connection removes those of processes that
 *   are gone, with their orphaned `ssh` forwards ({@link sweepStaleConnections}).
 * - The libvirt URI: the endpoint with `command=<wrapper>` and `no_tty=1` (libvirt's ssh transport
 *   URI parameters, https://libvirt.org/uri.html#ssh-transport), or `pkipath=<dir>` for TLS.
 * - `virsh -c <uri>`: every control-plane call; {@link classifyFailure} turns its failures into
 *   the spec's codes.
 * - `ssh -N -L <local socket>:<remote socket>` with the same configuration: the data plane (the
 *   pull backup's NBD socket on the remote host reached as a local Unix socket).
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync, mkdirSync, existsSync, readdirSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { MigError, type ErrorCode } from '../../errors.ts'
import { exec, processAlive } from '../../exec.ts'
import { sleep } from '../../retry.ts'
import type { LibvirtEndpoint } from './uri.ts'

/** What a connection is made of (opened secrets included). */
export interface LibvirtCredentials {
  endpoint: LibvirtEndpoint
  /** SSH login (the endpoint's user wins). */
  user: string
  /** OpenSSH/PEM private key: the SSH key, or for TLS the client certificate's key. */
  privateKey: string
  /** Pinned host keys (known_hosts lines). */
  knownHosts?: string
  /** Skip the host key (or server certificate) check, by the operator's explicit choice. */
  insecure?: boolean
  /** TLS: the CA (PEM) and the client certificate (PEM). */
  caPem?: string
  clientCertPem?: string
  /** Seconds an SSH connection attempt may take (default 10). */
  connectTimeoutS?: number
}

/** The result of one `virsh` call. */
export interface VirshOut {
  code: number | null
  stdout: string
  stderr: string
  timedOut: boolean
}

/**
 * Maps a failed `virsh`/`ssh` run to a spec code with a message naming the cause and fix:
 * - host key verification failed (the pinned key differs, or the host is not in known_hosts):
 *   `E_MIG_AUTH_FAILED` with `details.reason` `host_key_mismatch` (the host failed to prove who it
 *   is; a retry cannot help, the operator must check the host and re-pin its key);
 * - `Permission denied` (the key was refused), TLS certificate rejections: `E_MIG_AUTH_FAILED`;
 * - refused, unreachable, DNS, timeouts, the peer closing: `E_MIG_SOURCE_UNREACHABLE`;
 * - otherwise `fallback` with libvirt's `error:` text.
 */
export function classifyFailure(label: string, out: VirshOut, fallback: ErrorCode, what: string): MigError {
  const text = `${out.stderr}\n${out.stdout}`
  const lines = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !/^@+$/.test(l))
  const libvirtErr = lines
    .filter((l) => l.startsWith('error:'))
    .map((l) => l.replace(/^error:\s*/, ''))
    .join('; ')
  const detail = (libvirtErr || lines.slice(-3).join('; ')).slice(0, 600)
  if (/REMOTE HOST IDENTIFICATION HAS CHANGED|Host key verification failed|No (ED25519|RSA|ECDSA)?\s*host key is known/i.test(text))
    return new MigError(
      'E_MIG_AUTH_FAILED',
      `${label}: host key verification failed: the host's SSH key is not the one pinned in known_hosts (a changed or impersonated host); check the host, then register its key line again (ssh-keyscan)`,
      { details: { endpoint: label, reason: 'host_key_mismatch' } },
    )
  if (/Permission denied \(|Too many authentication failures|authentication failed|Authentication refused/i.test(text))
    return new MigError(
      'E_MIG_AUTH_FAILED',
      `${label}: the SSH login was refused (${detail}); check the user and that the key's public half is in the host's authorized_keys`,
      {
        details: { endpoint: label, reason: 'login_refused' },
      },
    )
  if (/certificate|GnuTLS|TLS handshake/i.test(text) && /verif|reject|invalid|expired|not trusted|failed/i.test(text) && !/Cannot recv data/.test(text))
    return new MigError('E_MIG_AUTH_FAILED', `${label}: TLS authentication failed (${detail}); check the CA and the client certificate`, {
      details: { endpoint: label, reason: 'tls' },
    })
  if (
    out.timedOut ||
    /Connection refused|No route to host|Network is unreachable|Could not resolve hostname|Name or service not known|Connection timed out|Operation timed out|Connection closed by|Connection reset by peer|kex_exchange_identification|Unable to connect|End of file while reading data/i.test(
      text,
    )
  )
    return new MigError(
      'E_MIG_SOURCE_UNREACHABLE',
      `${label}: ${out.timedOut ? `${what} timed out` : detail}; check the host, port and that sshd/libvirtd run there`,
      {
        details: { endpoint: label },
      },
    )
  return new MigError(fallback, `${label}: ${what} failed: ${detail || `exit ${out.code}`}`, { details: { endpoint: label } })
}

/** Prefix of the private directories: `migrator-libvirt-<pid of the owning process>-XXXXXX`. */
const DIR_PREFIX = 'migrator-libvirt-'

/**
 * Removes what connections of processes that are gone left behind (a worker killed outright):
 * their private directories (the private key in them) and the `ssh` forwards still running with
 * a socket in them (orphans of the dead worker). Never throws.
 */
export function sweepStaleConnections(root = tmpdir()): void {
  try {
    const stale = readdirSync(root)
      .map((n) => ({ n, m: new RegExp(`^${DIR_PREFIX}(\\d+)-`).exec(n) }))
      .filter((e) => e.m && Number(e.m[1]) !== process.pid && !processAlive(Number(e.m[1])))
      .map((e) => path.join(root, e.n))
    if (stale.length === 0) return
    for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
      let cmd = ''
      try {
        cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8')
      } catch {
        continue
      }
      if (stale.some((d) => cmd.includes(`${d}/`)) && cmd.split('\0')[0]?.endsWith('ssh')) {
        try {
          process.kill(Number(pid), 'SIGTERM')
        } catch {
          // gone already
        }
      }
    }
    for (const d of stale) rmSync(d, { recursive: true, force: true })
  } catch {
    // a sweep that fails leaves files, never a failed connection
  }
}

/** The local side of one connection: its private directory, URI and programs. */
export class LibvirtTransport {
  /** The private directory (0700). */
  readonly dir: string
  /** The libvirt URI virsh connects with. */
  readonly uri: string
  /** The endpoint in messages (no secrets). */
  readonly label: string
  private readonly forwards = new Set<ChildProcess>()
  private closed = false

  constructor(readonly creds: LibvirtCredentials) {
    const ep = creds.endpoint
    this.label = `libvirt_remote ${ep.url}`
    sweepStaleConnections()
    this.dir = mkdtempSync(path.join(tmpdir(), `${DIR_PREFIX}${process.pid}-`))
    try {
      const key = path.join(this.dir, 'id_key')
      writeFileSync(key, creds.privateKey.replace(/\r\n/g, '\n').trimEnd() + '\n', { mode: 0o600 })
      const known = path.join(this.dir, 'known_hosts')
      writeFileSync(known, `${creds.knownHosts ?? ''}\n`, { mode: 0o600 })
      const strict = creds.insecure ? 'no' : 'yes'
      const cfg = [
        `IdentityFile ${key}`,
        'IdentitiesOnly yes',
        'IdentityAgent none',
        `UserKnownHostsFile ${known}`,
        'GlobalKnownHostsFile /dev/null',
        `StrictHostKeyChecking ${strict}`,
        ...(creds.insecure ? ['UpdateHostKeys no', 'CheckHostIP no'] : []),
        'BatchMode yes',
        'PasswordAuthentication no',
        'KbdInteractiveAuthentication no',
        `ConnectTimeout ${creds.connectTimeoutS ?? 10}`,
        'ServerAliveInterval 5',
        'ServerAliveCountMax 3',
        'ControlMaster no',
        'LogLevel ERROR',
      ].join('\n')
      const cfgPath = path.join(this.dir, 'ssh_config')
      writeFileSync(cfgPath, `${cfg}\n`, { mode: 0o600 })
      const wrapper = path.join(this.dir, 'ssh')
      writeFileSync(wrapper, `#!/bin/sh\nexec ssh -F '${cfgPath}' "$@"\n`, { mode: 0o700 })
      const base = `${ep.url}`
      if (ep.transport === 'ssh') {
        this.uri = `${base}?command=${encodeURIComponent(wrapper)}&no_tty=1${creds.insecure ? '&no_verify=1' : ''}`
      } else {
        const pki = path.join(this.dir, 'pki')
        mkdirSync(pki, { mode: 0o700 })
        writeFileSync(path.join(pki, 'cacert.pem'), creds.caPem ?? '', { mode: 0o600 })
        writeFileSync(path.join(pki, 'clientcert.pem'), creds.clientCertPem ?? '', { mode: 0o600 })
        writeFileSync(path.join(pki, 'clientkey.pem'), creds.privateKey, { mode: 0o600 })
        this.uri = `${base}?pkipath=${encodeURIComponent(pki)}${creds.insecure ? '&no_verify=1' : ''}`
      }
    } catch (e) {
      rmSync(this.dir, { recursive: true, force: true })
      throw e
    }
  }

  /** The `ssh` arguments reaching the host (config, port, login). */
  private sshArgs(): string[] {
    const ep = this.creds.endpoint
    return ['-F', path.join(this.dir, 'ssh_config'), '-p', String(ep.port), '-l', this.creds.user, '--', ep.host]
  }

  /** Runs `virsh -c <uri> args`; `input` goes to stdin. Never throws (see {@link VirshOut}). */
  async virsh(args: string[], opts: { timeoutMs?: number; input?: string } = {}): Promise<VirshOut> {
    if (this.closed) throw new MigError('E_MIG_INTERNAL', `${this.label}: connection closed`)
    const r = await exec('virsh', ['-q', '-c', this.uri, ...args], { timeoutMs: opts.timeoutMs ?? 60_000, input: opts.input })
    return { code: r.code, stdout: r.stdout, stderr: r.spawnError ? `virsh: ${r.spawnError.message}` : r.stderr, timedOut: r.timedOut }
  }

  /**
   * Reads the regular file `remote` (absolute path) on the host over SSH, at most `maxBytes`:
   * `stat -L` (type and size) and `head -c` of it, base64 on the wire (binary-safe through the
   * shell). `E_MIG_DISK_READ_FAILED` naming the file for a path that is not absolute or holds a
   * newline, a missing or unreadable file, a non-regular file (device, directory, FIFO: what
   * `head` would read forever or not at all), a file larger than `maxBytes`, or a file that
   * changed size while it was read; the transport codes of {@link classifyFailure} for SSH.
   */
  async readRemoteFile(remote: string, maxBytes: number, what: string, timeoutMs = 60_000): Promise<Buffer> {
    const fail = (why: string, fix: string) =>
      new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: ${what} ${JSON.stringify(remote.slice(0, 300))}: ${why}; ${fix}`, {
        details: { endpoint: this.label, file: remote.slice(0, 300) },
      })
    if (this.creds.endpoint.transport !== 'ssh') throw fail('files of the host are read over SSH', 'register the host with a qemu+ssh:// endpoint to carry it')
    if (!remote.startsWith('/') || /[\n\r\0]/.test(remote) || remote.length > 4096)
      throw fail('not an absolute path on one line', "correct the domain's description on the source")
    const q = `'${remote.replace(/'/g, `'\\''`)}'`
    const script = `LC_ALL=C; f=${q}; t=$(stat -L --printf '%F %s' -- "$f") || exit 3; echo "$t"; case "$t" in "regular file "*|"regular empty file "*) ;; *) exit 4;; esac; head -c ${maxBytes + 1} -- "$f" | base64 -w0 || exit 5`
    const r = await exec('ssh', [...this.sshArgs(), script], { timeoutMs, maxStdout: Math.ceil(((maxBytes + 1) * 4) / 3) + 4096 })
    const out = { code: r.code, stdout: r.stdout, stderr: r.spawnError ? `ssh: ${r.spawnError.message}` : r.stderr, timedOut: r.timedOut }
    if (r.code === 255 || r.timedOut || r.spawnError) throw classifyFailure(this.label, out, 'E_MIG_DISK_READ_FAILED', `reading ${what} ${remote}`)
    const [head = '', body = ''] = r.stdout.split('\n')
    const size = Number(/ (\d+)$/.exec(head)?.[1] ?? Number.NaN)
    if (r.code === 3)
      throw fail(`cannot be read (${r.stderr.trim().split('\n').pop()?.slice(0, 200) ?? 'stat failed'})`, 'connect as a user who can read it (root)')
    if (r.code === 4) throw fail(`is a ${head.replace(/ \d+$/, '')}, not a regular file`, "point the domain's description at a regular file")
    if (Number.isFinite(size) && size > maxBytes)
      throw fail(`is ${size} bytes, more than the ${maxBytes} accepted`, 'check that the domain names the right file')
    if (r.code !== 0 || r.overflow) throw fail(`reading it failed (${r.stderr.trim().slice(0, 200) || `exit ${r.code}`})`, 'check the file on the host')
    const bytes = Buffer.from(body.trim(), 'base64')
    if (bytes.length !== size) throw fail(`read ${bytes.length} bytes of ${size} (it changed while read)`, 'stop the domain and try again')
    return bytes
  }

  /** Writes `text` to a file in the private directory and returns its path (XML for virsh). */
  writeFile(name: string, text: string): string {
    const p = path.join(this.dir, name.replace(/[^A-Za-z0-9._-]/g, '_'))
    writeFileSync(p, text, { mode: 0o600 })
    return p
  }

  /**
   * Forwards the remote Unix socket `remote` to a local one in the private directory
   * (`ssh -N -L`), resolved once the local socket accepts; the process ends with {@link close}
   * or the returned `stop`. `E_MIG_SOURCE_UNREACHABLE`/`E_MIG_AUTH_FAILED` when ssh fails.
   */
  async forward(remote: string, name: string, timeoutMs = 20_000): Promise<{ socket: string; stop(): void; alive(): boolean }> {
    if (this.creds.endpoint.transport !== 'ssh')
      throw new MigError('E_MIG_DISK_READ_FAILED', `${this.label}: disks are read over SSH; register the host with a qemu+ssh:// endpoint to copy its disks`)
    const socket = path.join(this.dir, `${name.replace(/[^A-Za-z0-9._-]/g, '_')}.sock`)
    rmSync(socket, { force: true })
    const child = spawn('ssh', ['-N', '-o', 'ExitOnForwardFailure=yes', '-o', 'StreamLocalBindUnlink=yes', '-L', `${socket}:${remote}`, ...this.sshArgs()], {
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    let stderr = ''
    let exited: number | null | undefined
    child.stderr!.on('data', (b: Buffer) => {
      stderr = (stderr + b.toString('utf8')).slice(-8192)
    })
    child.on('exit', (code) => {
      exited = code
      this.forwards.delete(child)
    })
    child.on('error', (e) => {
      stderr += e.message
      exited = -1
    })
    this.forwards.add(child)
    const stop = () => {
      if (exited === undefined) child.kill('SIGTERM')
      this.forwards.delete(child)
    }
    const deadline = Date.now() + timeoutMs
    while (!existsSync(socket)) {
      if (exited !== undefined) {
        stop()
        throw classifyFailure(this.label, { code: exited, stdout: '', stderr, timedOut: false }, 'E_MIG_DISK_READ_FAILED', `forwarding ${remote}`)
      }
      if (Date.now() > deadline) {
        stop()
        throw classifyFailure(this.label, { code: null, stdout: '', stderr, timedOut: true }, 'E_MIG_DISK_READ_FAILED', `forwarding ${remote}`)
      }
      await sleep(50)
    }
    return { socket, stop, alive: () => exited === undefined }
  }

  /** The pids of the forwarding `ssh` processes (tests cut the connection with them). */
  forwardPids(): number[] {
    return [...this.forwards].map((c) => c.pid).filter((p): p is number => typeof p === 'number')
  }

  /** Ends every forward and removes the private directory. Never throws. */
  close(): void {
    if (this.closed) return
    this.closed = true
    for (const c of this.forwards) c.kill('SIGTERM')
    this.forwards.clear()
    rmSync(this.dir, { recursive: true, force: true })
  }
}
