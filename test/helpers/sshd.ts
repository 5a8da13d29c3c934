/**
 * A real OpenSSH server (Debian `openssh-server`) on 127.0.0.1 for the `libvirt_remote` tests:
 * this machine's libvirtd reached as a remote host (`qemu+ssh://root@127.0.0.1:<port>/system`).
 * Its own host key, config, pid file and log in a temp directory, a test key pair (`ssh-keygen`,
 * ed25519, no passphrase) whose public half is the only authorized key, root login by key only
 * (`PermitRootLogin prohibit-password`), no PAM. sshd runs in the foreground (`-D`) in its own
 * process group (its per-connection children with it); `stop()` ends that group.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { accepts, freePort } from './server.ts'

/** A running sshd. `knownHosts` is its host key line as `ssh-keyscan` prints it. */
export interface RunningSshd {
  port: number
  /** The test user's private key (OpenSSH text). */
  privateKey: string
  /** A second key pair's private key the server does not authorize. */
  otherKey: string
  knownHosts: string
  /** A known_hosts line for the same host with another key (a host key mismatch). */
  wrongKnownHosts: string
  /** sshd's processes now (the listener and one per connection). */
  pids(): number[]
  /** Kills the per-connection processes (every connection cut), leaving the listener. */
  cutConnections(): void
  stop(): Promise<void>
}

function keygen(file: string): void {
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'migrator-test', '-f', file])
}

/** Starts sshd with its state under `dir` (created). Resolves once it accepts connections. */
export async function startSshd(dir: string): Promise<RunningSshd> {
  mkdirSync(dir, { recursive: true, mode: 0o700 })
  mkdirSync('/run/sshd', { recursive: true, mode: 0o755 })
  const p = (n: string) => path.join(dir, n)
  for (const k of ['host_key', 'user_key', 'other_key', 'other_host_key']) keygen(p(k))
  writeFileSync(p('authorized_keys'), readFileSync(p('user_key.pub')), { mode: 0o600 })
  const port = await freePort()
  writeFileSync(
    p('sshd_config'),
    [
      `Port ${port}`,
      'ListenAddress 127.0.0.1',
      `HostKey ${p('host_key')}`,
      `PidFile ${p('sshd.pid')}`,
      `AuthorizedKeysFile ${p('authorized_keys')}`,
      'PermitRootLogin prohibit-password',
      'PubkeyAuthentication yes',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'UsePAM no',
      'StrictModes no',
      'AllowStreamLocalForwarding yes',
      'X11Forwarding no',
      'MaxStartups 50',
      'MaxSessions 50',
      '',
    ].join('\n'),
  )
  const child: ChildProcess = spawn('/usr/sbin/sshd', ['-D', '-e', '-f', p('sshd_config')], { detached: true, stdio: ['ignore', 'ignore', 'pipe'] })
  let log = ''
  child.stderr!.on('data', (b: Buffer) => {
    log = (log + b.toString()).slice(-16384)
  })
  let up = false
  for (let i = 0; i < 200 && !up; i++) {
    up = await accepts(port)
    if (!up) await Bun.sleep(50)
  }
  if (!up) {
    try {
      process.kill(-child.pid!, 'SIGKILL')
    } catch {}
    throw new Error(`sshd did not listen on ${port}: ${log}`)
  }
  const hostPub = readFileSync(p('host_key.pub'), 'utf8').trim().split(' ')
  const otherPub = readFileSync(p('other_host_key.pub'), 'utf8').trim().split(' ')
  // the listener and its descendants (each connection's processes call setsid: not in its group)
  const pids = () => {
    const all: number[] = []
    let level = [child.pid!]
    while (level.length > 0) {
      all.push(...level)
      const next: number[] = []
      for (const p of level) {
        try {
          next.push(
            ...execFileSync('pgrep', ['-P', String(p)], { encoding: 'utf8' })
              .split('\n')
              .map(Number)
              .filter((n) => n > 0),
          )
        } catch {
          // no children
        }
      }
      level = next
    }
    return all.filter((p) => {
      try {
        process.kill(p, 0)
        return true
      } catch {
        return false
      }
    })
  }
  return {
    port,
    privateKey: readFileSync(p('user_key'), 'utf8'),
    otherKey: readFileSync(p('other_key'), 'utf8'),
    knownHosts: `[127.0.0.1]:${port} ${hostPub[0]} ${hostPub[1]}\n`,
    wrongKnownHosts: `[127.0.0.1]:${port} ${otherPub[0]} ${otherPub[1]}\n`,
    pids,
    cutConnections() {
      for (const pid of pids()) if (pid !== child.pid) process.kill(pid, 'SIGKILL')
    },
    async stop() {
      const all = pids()
      for (const pid of all) {
        try {
          process.kill(pid, 'SIGKILL')
        } catch {}
      }
      for (let i = 0; i < 100 && all.some((p) => existsSync(`/proc/${p}`)); i++) await Bun.sleep(50)
    },
  }
}
