/**
 * Test scaffolding for real libvirt + qemu (TCG): starts `virtlogd --daemon` and `libvirtd --daemon`
 * when they are not already running (no systemd here, DESIGN.md section 6), waits until
 * `virsh -c qemu:///system version` answers. The daemons live for the whole `bun test` run:
 * `test/helpers/preload.ts` (bunfig.toml) stops, after the last file, only those this process
 * started itself; a file never stops them, so the next file finds libvirt up. Every test file that
 * needs libvirt calls `ensureLibvirt()` in its `beforeAll` (whatever order the files run in). `cleanupDomains(prefix)` destroys and undefines every domain whose name starts
 * with a test prefix, so no qemu process outlives a test file.
 */
import { execFile, execFileSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'

/** The libvirt URI the tests use. */
export const TEST_LIBVIRT_URI = 'qemu:///system'

const LIBVIRTD_PID = '/run/libvirtd.pid'

/** Daemons started by this process (their pid files), so `stopLibvirt` stops only those, whatever pid a restart gave them. */
const started: Array<{ name: string; pidFile: string }> = []

function run(cmd: string, args: string[], timeoutMs = 15_000): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(cmd, args, { timeout: timeoutMs, killSignal: 'SIGKILL', maxBuffer: 4 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as any).code === 'number' ? (err as any).code : 1) : 0
      resolve({ code, stdout: String(stdout), stderr: String(stderr) })
    })
  })
}

/** Pid of a running daemon from its pid file, when that process is alive. */
function alivePid(pidFile: string): number | null {
  if (!existsSync(pidFile)) return null
  const pid = Number(readFileSync(pidFile, 'utf8').trim())
  if (!Number.isInteger(pid) || pid <= 0) return null
  try {
    process.kill(pid, 0)
    return pid
  } catch {
    return null
  }
}

async function ensureDaemon(name: 'virtlogd' | 'libvirtd', bin: string, pidFile: string, record = true): Promise<void> {
  if (alivePid(pidFile) !== null) return
  const r = await run(bin, ['--daemon'])
  if (r.code !== 0) throw new Error(`${name} --daemon failed: ${r.stderr.trim()}`)
  for (let i = 0; i < 100; i++) {
    if (alivePid(pidFile) !== null) {
      if (record) started.push({ name, pidFile })
      return
    }
    await Bun.sleep(50)
  }
  throw new Error(`${name} did not write ${pidFile}`)
}

/**
 * Makes sure virtlogd and libvirtd run and `virsh -c qemu:///system version` answers (up to 20 s).
 * Throws a plain Error when libvirt cannot be brought up (the test then fails loudly).
 */
export async function ensureLibvirt(): Promise<void> {
  await ensureDaemon('virtlogd', '/usr/sbin/virtlogd', '/run/virtlogd.pid')
  await ensureDaemon('libvirtd', '/usr/sbin/libvirtd', LIBVIRTD_PID)
  await waitForLibvirt()
}

async function waitForLibvirt(): Promise<void> {
  let last = ''
  for (let i = 0; i < 80; i++) {
    const r = await run('virsh', ['-c', TEST_LIBVIRT_URI, 'version'], 5000)
    if (r.code === 0) return
    last = r.stderr.trim()
    await Bun.sleep(250)
  }
  throw new Error(`libvirt did not answer: ${last}`)
}

/** Stops (SIGTERM) only the daemons `ensureLibvirt` started, libvirtd first (the preload's global afterAll; scripts). */
export async function stopLibvirt(): Promise<void> {
  for (const d of started.splice(0).reverse()) {
    const pid = alivePid(d.pidFile)
    if (pid === null) continue
    try {
      process.kill(pid, 'SIGTERM')
    } catch {
      /* already gone */
    }
  }
}

/**
 * Stops libvirtd as a package upgrade's restart does (SIGTERM; running domains stay up) and
 * waits until it is gone (up to 30 s). Only for `*.serial.integ.test.ts` files: every other file
 * shares the daemon. Throws when it does not stop.
 */
export async function stopLibvirtd(): Promise<void> {
  const pid = alivePid(LIBVIRTD_PID)
  if (pid === null) return
  process.kill(pid, 'SIGTERM')
  for (let i = 0; i < 300; i++) {
    try {
      process.kill(pid, 0)
    } catch {
      return
    }
    await Bun.sleep(100)
  }
  throw new Error(`libvirtd (pid ${pid}) did not stop within 30 s`)
}

/**
 * Starts libvirtd again after {@link stopLibvirtd} and waits until it answers; whoever started
 * the first one (this process's `stopLibvirt`, or nobody) stops this one too.
 */
export async function startLibvirtd(): Promise<void> {
  await ensureDaemon('libvirtd', '/usr/sbin/libvirtd', LIBVIRTD_PID, false)
  await waitForLibvirt()
}

/** Names of every domain (running or not) whose name starts with `prefix`. */
export async function domainsWithPrefix(prefix: string): Promise<string[]> {
  await ensureLibvirt()
  const r = await run('virsh', ['-c', TEST_LIBVIRT_URI, 'list', '--all', '--name'])
  if (r.code !== 0) throw new Error(`virsh list failed: ${r.stderr.trim()}`)
  return r.stdout
    .split('\n')
    .map((s) => s.trim())
    .filter((s) => s !== '' && s.startsWith(prefix))
}

/** Destroys and undefines (with its NVRAM) every domain whose name starts with `prefix`. */
export async function cleanupDomains(prefix: string): Promise<string[]> {
  if (prefix.length < 4) throw new Error('cleanupDomains needs a specific test prefix')
  const names = await domainsWithPrefix(prefix)
  for (const n of names) {
    await run('virsh', ['-c', TEST_LIBVIRT_URI, 'destroy', '--domain', n])
    const u = await run('virsh', ['-c', TEST_LIBVIRT_URI, 'undefine', '--nvram', '--domain', n])
    if (u.code !== 0) await run('virsh', ['-c', TEST_LIBVIRT_URI, 'undefine', '--domain', n])
  }
  return names
}

/** Pids of qemu processes whose command line names a domain starting with `prefix` (expected: none). */
export async function qemuPidsFor(prefix: string): Promise<number[]> {
  const r = await run('pgrep', ['-f', `guest=${prefix}`])
  return r.stdout
    .split('\n')
    .map((s) => Number(s.trim()))
    .filter((n) => Number.isInteger(n) && n > 0)
}

/** The pid of the qemu process of running domain `name`, from libvirt's pid file (throws when it has none). */
export function qemuPid(name: string): number {
  return Number(readFileSync(`/run/libvirt/qemu/${name}.pid`, 'utf8').trim())
}

/** `virsh -c qemu:///system <args>`'s output, trimmed; `absent` when the call fails (no such domain, libvirt away). */
export function virshText(...args: string[]): string {
  try {
    return execFileSync('virsh', ['-c', TEST_LIBVIRT_URI, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim()
  } catch {
    return 'absent'
  }
}

/** `virsh domstate` of domain `name` (`running`, `shut off`, ...), `absent` when it is not defined. */
export function domstate(name: string): string {
  return virshText('domstate', name)
}

/**
 * Shuts the running domain `name` down cleanly for a guest that ignores the ACPI power button
 * (the Debian test guests have no udev, so logind sees no power key): its reboot action is set to
 * `destroy` (live), then Ctrl+Alt+Del is sent, which the kernel hands to systemd as SIGINT
 * (ctrl-alt-del.target: a clean reboot, file systems unmounted), and qemu ends at the reset.
 * Resolves with the reason libvirt gives (`shutdown`); throws when it still runs after `timeoutMs`.
 */
export async function cleanShutdown(name: string, timeoutMs = 180_000): Promise<string> {
  execFileSync('virsh', ['-c', TEST_LIBVIRT_URI, 'set-lifecycle-action', '--domain', name, '--type', 'reboot', '--action', 'destroy', '--live'], {
    stdio: 'ignore',
  })
  const end = Date.now() + timeoutMs
  for (let sent = 0; Date.now() < end; ) {
    // once more a minute later: a guest still starting may not act on it (never 7 in 2 s: systemd's forced reboot)
    if (sent === 0 || Date.now() - sent > 60_000) {
      execFileSync('virsh', ['-c', TEST_LIBVIRT_URI, 'send-key', '--domain', name, 'KEY_LEFTCTRL', 'KEY_LEFTALT', 'KEY_DELETE'], { stdio: 'ignore' })
      sent = Date.now()
    }
    const m = /^shut off \((.*)\)$/.exec(virshText('domstate', '--reason', name))
    if (m) return m[1]!
    await Bun.sleep(1000)
  }
  throw new Error(`domain ${name}: still running ${timeoutMs / 1000} s after Ctrl+Alt+Del`)
}

/** Something a test file started: a server, a simulator, a proxy, stopped with `stop()` or `close()`. */
export type Stoppable = { stop(): Promise<unknown> } | { close(): unknown }

/**
 * The end of a test file that ran jobs: stops each of `running` in order (those never started,
 * `undefined`, are passed over), removes the domains whose names start with `prefix`, then the
 * temporary directory `t`.
 */
export async function tearDownJobs(prefix: string, t: { cleanup(): void }, ...running: Array<Stoppable | null | undefined>): Promise<void> {
  for (const r of running) {
    if (r && 'stop' in r) await r.stop()
    else if (r) await r.close()
  }
  await cleanupDomains(prefix)
  t.cleanup()
}
