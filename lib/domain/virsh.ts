/**
 * A thin client over `virsh -c <uri>` (libvirt's CLI, https://libvirt.org/manpages/virsh.html).
 * Every call goes through `lib/exec.ts` (no shell) with a timeout (SIGKILL when it expires); domain names are
 * always passed as `--domain <name>` so a name can never be read as an option.
 *
 * Error codes: `define`, `undefine`, `exists`, `list` and `uniqueName` throw
 * `E_MIG_DOMAIN_DEFINE_FAILED`; `start`, `state`, `destroy` throw `E_MIG_GUEST_BOOT_FAILED`
 * (the destination did not come up). Messages carry libvirt's own `error: ...` text.
 *
 * libvirt out of reach (libvirtd stopped or restarting, as a package upgrade does, or the
 * connection cut mid-call): every call is tried again, 0.5 s then doubling up to 5 s apart, until
 * libvirt answers or `reconnectMs` has passed; then the call fails with the last error and how
 * long libvirt was away. Domains keep running while libvirtd is away, so a boot check goes on.
 * Calls that change state are safe to repeat: `define` of the same XML updates the definition,
 * `start` of a domain that is running already (the first try reached libvirt) succeeds,
 * `destroy`/`undefine` of what is gone succeed.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { MigError, type ErrorCode } from '../errors.ts'
import { exec } from '../exec.ts'
import { sleep } from '../retry.ts'
import { sanitizeDomainName } from './xml.ts'

/**
 * Result of one virsh invocation. `code` is the exit status (-1 when killed or not started);
 * `reconnected`: an earlier try of the same call lost libvirt (its outcome unknown).
 */
export interface VirshResult {
  code: number
  stdout: string
  stderr: string
  timedOut: boolean
  reconnected?: boolean
}

/** `virsh domstate --reason` split: `state` like `running`, `shut off`; `reason` like `destroyed`. */
export interface DomainState {
  state: string
  reason: string | null
}

/**
 * Options: `uri` (libvirt connection URI, e.g. config `libvirtUri`, default `qemu:///system`),
 * `binary` (default `virsh`), `timeoutMs` (default per call: 30 s; `define` 60 s; `start` 120 s),
 * `reconnectMs` (how long a call waits for libvirt to come back, milliseconds; default 60 s;
 * 0 tries once).
 */
export interface VirshOptions {
  uri?: string
  binary?: string
  timeoutMs?: number
  reconnectMs?: number
}

const MAX_OUTPUT = 8 << 20

/** The libvirt error text of a failed call: its `error:` lines, else its stderr, else its stdout. */
export function libvirtMessage(r: VirshResult): string {
  const text = (r.stderr || r.stdout).trim()
  const errs = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.startsWith('error:'))
    .map((l) => l.slice(6).trim())
  const msg = errs.length ? errs.join('; ') : text || `exit status ${r.code}`
  return (r.timedOut ? 'timed out; ' : '') + msg.slice(0, 4000)
}

/**
 * True when a call failed because libvirt could not be reached, not because of what it asked:
 * no daemon behind the socket, or the connection dropped while the call ran.
 */
export function isConnectionLoss(r: VirshResult): boolean {
  return /failed to connect to the hypervisor|Failed to connect socket|End of file while reading data|Cannot recv data|Connection reset by peer|client socket is closed|Cannot write data: Broken pipe/i.test(
    r.stderr,
  )
}

/** Client of one libvirt connection. */
export class Virsh {
  readonly uri: string
  readonly binary: string
  private readonly timeoutMs: number | undefined
  private readonly reconnectMs: number

  constructor(opts: VirshOptions = {}) {
    this.uri = opts.uri ?? 'qemu:///system'
    this.binary = opts.binary ?? 'virsh'
    this.timeoutMs = opts.timeoutMs
    this.reconnectMs = opts.reconnectMs ?? 60_000
  }

  /**
   * Runs `virsh -c <uri> <args...>`, again while libvirt is out of reach (up to `reconnectMs`,
   * see the module comment); never throws (a spawn failure is code -1 with the reason in stderr).
   * When libvirt stayed away, the result's stderr says for how long.
   */
  async run(args: string[], timeoutMs = 30_000): Promise<VirshResult> {
    const t0 = Date.now()
    let reconnected = false
    for (let delay = 500; ; delay = Math.min(delay * 2, 5000)) {
      const r = { ...(await this.runOnce(args, timeoutMs)), ...(reconnected ? { reconnected } : {}) }
      if (r.code === 0 || !isConnectionLoss(r)) return r
      const waited = Date.now() - t0
      if (waited >= this.reconnectMs) {
        if (this.reconnectMs === 0) return r
        return {
          ...r,
          stderr: `${r.stderr.trim()}\nerror: libvirt at ${this.uri} did not answer for ${Math.round(waited / 1000)} s; start libvirtd and retry the job`,
        }
      }
      await sleep(Math.min(delay, this.reconnectMs - waited))
      reconnected = true
    }
  }

  private async runOnce(args: string[], timeoutMs: number): Promise<VirshResult> {
    const r = await exec(this.binary, ['-c', this.uri, ...args], {
      timeoutMs: this.timeoutMs ?? timeoutMs,
      maxStdout: MAX_OUTPUT,
      stderrTail: MAX_OUTPUT,
      env: { ...process.env, LC_ALL: 'C' },
    })
    const errText = r.spawnError ? `${this.binary}: ${r.spawnError.message}` : r.overflow ? `${this.binary}: output over ${MAX_OUTPUT} bytes` : ''
    return { code: r.code ?? -1, stdout: r.stdout, stderr: (r.spawnError ? '' : r.stderr) || errText, timedOut: r.timedOut }
  }

  private async must(code: ErrorCode, what: string, args: string[], timeoutMs?: number): Promise<VirshResult> {
    const r = await this.run(args, timeoutMs)
    if (r.code !== 0) throw new MigError(code, `${what}: ${libvirtMessage(r)}`, { details: { libvirt_uri: this.uri } })
    return r
  }

  /**
   * `virsh define` of `xml` (written to a private temp file, removed afterwards).
   * Returns the defined domain's name as libvirt reports it. Throws `E_MIG_DOMAIN_DEFINE_FAILED`
   * with libvirt's message when libvirt rejects the XML or cannot be reached.
   */
  async define(xml: string): Promise<string> {
    const dir = await mkdtemp(path.join(tmpdir(), 'mig-virsh-'))
    try {
      const file = path.join(dir, 'domain.xml')
      await writeFile(file, xml, { mode: 0o600 })
      const r = await this.must('E_MIG_DOMAIN_DEFINE_FAILED', 'virsh define failed', ['define', '--file', file], 60_000)
      const m = /Domain '?(.+?)'? defined from/.exec(r.stdout)
      return m ? m[1]! : ''
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  }

  /**
   * `virsh start`. A domain found running already after libvirt was out of reach during the call
   * counts as started (the first try got through). Throws `E_MIG_GUEST_BOOT_FAILED` with
   * libvirt's message (e.g. qemu failed to start).
   */
  async start(name: string): Promise<void> {
    const r = await this.run(['start', '--domain', name], 120_000)
    if (r.code === 0) return
    if (r.reconnected && /domain is already active/i.test(r.stderr) && (await this.run(['domstate', '--domain', name])).stdout.trim() === 'running') return
    throw new MigError('E_MIG_GUEST_BOOT_FAILED', `virsh start ${name} failed: ${libvirtMessage(r)}`, { details: { libvirt_uri: this.uri } })
  }

  /** `virsh domstate --reason`: `{ state: 'running', reason: 'booted' }`. Throws `E_MIG_GUEST_BOOT_FAILED`. */
  async stateDetail(name: string): Promise<DomainState> {
    const r = await this.must('E_MIG_GUEST_BOOT_FAILED', `virsh domstate ${name} failed`, ['domstate', '--reason', '--domain', name])
    return parseDomainState(r.stdout)
  }

  /**
   * Like {@link stateDetail}, for a caller that must tell the cases apart without an exception:
   * `{ state: 'absent' }` when libvirt has no such domain, null when libvirt stayed out of reach
   * (after the reconnect window). Throws `E_MIG_GUEST_BOOT_FAILED` on any other failure.
   */
  async stateOrAway(name: string): Promise<DomainState | null> {
    const r = await this.run(['domstate', '--reason', '--domain', name])
    if (r.code === 0) return parseDomainState(r.stdout)
    if (isNoDomain(r)) return { state: 'absent', reason: null }
    if (isConnectionLoss(r)) return null
    throw new MigError('E_MIG_GUEST_BOOT_FAILED', `virsh domstate ${name} failed: ${libvirtMessage(r)}`, { details: { libvirt_uri: this.uri } })
  }

  /** `virsh domstate`: `running`, `shut off`, `paused`, `crashed`, ... Throws `E_MIG_GUEST_BOOT_FAILED`. */
  async state(name: string): Promise<string> {
    return (await this.stateDetail(name)).state
  }

  /** `virsh destroy` (hard power-off). A domain that is not running or does not exist is not an error. Throws `E_MIG_GUEST_BOOT_FAILED`. */
  async destroy(name: string): Promise<void> {
    const r = await this.run(['destroy', '--domain', name])
    if (r.code === 0 || /not running/i.test(r.stderr) || isNoDomain(r)) return
    throw new MigError('E_MIG_GUEST_BOOT_FAILED', `virsh destroy ${name} failed: ${libvirtMessage(r)}`)
  }

  /**
   * `virsh undefine --nvram` (removes the definition and its UEFI NVRAM file; the disks stay).
   * A domain that does not exist is not an error. Throws `E_MIG_DOMAIN_DEFINE_FAILED`.
   */
  async undefine(name: string): Promise<void> {
    const r = await this.run(['undefine', '--nvram', '--domain', name])
    if (r.code === 0 || isNoDomain(r)) return
    throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', `virsh undefine ${name} failed: ${libvirtMessage(r)}`)
  }

  /** True when a domain named `name` is defined (any state). Throws `E_MIG_DOMAIN_DEFINE_FAILED` when libvirt cannot answer. */
  async exists(name: string): Promise<boolean> {
    const r = await this.run(['domuuid', '--domain', name])
    if (r.code === 0) return true
    if (isNoDomain(r)) return false
    throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', `virsh domuuid ${name} failed: ${libvirtMessage(r)}`)
  }

  /** Names of all domains (running or not). Throws `E_MIG_DOMAIN_DEFINE_FAILED`. */
  async list(): Promise<string[]> {
    const r = await this.must('E_MIG_DOMAIN_DEFINE_FAILED', 'virsh list failed', ['list', '--all', '--name'])
    return r.stdout
      .split('\n')
      .map((s) => s.trim())
      .filter((s) => s !== '')
  }

  /**
   * A free domain name from `base` (sanitized, see `sanitizeDomainName`): `base` itself, else
   * `base-2`, `base-3`, ... (base shortened so the result stays within 63 characters; up to 10000
   * tries). Not atomic: `define` fails with `E_MIG_DOMAIN_DEFINE_FAILED` if another client takes the
   * name in between. Throws `E_MIG_DOMAIN_DEFINE_FAILED`.
   */
  async uniqueName(base: string): Promise<string> {
    const b = sanitizeDomainName(base)
    // One `virsh list --all` (every domain, running or not, persistent or transient): a fixed
    // cost of every job; `define` fails anyway if a name is taken in between.
    const taken = new Set(await this.list())
    if (!taken.has(b)) return b
    for (let i = 2; i <= 10_000; i++) {
      const suffix = `-${i}`
      const candidate = b.slice(0, 63 - suffix.length) + suffix
      if (!taken.has(candidate)) return candidate
    }
    throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', `no free domain name for ${b}`)
  }
}

/** The first line of `virsh domstate --reason`'s output, split: `running (booted)` is `{ state: 'running', reason: 'booted' }`. */
function parseDomainState(stdout: string): DomainState {
  const line = stdout.trim().split('\n')[0] ?? ''
  const m = /^(.*?)\s*\((.*)\)$/.exec(line)
  return m ? { state: m[1]!, reason: m[2]! } : { state: line, reason: null }
}

function isNoDomain(r: VirshResult): boolean {
  return /failed to get domain|Domain not found|no domain with matching/i.test(r.stderr)
}
