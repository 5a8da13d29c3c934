/**
 * The V2vProcessing state (spec 1.2 step 4, spec 1.5, DESIGN.md section 6): injects virtio drivers
 * into a Windows guest's destination volumes in place with `virt-v2v-in-place` (virt-v2v 2.x), the
 * drivers coming from the virtio-win ISO (`VIRTIO_WIN`, default `/usr/share/virtio-win/virtio-win.iso`,
 * overridable when the preparer is constructed). The volumes are snapshotted first and rolled back when
 * the conversion fails or is cancelled.
 *
 * Command line (virt-v2v-in-place(1), virt-v2v(1)):
 * - one volume: `virt-v2v-in-place -i disk -if raw --root first --machine-readable <volume>`;
 * - several volumes (`-i disk` takes a single disk): `virt-v2v-in-place -i libvirtxml --root first
 *   --machine-readable <workDir>/input.xml`, the minimal libvirt XML of virt-v2v(1) "Minimal XML for -i
 *   libvirtxml option" listing every volume as a raw disk in manifest order.
 * Environment: exactly `PATH`, `HOME`, `LC_ALL=C`, `VIRTIO_WIN=<iso>`, `LIBGUESTFS_BACKEND=direct`,
 * `VIRT_V2V_TMPDIR=<workDir>` (a private directory under /var/tmp, removed afterwards), plus the
 * constructor's `env` (e.g. `LIBGUESTFS_BACKEND_SETTINGS=force_tcg` where KVM is unusable).
 *
 * Machine-readable output (virt-v2v(1) "Machine readable output"): stdout lines matching
 * `^[0-9]+/[0-9]+$` are progress, other stdout lines are status messages, stderr lines are errors.
 * virt-v2v 2.2 (Debian 12) also prints each message on stdout as one JSON object
 * `{"message": ..., "timestamp": ..., "type": "message"|"info"|"warning"|"error"}`: those are parsed,
 * and `error` ones are preferred over stderr for the failure's last lines.
 */
import { spawn } from 'node:child_process'
import { constants } from 'node:fs'
import { access, mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises'
import * as path from 'node:path'
import { XMLBuilder } from 'fast-xml-parser'
import { MigError } from '../errors.ts'
import type { VmManifest } from '../manifest.ts'

/** Default driver ISO (spec 1.5). */
export const DEFAULT_VIRTIO_WIN_ISO = '/usr/share/virtio-win/virtio-win.iso'
/** Default tool (spec 1.5). */
export const DEFAULT_V2V_BINARY = 'virt-v2v-in-place'

/** A destination volume to convert: `path` is a raw block device or raw image file. */
export interface V2vVolume {
  label: string
  path: string
}

/**
 * Snapshot of the destination volumes (for a zvol sink: `zfs snapshot` / `zfs rollback` /
 * `zfs destroy`). `take` runs before the tool; `rollback` then `release` after a failure or
 * cancellation; `release` alone after success.
 */
export interface V2vSnapshot {
  take(): Promise<void>
  rollback(): Promise<void>
  release(): Promise<void>
}

/** A progress report: `fraction` in 0..1 from a `N/M` line, or a status `message`. */
export interface V2vProgress {
  fraction: number | null
  message: string | null
}

/**
 * Options of {@link V2vPreparer.run}: `signal` cancels (the tool's process group is killed, the
 * snapshot rolled back, `E_MIG_CANCELLED`); `timeoutMs` (default 4 h) fails with `E_MIG_V2V_FAILED`;
 * `onProgress` receives progress and status lines.
 */
export interface V2vRunOptions {
  signal?: AbortSignal
  snapshot: V2vSnapshot
  onProgress?: (p: V2vProgress) => void
  timeoutMs?: number
}

/** The exact invocation: `argv[0]` is the binary; `inputXml` must be written to `inputXmlPath` first when not null. */
export interface V2vCommand {
  argv: string[]
  env: Record<string, string>
  inputXml: string | null
  inputXmlPath: string | null
}

/** What a successful run saw: the status messages (last 200) and the last progress fraction. */
export interface V2vResult {
  messages: string[]
  lastFraction: number | null
  warnings: string[]
}

/** Constructor options: ISO path, binary (name looked up on PATH, or a path), extra environment. */
export interface V2vPreparerOptions {
  virtioWinIso?: string
  binary?: string
  env?: Record<string, string>
}

const MAX_LINE = 2000
const KEEP_ERRORS = 20
const KILL_GRACE_MS = 5000

const xmlBuilder = new XMLBuilder({ ignoreAttributes: false, attributeNamePrefix: '@_', textNodeName: '#text', format: true, suppressEmptyNode: true, processEntities: true })

function v2vFail(msg: string, details?: Record<string, unknown>): never {
  throw new MigError('E_MIG_V2V_FAILED', msg, details ? { details } : {})
}

/** Runs `virt-v2v-in-place` over destination volumes with snapshot and rollback. */
export class V2vPreparer {
  readonly virtioWinIso: string
  readonly binary: string
  private readonly extraEnv: Record<string, string>

  constructor(opts: V2vPreparerOptions = {}) {
    this.virtioWinIso = opts.virtioWinIso ?? DEFAULT_VIRTIO_WIN_ISO
    this.binary = opts.binary ?? DEFAULT_V2V_BINARY
    this.extraEnv = { ...(opts.env ?? {}) }
  }

  /**
   * The exact command line and environment for `volumes` (manifest disk order) of `manifest`.
   * `workDir` holds the libvirt XML input (several volumes) and virt-v2v's temporary files.
   * Throws `E_MIG_V2V_FAILED` for no volume or a volume path that is not absolute.
   */
  command(volumes: V2vVolume[], manifest: VmManifest, workDir = '/var/tmp/mig-v2v'): V2vCommand {
    if (volumes.length === 0) v2vFail('V2V: no volume to convert')
    for (const v of volumes) {
      if (!v.path.startsWith('/') || /[\x00-\x1f]/.test(v.path)) v2vFail(`V2V: volume ${v.label}: not an absolute path`)
    }
    const env: Record<string, string> = {
      PATH: process.env.PATH || '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
      HOME: process.env.HOME || '/root',
      LC_ALL: 'C',
      VIRTIO_WIN: this.virtioWinIso,
      LIBGUESTFS_BACKEND: 'direct',
      VIRT_V2V_TMPDIR: workDir,
      ...this.extraEnv,
    }
    const common = ['--root', 'first', '--machine-readable']
    if (volumes.length === 1) {
      return { argv: [this.binary, '-i', 'disk', '-if', 'raw', ...common, volumes[0]!.path], env, inputXml: null, inputXmlPath: null }
    }
    const inputXmlPath = path.join(workDir, 'input.xml')
    return { argv: [this.binary, '-i', 'libvirtxml', ...common, inputXmlPath], env, inputXml: this.inputXml(volumes, manifest), inputXmlPath }
  }

  /** The minimal libvirt XML of virt-v2v(1) for `-i libvirtxml`: name, memory, vCPUs, firmware, raw disks. */
  inputXml(volumes: V2vVolume[], manifest: VmManifest): string {
    const name = manifest.name.replace(/[^A-Za-z0-9_.-]+/g, '_').replace(/^[._-]+/, '').slice(0, 63) || 'guest'
    const os: Record<string, unknown> = { type: { '@_arch': 'x86_64', '#text': 'hvm' } }
    if (manifest.firmware === 'efi') os.loader = { '@_readonly': 'yes', '@_type': 'pflash', '#text': '/usr/share/OVMF/OVMF_CODE_4M.fd' }
    const disks = volumes.map((v, i) => {
      const block = v.path.startsWith('/dev/')
      return {
        '@_type': block ? 'block' : 'file',
        '@_device': 'disk',
        driver: { '@_name': 'qemu', '@_type': 'raw' },
        source: block ? { '@_dev': v.path } : { '@_file': v.path },
        target: { '@_dev': `sd${String.fromCharCode(97 + (i % 26))}${i >= 26 ? Math.floor(i / 26) : ''}`, '@_bus': 'sata' },
      }
    })
    const domain = {
      '@_type': 'kvm',
      name,
      memory: { '@_unit': 'KiB', '#text': String(Math.max(1, Math.ceil((manifest.memory_bytes || 1 << 30) / 1024))) },
      vcpu: String(manifest.cpu.count),
      os,
      features: { acpi: '', apic: '' },
      devices: { disk: disks },
    }
    return String(xmlBuilder.build({ domain }))
  }

  /** Absolute path of the binary (PATH lookup in `env.PATH`), or null when missing / not executable. */
  private async resolveBinary(env: Record<string, string>): Promise<string | null> {
    const candidates = this.binary.includes('/') ? [this.binary] : (env.PATH ?? '').split(':').filter((d) => d.startsWith('/')).map((d) => path.join(d, this.binary))
    for (const c of candidates) {
      try {
        const st = await stat(c)
        if (!st.isFile()) continue
        await access(c, constants.X_OK)
        return c
      } catch {
        /* next */
      }
    }
    return null
  }

  /**
   * Checks the binary, the ISO and the volumes exist (else `E_MIG_V2V_FAILED` naming what is
   * missing, before anything is touched), takes the snapshot (failure: `E_MIG_V2V_FAILED`), runs the
   * tool in its own process group and parses its progress. Exit 0: the snapshot is released.
   * Otherwise the snapshot is rolled back (and released) and `E_MIG_V2V_FAILED` carries the tool's
   * last error lines (`details.last_lines`, `exit_code`, `rolled_back`); on `signal` the process
   * group is killed (SIGTERM, SIGKILL after 5 s), the snapshot rolled back, `E_MIG_CANCELLED`.
   */
  async run(volumes: V2vVolume[], manifest: VmManifest, opts: V2vRunOptions): Promise<V2vResult> {
    if (opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', 'V2V cancelled before it started')
    const probe = this.command(volumes, manifest)
    const bin = await this.resolveBinary(probe.env)
    if (!bin) v2vFail(`V2V: ${this.binary} not found or not executable (PATH=${probe.env.PATH})`, { missing: this.binary })
    try {
      const st = await stat(this.virtioWinIso)
      if (!st.isFile() && !st.isDirectory()) throw new Error('not a file')
      await access(this.virtioWinIso, constants.R_OK)
    } catch {
      v2vFail(`V2V: virtio-win driver ISO ${this.virtioWinIso} not found or not readable`, { missing: this.virtioWinIso })
    }
    for (const v of volumes) {
      try {
        await stat(v.path)
      } catch {
        v2vFail(`V2V: volume ${v.label} (${v.path}) not found`, { missing: v.path })
      }
    }

    await mkdir('/var/tmp', { recursive: true }).catch(() => undefined)
    const workDir = await mkdtemp(path.join('/var/tmp', 'mig-v2v-'))
    try {
      const cmd = this.command(volumes, manifest, workDir)
      if (cmd.inputXml !== null) await writeFile(cmd.inputXmlPath!, cmd.inputXml, { mode: 0o600 })
      try {
        await opts.snapshot.take()
      } catch (e) {
        v2vFail(`V2V: snapshot of the volumes before conversion failed: ${(e as Error).message}`)
      }
      let outcome: Awaited<ReturnType<typeof runTool>>
      try {
        outcome = await runTool(bin, cmd, opts)
      } catch (e) {
        outcome = { kind: 'failed', code: null, signal: null, lastLines: [`spawn failed: ${(e as Error).message}`], messages: [], lastFraction: null, warnings: [] }
      }
      if (outcome.kind === 'ok') {
        const warnings = [...outcome.warnings]
        await opts.snapshot.release().catch((e) => warnings.push(`snapshot release failed: ${(e as Error).message}`))
        return { messages: outcome.messages, lastFraction: outcome.lastFraction, warnings }
      }
      let rolledBack = true
      let rollbackError = ''
      try {
        await opts.snapshot.rollback()
      } catch (e) {
        rolledBack = false
        rollbackError = (e as Error).message
      }
      await opts.snapshot.release().catch(() => undefined)
      const rb = rolledBack ? 'volumes rolled back' : `ROLLBACK FAILED: ${rollbackError}`
      if (outcome.kind === 'cancelled') throw new MigError('E_MIG_CANCELLED', `V2V cancelled; ${rb}`, { details: { rolled_back: rolledBack } })
      const why = outcome.kind === 'timeout' ? 'timed out' : outcome.signal ? `killed by ${outcome.signal}` : `exited with status ${outcome.code}`
      throw new MigError('E_MIG_V2V_FAILED', `${this.binary} ${why}; ${rb}` + (outcome.lastLines.length ? `:\n${outcome.lastLines.join('\n')}` : ''), {
        details: { exit_code: outcome.code, signal: outcome.signal, last_lines: outcome.lastLines, rolled_back: rolledBack },
      })
    } finally {
      await rm(workDir, { recursive: true, force: true }).catch(() => undefined)
    }
  }
}

/** Splits a byte stream into lines (`\n` or `\r`), bounding each line to {@link MAX_LINE} characters. */
function lineSplitter(onLine: (line: string) => void): { push(chunk: Buffer): void; end(): void } {
  let buf = ''
  return {
    push(chunk) {
      buf += chunk.toString('utf8')
      const parts = buf.split(/\r\n|\r|\n/)
      buf = parts.pop() ?? ''
      if (buf.length > 64 * 1024) buf = buf.slice(-MAX_LINE)
      for (const p of parts) onLine(p.slice(0, MAX_LINE))
    },
    end() {
      if (buf !== '') onLine(buf.slice(0, MAX_LINE))
      buf = ''
    },
  }
}

type ToolOutcome =
  | { kind: 'ok' | 'failed' | 'timeout' | 'cancelled'; code: number | null; signal: string | null; lastLines: string[]; messages: string[]; lastFraction: number | null; warnings: string[] }

/** Spawns the tool in a new process group and waits for it, honouring abort and timeout. */
function runTool(bin: string, cmd: V2vCommand, opts: V2vRunOptions): Promise<ToolOutcome> {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, cmd.argv.slice(1), { env: cmd.env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] })
    const errors: string[] = []
    const messages: string[] = []
    let lastFraction: number | null = null
    let stopReason: 'timeout' | 'cancelled' | null = null
    let killTimer: NodeJS.Timeout | null = null

    const clean = (l: string) => l.replace(/\x1b\[[0-9;]*[A-Za-z]/g, '').replace(/[\x00-\x08\x0b-\x1f\x7f]/g, '').trimEnd()
    const jsonErrors: string[] = []
    const warnings: string[] = []
    let lastJsonText: string | null = null
    const status = (line: string) => {
      messages.push(line)
      if (messages.length > 200) messages.shift()
      opts.onProgress?.({ fraction: null, message: line })
    }
    const out = lineSplitter((raw) => {
      const line = clean(raw)
      if (line === '') return
      const m = /^([0-9]+)\/([0-9]+)$/.exec(line)
      if (m) {
        const den = Number(m[2])
        lastFraction = den > 0 ? Math.min(1, Number(m[1]) / den) : null
        opts.onProgress?.({ fraction: lastFraction, message: null })
        return
      }
      // virt-v2v >= 2.1 prints every message as one JSON object: {"message", "timestamp", "type"}.
      if (line.startsWith('{')) {
        let j: unknown
        try {
          j = JSON.parse(line)
        } catch {
          j = null
        }
        if (j && typeof j === 'object' && typeof (j as any).message === 'string') {
          const text = clean(String((j as any).message).replace(/\s*\n\s*/g, ' ')).slice(0, MAX_LINE)
          const type = String((j as any).type ?? 'message')
          lastJsonText = text
          if (type === 'error') {
            jsonErrors.push(text)
            if (jsonErrors.length > KEEP_ERRORS) jsonErrors.shift()
          } else if (type === 'warning') {
            warnings.push(text)
            if (warnings.length > 200) warnings.shift()
          }
          status(type === 'message' || type === 'info' ? text : `${type}: ${text}`)
          return
        }
      }
      // The same message again in human form ("[   1.0] Opening the source") right after its JSON form.
      const human = /^\[\s*[0-9.]+\] (.*)$/.exec(line)
      if (human && lastJsonText !== null && human[1] === lastJsonText) return
      status(line)
    })
    const err = lineSplitter((raw) => {
      const line = clean(raw)
      if (line === '') return
      errors.push(line)
      if (errors.length > KEEP_ERRORS) errors.shift()
    })
    child.stdout!.on('data', (c: Buffer) => out.push(c))
    child.stderr!.on('data', (c: Buffer) => err.push(c))

    const killGroup = (sig: NodeJS.Signals) => {
      if (child.pid === undefined) return
      try {
        process.kill(-child.pid, sig)
      } catch {
        /* group gone */
      }
    }
    const stop = (reason: 'timeout' | 'cancelled') => {
      if (stopReason) return
      stopReason = reason
      killGroup('SIGTERM')
      killTimer = setTimeout(() => killGroup('SIGKILL'), KILL_GRACE_MS)
    }
    const onAbort = () => stop('cancelled')
    opts.signal?.addEventListener('abort', onAbort, { once: true })
    const timer = setTimeout(() => stop('timeout'), opts.timeoutMs ?? 4 * 3600_000)

    child.on('error', (e) => {
      clearTimeout(timer)
      opts.signal?.removeEventListener('abort', onAbort)
      reject(e)
    })
    // The tool may leave helpers (qemu, nbdkit) in its group holding the pipes: once it exits, none survives.
    child.on('exit', () => killGroup('SIGKILL'))
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      if (killTimer) clearTimeout(killTimer)
      opts.signal?.removeEventListener('abort', onAbort)
      out.end()
      err.end()
      const stderrLines = errors.filter((l) => !/^If reporting bugs|^\s*\S+ -v -x \[\.\.\.\]$/.test(l))
      const lastLines = jsonErrors.length ? jsonErrors.slice(-KEEP_ERRORS) : stderrLines.length ? stderrLines.slice(-KEEP_ERRORS) : messages.slice(-KEEP_ERRORS)
      const kind = stopReason ?? (code === 0 ? 'ok' : 'failed')
      resolve({ kind, code, signal, lastLines, messages, lastFraction, warnings })
    })
  })
}
