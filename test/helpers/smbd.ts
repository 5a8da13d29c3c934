/**
 * A real Samba (Debian `samba`) serving a directory as the share `exports` on 127.0.0.1 for the
 * SMB remote-input tests (lib/remote/smb-object.ts): its own smb.conf, private, lock, state,
 * cache and pid directories in a temp directory, a user (`SMBD_USER`) added with `pdbedit` into
 * that private directory's passdb, NetBIOS off, the server's defaults otherwise (NTLMv2 only).
 * smbd runs in the foreground in its own process group (its per-connection children with it);
 * `stop()` ends that group and waits until none of it is left.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { accepts, freePort, safeRead } from './server.ts'

/** The share's user: the account the tests run as (Samba maps an SMB user to a Unix one), and its SMB password. */
export const SMBD_USER = { username: execFileSync('id', ['-un'], { encoding: 'utf8' }).trim(), password: 'smb-secret-1' }

/** A running smbd: `base` is `smb://127.0.0.1:<port>/exports`. */
export interface RunningSmbd {
  base: string
  port: number
  /** smbd's processes now (the listener and one per connection). */
  pids(): number[]
  stop(): Promise<void>
}

/**
 * Starts smbd sharing `root` (read-only) as `exports`, with its state under `dir` (created).
 * Resolves once it accepts connections; throws with smbd's log otherwise. `host`: the address it
 * listens on (default 127.0.0.1); `netns`: the network namespace it runs in (`ip netns exec`).
 */
export async function startSmbd(root: string, dir: string, opts: { host?: string; netns?: string } = {}): Promise<RunningSmbd> {
  const host = opts.host ?? '127.0.0.1'
  mkdirSync(dir, { recursive: true })
  const port = await freePort()
  const p = (n: string) => path.join(dir, n)
  for (const d of ['private', 'lock', 'state', 'cache', 'pid', 'ncalrpc', 'log', 'bind']) mkdirSync(p(d), { recursive: true })
  const conf = `[global]
  server role = standalone server
  smb ports = ${port}
  interfaces = ${host}
  bind interfaces only = yes
  disable netbios = yes
  private dir = ${p('private')}
  lock directory = ${p('lock')}
  state directory = ${p('state')}
  cache directory = ${p('cache')}
  pid directory = ${p('pid')}
  ncalrpc dir = ${p('ncalrpc')}
  binddns dir = ${p('bind')}
  log file = ${p('log')}/log.%m
  passdb backend = tdbsam:${p('private')}/passdb.tdb
  load printers = no
  printing = bsd
  printcap name = /dev/null
  disable spoolss = yes
  map to guest = never
[exports]
  path = ${root}
  read only = yes
`
  writeFileSync(p('smb.conf'), conf)
  execFileSync('pdbedit', ['-s', p('smb.conf'), '-a', '-u', SMBD_USER.username, '-t'], {
    input: `${SMBD_USER.password}\n${SMBD_USER.password}\n`,
    stdio: ['pipe', 'ignore', 'pipe'],
  })
  // -F: foreground, in a process group of its own (no --no-process-group): stop() ends the group
  const argv = ['smbd', '-F', '-s', p('smb.conf'), '--debug-stdout', '-d', '1']
  // `ip netns exec` runs smbd in place of itself: the child's pid and group are smbd's
  if (opts.netns) argv.unshift('ip', 'netns', 'exec', opts.netns)
  const child: ChildProcess = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stdout!.on('data', (d) => (out = (out + d).slice(-8192)))
  child.stderr!.on('data', (d) => (out = (out + d).slice(-8192)))
  const exited = new Promise<void>((r) => child.once('exit', () => r()))
  const group = child.pid!
  const pids = () => {
    try {
      return execFileSync('pgrep', ['-g', String(group)], { encoding: 'utf8' })
        .split('\n')
        .filter(Boolean)
        .map(Number)
    } catch {
      return []
    }
  }
  const deadline = Date.now() + 15_000
  for (;;) {
    if (child.exitCode !== null) throw new Error(`smbd exited with ${child.exitCode}: ${out} ${safeRead(p('log/log.smbd'))}`)
    if (await accepts(port, host)) break
    if (Date.now() > deadline) {
      child.kill('SIGKILL')
      throw new Error(`smbd not listening in 15 s: ${out}`)
    }
    await new Promise((r) => setTimeout(r, 50))
  }
  return {
    base: `smb://${host}:${port}/exports`,
    port,
    pids,
    async stop() {
      const signal = (s: NodeJS.Signals) => {
        try {
          process.kill(-group, s)
        } catch {}
      }
      signal('SIGTERM')
      const until = Date.now() + 5000
      while (pids().length > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 50))
      if (pids().length > 0) signal('SIGKILL')
      await exited
      while (pids().length > 0) await new Promise((r) => setTimeout(r, 50))
    },
  }
}
