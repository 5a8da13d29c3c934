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
 * and `error` ones are preferred over stderr for the failure's last lines. The process handling and
 * output parsing live in `tool.ts` (shared with the VMCX full import, `full-import.ts`).
 */
import { constants } from 'node:fs'
import { access, mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises'
import * as path from 'node:path'
import { serializeDomainXml } from '../domain/xml.ts'
import { MigError } from '../errors.ts'
import type { VmManifest } from '../manifest.ts'
import { targetDevName } from '../domain/xml.ts'
import { describeFailure, resolveBinary, runV2vTool, v2vOutputName, type ToolOutcome, type V2vProgress } from './tool.ts'

export type { V2vProgress } from './tool.ts'

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
  /** Whether the virtio-win ISO must exist (default true: Windows guests; a Linux conversion needs none). */
  needsVirtioWin?: boolean
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
    const name = v2vOutputName(manifest.name)
    const os: Record<string, unknown> = { type: { '@_arch': 'x86_64', '#text': 'hvm' } }
    if (manifest.firmware === 'efi') os.loader = { '@_readonly': 'yes', '@_type': 'pflash', '#text': '/usr/share/OVMF/OVMF_CODE_4M.fd' }
    const disks = volumes.map((v, i) => {
      const block = v.path.startsWith('/dev/')
      return {
        '@_type': block ? 'block' : 'file',
        '@_device': 'disk',
        driver: { '@_name': 'qemu', '@_type': 'raw' },
        source: block ? { '@_dev': v.path } : { '@_file': v.path },
        target: { '@_dev': targetDevName('sd', i), '@_bus': 'sata' },
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
    return serializeDomainXml(domain)
  }

  /**
   * Checks the binary, the ISO (unless `needsVirtioWin` is false) and the volumes exist (else `E_MIG_V2V_FAILED` naming what is
   * missing, before anything is touched), takes the snapshot (failure: `E_MIG_V2V_FAILED`), runs the
   * tool in its own process group and parses its progress. Exit 0: the snapshot is released.
   * Otherwise the snapshot is rolled back (and released) and `E_MIG_V2V_FAILED` carries the tool's
   * last error lines (`details.last_lines`, `exit_code`, `rolled_back`); on `signal` the process
   * group is killed (SIGTERM, SIGKILL after 5 s), the snapshot rolled back, `E_MIG_CANCELLED`.
   */
  async run(volumes: V2vVolume[], manifest: VmManifest, opts: V2vRunOptions): Promise<V2vResult> {
    if (opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', 'V2V cancelled before it started')
    const probe = this.command(volumes, manifest)
    const bin = await resolveBinary(this.binary, probe.env.PATH ?? '')
    if (!bin) v2vFail(`V2V: ${this.binary} not found or not executable (PATH=${probe.env.PATH})`, { missing: this.binary })
    if (opts.needsVirtioWin !== false) {
      try {
        const st = await stat(this.virtioWinIso)
        if (!st.isFile() && !st.isDirectory()) throw new Error('not a file')
        await access(this.virtioWinIso, constants.R_OK)
      } catch {
        v2vFail(`V2V: virtio-win driver ISO ${this.virtioWinIso} not found or not readable`, { missing: this.virtioWinIso })
      }
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
      let outcome: ToolOutcome
      try {
        outcome = await runV2vTool(bin, cmd.argv.slice(1), cmd.env, {
          signal: opts.signal,
          timeoutMs: opts.timeoutMs ?? 4 * 3600_000,
          onProgress: opts.onProgress,
        })
      } catch (e) {
        outcome = {
          kind: 'failed',
          code: null,
          signal: null,
          lastLines: [`spawn failed: ${(e as Error).message}`],
          messages: [],
          lastFraction: null,
          warnings: [],
        }
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
      const why = describeFailure(outcome)
      throw new MigError('E_MIG_V2V_FAILED', `${this.binary} ${why}; ${rb}` + (outcome.lastLines.length ? `:\n${outcome.lastLines.join('\n')}` : ''), {
        details: { exit_code: outcome.code, signal: outcome.signal, last_lines: outcome.lastLines, rolled_back: rolledBack },
      })
    } finally {
      await rm(workDir, { recursive: true, force: true }).catch(() => undefined)
    }
  }
}
