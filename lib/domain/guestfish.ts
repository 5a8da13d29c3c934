/**
 * A guestfish client (guestfish(1) `--listen` / `--remote`) over a guest's disks, shared by the
 * read-only inspection (lib/domain/inspect.ts) and the writes of the guest conversion steps
 * (lib/domain/guest-files.ts). `LIBGUESTFS_BACKEND=direct` unless the environment says otherwise;
 * the caller adds `LIBGUESTFS_BACKEND_SETTINGS=force_tcg` where the host runs guests under TCG.
 */
import { execFile } from 'node:child_process'

/** A running guestfish server: `run` throws on a failed command, `tryRun` answers null; `stop` ends it (never throws). */
export interface Fish {
  pid: string
  env: NodeJS.ProcessEnv
  run(args: string[]): Promise<string>
  tryRun(args: string[]): Promise<string | null>
  stop(): Promise<void>
}

/** Runs `cmd args` with `env` (output decoded as latin1), killed after `timeoutMs`; resolves with exit code and output, never rejects. */
export function exec(cmd: string, args: string[], env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(cmd, args, { env, timeout: timeoutMs, killSignal: 'SIGKILL', maxBuffer: 64 << 20, encoding: 'latin1' }, (err, stdout, stderr) => {
      const e = err as (NodeJS.ErrnoException & { code?: number | string }) | null
      resolve({ code: e ? (typeof e.code === 'number' ? e.code : -1) : 0, stdout: String(stdout ?? ''), stderr: String(stderr ?? '') || (e ? e.message : '') })
    })
  })
}

/** The environment of a guestfish run: the process's, `LC_ALL=C`, the direct backend, TCG when `tcg`. */
export function fishEnv(tcg: boolean): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, LC_ALL: 'C', LIBGUESTFS_BACKEND: process.env.LIBGUESTFS_BACKEND || 'direct' }
  if (tcg) env.LIBGUESTFS_BACKEND_SETTINGS = 'force_tcg'
  return env
}

/**
 * Starts `guestfish --listen` over `disks` (raw), read-only unless `rw`; resolves with a client of
 * it. Each command is bounded by `timeoutMs`. Throws an `Error` when guestfish does not start.
 */
export async function startFish(disks: string[], env: NodeJS.ProcessEnv, timeoutMs: number, rw = false): Promise<Fish> {
  const args = ['--listen', rw ? '--rw' : '--ro']
  for (const d of disks) args.push('--format=raw', '-a', d)
  const r = await exec('guestfish', args, env, 30_000)
  const m = /GUESTFISH_PID=(\d+)/.exec(r.stdout)
  if (r.code !== 0 || !m) throw new Error(`guestfish --listen failed: ${(r.stderr || r.stdout).trim().slice(0, 500)}`)
  const pid = m[1]!
  const run = async (a: string[]) => {
    const out = await exec('guestfish', [`--remote=${pid}`, '--', ...a], env, timeoutMs)
    if (out.code !== 0) throw new Error(`guestfish ${a[0]}: ${(out.stderr || out.stdout).trim().slice(0, 500) || `exit status ${out.code}`}`)
    return out.stdout
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

/**
 * Mounts the first operating system libguestfs finds (`inspect-os`) at its mount points, shortest
 * first, read-only unless `rw`. Returns the root device, or null when no operating system is found.
 */
export async function mountGuest(fish: Fish, rw = false): Promise<string | null> {
  const roots = (await fish.run(['inspect-os']))
    .split('\n')
    .map((s) => s.trim())
    .filter(Boolean)
  if (roots.length === 0) return null
  const root = roots[0]!
  await mountFilesystems(fish, root, rw)
  return root
}

/**
 * Mounts the file systems of operating system `root` (as `inspect-os` named it) at their mount
 * points, shortest first, read-only unless `rw`; one that does not mount is passed over.
 * Throws as {@link Fish.run} when libguestfs cannot list them.
 */
export async function mountFilesystems(fish: Fish, root: string, rw = false): Promise<void> {
  const mps = (await fish.run(['inspect-get-mountpoints', root]))
    .split('\n')
    .map((l) => /^(\S+):\s*(\S+)/.exec(l))
    .filter((m): m is RegExpExecArray => !!m)
    .map((m) => ({ mp: m[1]!, dev: m[2]! }))
    .sort((a, b) => a.mp.length - b.mp.length)
  for (const { mp, dev } of mps) await fish.tryRun([rw ? 'mount' : 'mount-ro', dev, mp])
}
