/**
 * A guestfish client (guestfish(1) `--listen` / `--remote`) over a guest's disks, shared by the
 * read-only inspection (lib/domain/inspect.ts) and the writes of the guest conversion steps
 * (lib/domain/guest-files.ts). `LIBGUESTFS_BACKEND=direct` unless the environment says otherwise;
 * the caller adds `LIBGUESTFS_BACKEND_SETTINGS=force_tcg` where the host runs guests under TCG.
 */
import { spawn } from 'node:child_process'
import { mkdtemp, open, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { exec } from '../exec.ts'

/** A running guestfish server: `run` throws on a failed command, `tryRun` answers null; `stop` ends it (never throws). */
export interface Fish {
  pid: string
  env: NodeJS.ProcessEnv
  run(args: string[]): Promise<string>
  tryRun(args: string[]): Promise<string | null>
  stop(): Promise<void>
}

/** The environment of a guestfish run: the process's, `LC_ALL=C`, the direct backend, TCG when `tcg`. */
export function fishEnv(tcg: boolean): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, LC_ALL: 'C', LIBGUESTFS_BACKEND: process.env.LIBGUESTFS_BACKEND || 'direct' }
  if (tcg) env.LIBGUESTFS_BACKEND_SETTINGS = 'force_tcg'
  return env
}

/**
 * Runs `guestfish --listen args` and reads what it printed. Its output goes to a file, not a pipe:
 * the server it forks keeps the descriptors it inherited, so a pipe would stay open (and a
 * reader wait) for the server's whole life; the command itself exits once the server is up.
 */
async function listen(args: string[], env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ code: number | null; output: string }> {
  const dir = await mkdtemp(path.join(tmpdir(), 'mig-fish-'))
  const out = await open(path.join(dir, 'out'), 'w+')
  try {
    const child = spawn('guestfish', ['--listen', ...args], { env, stdio: ['ignore', out.fd, out.fd] })
    const code = await new Promise<number | null>((resolve) => {
      const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
      child.once('error', () => (clearTimeout(timer), resolve(null)))
      child.once('exit', (c) => (clearTimeout(timer), resolve(c)))
    })
    const { buffer, bytesRead } = await out.read({ buffer: Buffer.alloc(64 * 1024), position: 0 })
    return { code, output: buffer.subarray(0, bytesRead).toString('utf8') }
  } finally {
    await out.close()
    await rm(dir, { recursive: true, force: true })
  }
}

/**
 * The format libguestfs opens disk `file` with: `qcow2` for an image the migrator made and named
 * `*.qcow2` (a live import's overlay over the source's export), else `raw`. Never probed: a raw
 * guest disk may hold a qcow2 header naming a backing file on this host.
 */
export function fishFormatOf(file: string): 'raw' | 'qcow2' {
  return file.endsWith('.qcow2') ? 'qcow2' : 'raw'
}

/**
 * Starts `guestfish --listen` over `disks` (`formats[i]` when given: a test boot's qcow2
 * overlays; else raw, or qcow2 by {@link fishFormatOf}), read-only unless `rw`; resolves with a client of it. Each command is bounded by `timeoutMs`. Throws an
 * `Error` when guestfish does not start.
 */
export async function startFish(disks: string[], env: NodeJS.ProcessEnv, timeoutMs: number, rw = false, formats?: string[]): Promise<Fish> {
  const args = [rw ? '--rw' : '--ro']
  for (const [i, d] of disks.entries()) args.push(`--format=${formats?.[i] ?? fishFormatOf(d)}`, '-a', d)
  const started = await listen(args, env, 30_000)
  const m = /GUESTFISH_PID=(\d+)/.exec(started.output)
  if (started.code !== 0 || !m) throw new Error(`guestfish --listen failed: ${started.output.trim().slice(0, 500) || `exit status ${started.code}`}`)
  const pid = m[1]!
  const run = async (a: string[]) => {
    const r = await exec('guestfish', [`--remote=${pid}`, '--', ...a], { env, timeoutMs, maxStdout: 64 << 20 })
    if (r.code !== 0) throw new Error(`guestfish ${a[0]}: ${(r.stderr || r.stdout).trim().slice(0, 500) || `exit status ${r.code}`}`)
    return r.stdout
  }
  const tryRun = (a: string[]) => run(a).catch(() => null)
  const stop = async () => {
    await tryRun(['exit'])
    try {
      process.kill(Number(pid), 0)
      process.kill(Number(pid), 'SIGKILL')
    } catch {
      // already gone
    }
  }
  return { pid, env, run, tryRun, stop }
}

/**
 * The exact content of guest file `file` (`cat`): guestfish prints a string result followed by
 * one newline of its own, which is removed here. Throws as {@link Fish.run}.
 */
export async function catFile(fish: Fish, file: string): Promise<string> {
  const out = await fish.run(['cat', file])
  return out.endsWith('\n') ? out.slice(0, -1) : out
}

/** A file system of a guest and its mount point (`/`, `/boot`), as libguestfs names the device (`/dev/sda2`). */
export interface GuestMount {
  mountpoint: string
  device: string
}

/**
 * Mounts the file systems of operating system `root` (as `inspect-os` named it) at their mount
 * points, shortest first, read-only unless `rw` (as {@link mountAt}). Resolves with the list, in
 * mount order. Throws as {@link Fish.run} when libguestfs cannot list them or the root does not mount.
 */
export async function mountFilesystems(fish: Fish, root: string, rw = false): Promise<GuestMount[]> {
  const mounts = (await fish.run(['inspect-get-mountpoints', root]))
    .split('\n')
    .map((l) => /^(\S+):\s*(\S+)/.exec(l))
    .filter((m): m is RegExpExecArray => !!m)
    .map((m) => ({ mountpoint: m[1]!, device: m[2]! }))
    .sort((a, b) => a.mountpoint.length - b.mountpoint.length)
  await mountAt(fish, mounts, rw)
  return mounts
}

/**
 * Mounts `mounts` in their order, read-only unless `rw`. The root (`/`) must mount (throws as
 * {@link Fish.run}); another file system that does not mount is passed over.
 */
export async function mountAt(fish: Fish, mounts: GuestMount[], rw = false): Promise<void> {
  for (const { mountpoint, device } of mounts) {
    const cmd = [rw ? 'mount' : 'mount-ro', device, mountpoint]
    if (mountpoint === '/') await fish.run(cmd)
    else await fish.tryRun(cmd)
  }
}
