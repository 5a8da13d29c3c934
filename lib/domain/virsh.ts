/**
 * A thin client over `virsh -c <uri>` (libvirt's CLI, https://libvirt.org/manpages/virsh.html).
 * Every call goes through `lib/exec.ts` (no shell) with a timeout (SIGKILL when it expires); domain names are
 * always passed as `--domain <name>` so a name can never be read as an option.
 *
 * Error codes: `define`, `undefine`, `exists`, `list` and `uniqueName` throw
 * `E_MIG_DOMAIN_DEFINE_FAILED`; `start`, `state`, `destroy` throw `E_MIG_GUEST_BOOT_FAILED`
 * (the destination did not come up). Messages carry libvirt's own `error: ...` text.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { MigError, type ErrorCode } from '../errors.ts'
import { exec } from '../exec.ts'
import { sanitizeDomainName } from './xml.ts'

/** Result of one virsh invocation. `code` is the exit status (-1 when killed or not started). */
export interface VirshResult {
  code: number
  stdout: string
  stderr: string
  timedOut: boolean
}

/** `virsh domstate --reason` split: `state` like `running`, `shut off`; `reason` like `destroyed`. */
export interface DomainState {
  state: string
  reason: string | null
}

/**
 * Options: `uri` (libvirt connection URI, e.g. config `libvirtUri`, default `qemu:///system`),
 * `binary` (default `virsh`), `timeoutMs` (default per call: 30 s; `define` 60 s; `start` 120 s).
 */
export interface VirshOptions {
  uri?: string
  binary?: string
  timeoutMs?: number
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

/** Client of one libvirt connection. */
export class Virsh {
  readonly uri: string
  readonly binary: string
  private readonly timeoutMs: number | undefined

  constructor(opts: VirshOptions = {}) {
    this.uri = opts.uri ?? 'qemu:///system'
    this.binary = opts.binary ?? 'virsh'
    this.timeoutMs = opts.timeoutMs
  }

  /** Runs `virsh -c <uri> <args...>`; never throws (a spawn failure is code -1 with the reason in stderr). */
  async run(args: string[], timeoutMs = 30_000): Promise<VirshResult> {
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

  /** `virsh start`. Throws `E_MIG_GUEST_BOOT_FAILED` with libvirt's message (e.g. qemu failed to start). */
  async start(name: string): Promise<void> {
    await this.must('E_MIG_GUEST_BOOT_FAILED', `virsh start ${name} failed`, ['start', '--domain', name], 120_000)
  }

  /** `virsh domstate --reason`: `{ state: 'running', reason: 'booted' }`. Throws `E_MIG_GUEST_BOOT_FAILED`. */
  async stateDetail(name: string): Promise<DomainState> {
    const r = await this.must('E_MIG_GUEST_BOOT_FAILED', `virsh domstate ${name} failed`, ['domstate', '--reason', '--domain', name])
    const line = r.stdout.trim().split('\n')[0] ?? ''
    const m = /^(.*?)\s*\((.*)\)$/.exec(line)
    return m ? { state: m[1]!, reason: m[2]! } : { state: line, reason: null }
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

function isNoDomain(r: VirshResult): boolean {
  return /failed to get domain|Domain not found|no domain with matching/i.test(r.stderr)
}
