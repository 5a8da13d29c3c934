/**
 * The `libvirt_remote` live source adapter (spec 1.1): a KVM host's libvirtd reached over SSH
 * (`qemu+ssh://`) or TLS (`qemu+tls://`, control plane only), as docs/libvirt-source.md describes.
 *
 * Control plane: `virsh -c <uri>` (lib/adapters/libvirt/transport.ts), several commands per call
 * where one connection can serve them. Data plane: libvirt pull-mode backups
 * (`virsh backup-begin`, https://libvirt.org/formatbackup.html) whose NBD export (a Unix socket on
 * the remote host) is forwarded over SSH and read with the NBD client; warm deltas from libvirt
 * checkpoints (https://libvirt.org/formatcheckpoint.html) and the incremental backup's
 * `qemu:dirty-bitmap:backup-<disk>` context.
 *
 * - A "snapshot" of the orchestrator is one backup job: `migrator-<job>-<n>` names the job's export
 *   socket and, for a warm job, the checkpoint it creates (incremental from the previous one).
 *   A domain holds one backup job at a time: a new snapshot ends the previous one.
 * - A shut-off domain is started paused (`virsh start --paused`; its vCPUs never run) for the
 *   backup, marked as such in its live metadata, and destroyed by `cleanup` (qemu must run for an
 *   NBD export of the domain's own disk view, backing chains included).
 * - `cleanup(vmId)` removes every `migrator-` checkpoint, ends a backup job whose socket is a
 *   migrator one, and destroys a domain the migrator started paused; a restarted worker calls it
 *   for what a dead one left.
 */
import { MigError, isMigError } from '../../errors.ts'
import { guestFamilyOf, type ManifestDisk, type ManifestNic, type VmManifest } from '../../manifest.ts'
import { sleep } from '../../retry.ts'
import type { DiskArea, DiskReader } from '../../contracts/disk-reader.ts'
import type { CarriedNvram, LiveSession, SnapshotRef, SourceAdapter, SourceConnection, VmSummary } from '../types.ts'
import { type DomainInfo, diskFormatOf, parseDomainXml, parseDomblkinfoAll, powerStateOf } from './domain.ts'
import { dirtyAreas, openExportReader, type ExportEndpoint } from './export-reader.ts'
import { classifyFailure, LibvirtTransport, type VirshOut } from './transport.ts'
import { parseLibvirtEndpoint } from './uri.ts'

/** Prefix of every checkpoint and backup socket the migrator creates; cleanup removes these. */
export const LIBVIRT_PREFIX = 'migrator-'
/** Metadata namespace of the migration mark (persistent config). */
export const MARK_URI = 'https://vm-migrator.invalid/libvirt-source/mark'
/** Metadata namespace of the "started paused by the migrator" marker (live state only). */
export const STARTED_URI = 'https://vm-migrator.invalid/libvirt-source/started-paused'
/** Directory on the remote host of the backup export sockets and scratch files (qemu creates them; libvirt removes them). */
export const REMOTE_SOCKET_DIR = '/var/lib/libvirt/qemu'

/**
 * The largest UEFI variable store carried, bytes: OVMF's are 128 KiB (2 MiB flash) and 528 KiB
 * (4 MiB flash); a larger file is not a variable store of an x86_64 guest.
 */
export const MAX_NVRAM_BYTES = 8 * 1024 * 1024

/** Tunables of the adapter, milliseconds. */
export interface LibvirtAdapterOptions {
  /** How long a guest shutdown may take before the domain is destroyed (default 300 000). */
  shutdownTimeoutMs?: number
  /** Domain state polling interval while it shuts down (default 1 000). */
  pollMs?: number
  /** Reconnections of a disk read whose connection was lost (default 3). */
  readAttempts?: number
  /** First pause between them (default 1 000, doubling). */
  readBackoffMs?: number
}

const VM_ID = /^[A-Za-z0-9_][A-Za-z0-9._+:@-]{0,199}$/
const SEP = '@@MIGRATOR-SEP@@'

function domArg(vmId: string): string {
  if (!VM_ID.test(vmId)) throw new MigError('E_MIG_VM_NOT_FOUND', `no domain ${JSON.stringify(vmId.slice(0, 140))} on this source (not a domain name or UUID)`)
  return vmId
}

/** XML attribute text. */
function xa(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&apos;')
}

/** A backup job the session runs on one domain. */
interface ActiveBackup {
  name: string
  remoteSocket: string
  /** The checkpoint this backup is incremental from, or null (full). */
  incremental: string | null
  /** Targets of the copied disks. */
  targets: string[]
  /** Each copied disk's format when the backup began (`<driver type>`). */
  formats: Map<string, string | null>
  forward: { socket: string; stop(): void; alive(): boolean } | null
  /** The forward being opened, when one is. */
  opening: Promise<string> | null
}

/** A connection of the libvirt_remote adapter; the whole {@link LiveSession}. */
export class LibvirtSession implements LiveSession {
  private readonly cbt = new Set<string>()
  private readonly active = new Map<string, ActiveBackup>()
  private readonly lastCheckpoint = new Map<string, string>()

  constructor(
    /** The transport (exposed for tests that cut its SSH forwards). */
    readonly t: LibvirtTransport,
    private readonly opts: Required<LibvirtAdapterOptions>,
  ) {}

  supportsWarm(): boolean {
    return true
  }

  /** Runs one virsh call; a failure is classified (`fallback` when no transport cause is seen). */
  private async call(args: string[], what: string, fallback: MigError['code'] = 'E_MIG_INTERNAL', timeoutMs?: number): Promise<string> {
    const r = await this.t.virsh(args, { timeoutMs })
    if (r.code === 0 && !r.timedOut) return r.stdout
    throw this.failure(r, what, fallback)
  }

  private failure(r: VirshOut, what: string, fallback: MigError['code']): MigError {
    if (/failed to get domain|Domain not found|no domain with matching/i.test(r.stderr))
      return new MigError(
        'E_MIG_VM_NOT_FOUND',
        `${this.t.label}: ${what}: no such domain (${r.stderr
          .trim()
          .split('\n')
          .pop()
          ?.replace(/^error:\s*/, '')})`,
      )
    return classifyFailure(this.t.label, r, fallback, what)
  }

  /** Runs several virsh commands on one connection; their outputs, in order (a failed command's is empty). */
  private async batch(cmds: string[][], what: string): Promise<{ outs: string[]; stderr: string }> {
    const line = cmds.map((c) => c.map((a) => (/^[A-Za-z0-9._:/@+=-]+$/.test(a) ? a : `'${a.replace(/'/g, '')}'`)).join(' ')).join(` ; echo ${SEP} ; `)
    const r = await this.t.virsh([`${line} ; echo ${SEP}`], { timeoutMs: 120_000 })
    if (r.timedOut || !r.stdout.includes(SEP)) throw classifyFailure(this.t.label, r, 'E_MIG_SOURCE_UNREACHABLE', what)
    const outs = r.stdout.split(SEP).slice(0, cmds.length)
    return { outs, stderr: r.stderr }
  }

  async describe(): Promise<{ product: string; version: string | null }> {
    const out = await this.call(['version', '--daemon'], 'connecting', 'E_MIG_SOURCE_UNREACHABLE')
    const daemon = /Running against daemon:\s*(\S+)/.exec(out)?.[1] ?? null
    const hv = /Running hypervisor:\s*(.+)/.exec(out)?.[1]?.trim() ?? 'unknown hypervisor'
    return { product: `libvirt ${daemon ?? '?'} (${hv}) at ${this.t.creds.endpoint.url}`, version: daemon }
  }

  /** dumpxml, domstate, domblkinfo --all and checkpoint names of `vmId` on one connection. */
  private async domain(
    vmId: string,
  ): Promise<{ info: DomainInfo; xml: string; state: string; blk: ReturnType<typeof parseDomblkinfoAll>; checkpoints: string[] }> {
    const d = domArg(vmId)
    const { outs, stderr } = await this.batch(
      [
        ['dumpxml', '--domain', d],
        ['domstate', '--domain', d],
        ['domblkinfo', '--domain', d, '--all'],
        ['checkpoint-list', '--domain', d, '--name', '--topological'],
      ],
      `inspecting ${vmId}`,
    )
    if (!outs[0]?.trim()) {
      if (/failed to get domain|Domain not found/i.test(stderr)) throw new MigError('E_MIG_VM_NOT_FOUND', `${this.t.label}: no domain ${vmId} on this host`)
      throw classifyFailure(this.t.label, { code: 1, stdout: '', stderr, timedOut: false }, 'E_MIG_INTERNAL', `reading the description of ${vmId}`)
    }
    const info = parseDomainXml(outs[0], `${this.t.label} domain ${vmId}`)
    return {
      info,
      xml: outs[0],
      state: (outs[1] ?? '').trim(),
      blk: parseDomblkinfoAll(outs[2] ?? ''),
      checkpoints: (outs[3] ?? '')
        .split('\n')
        .map((l) => l.trim())
        .filter(Boolean),
    }
  }

  async listVms(): Promise<VmSummary[]> {
    const uuids = (await this.call(['list', '--all', '--uuid'], 'listing domains', 'E_MIG_SOURCE_UNREACHABLE'))
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => /^[0-9a-f-]{36}$/i.test(l))
    if (uuids.length === 0) return []
    const cmds = uuids.flatMap((u) => [
      ['dumpxml', '--domain', u],
      ['domstate', '--domain', u],
      ['domblkinfo', '--domain', u, '--all'],
    ])
    const { outs } = await this.batch(cmds, 'listing domains')
    const items: VmSummary[] = []
    for (let i = 0; i < uuids.length; i++) {
      const xml = outs[i * 3]?.trim()
      if (!xml) continue // undefined between the two calls
      const info = parseDomainXml(xml, `${this.t.label} domain ${uuids[i]}`)
      const blk = parseDomblkinfoAll(outs[i * 3 + 2] ?? '')
      items.push({
        vm_id: info.uuid || uuids[i],
        name: info.name,
        power_state: powerStateOf(outs[i * 3 + 1] ?? ''),
        guest_id: osinfoId(xml),
        cpu_count: info.vcpus,
        memory_bytes: info.memoryBytes,
        firmware: info.firmware,
        disks: info.disks.map((d) => ({
          label: d.target,
          format: d.format,
          capacity_bytes: blk.get(d.target)?.capacity ?? null,
          allocated_bytes: blk.get(d.target)?.allocation ?? null,
          bus: d.rawBus,
          path: d.source,
        })),
        nics: info.nics.map((n) => ({ mac: n.mac, model: n.model, network: n.network })),
      })
    }
    return items.sort((a, b) => a.name.localeCompare(b.name) || a.vm_id.localeCompare(b.vm_id))
  }

  async inspect(vmId: string): Promise<VmManifest> {
    const { info, xml, blk } = await this.domain(vmId)
    return manifestOf(info, xml, blk)
  }

  async enableCbt(vmId: string): Promise<void> {
    const { info } = await this.domain(vmId)
    const bad = info.disks.filter((d) => d.format !== 'qcow2')
    if (bad.length > 0)
      throw new MigError(
        'E_MIG_CBT_UNSUPPORTED',
        `domain ${info.name}: ${bad.map((d) => `${d.target} is ${d.format ?? 'of unknown format'}`).join(', ')}: libvirt checkpoints need qcow2 disks; migrate it cold`,
      )
    this.cbt.add(vmId)
  }

  /** The forward of backup `b`, opened again when it is down. */
  private async socketOf(b: ActiveBackup): Promise<string> {
    // one forward at a time: concurrent reads that lost it wait for the same new one
    b.opening ??= (async () => {
      if (!b.forward?.alive()) {
        b.forward?.stop()
        b.forward = await this.t.forward(b.remoteSocket, b.name)
      }
      return b.forward.socket
    })().finally(() => {
      b.opening = null
    })
    return b.opening
  }

  /** Ends this session's backup job on `vmId` (its forward, then the libvirt job). */
  private async endBackup(vmId: string): Promise<void> {
    const b = this.active.get(vmId)
    if (!b) return
    this.active.delete(vmId)
    b.forward?.stop()
    await this.t.virsh(['domjobabort', '--domain', domArg(vmId)]).catch(() => null)
  }

  /** Starts a shut-off domain paused and marks it (live metadata) as started by the migrator. */
  private async startPaused(vmId: string, job: string): Promise<void> {
    await this.call(['start', '--paused', '--domain', domArg(vmId)], `starting ${vmId} paused for its backup`, 'E_MIG_SNAPSHOT_FAILED', 180_000)
    await this.call(
      ['metadata', '--domain', domArg(vmId), '--uri', STARTED_URI, '--key', 'migrator', '--live', '--set', `<started job="${xa(job)}"/>`],
      `marking ${vmId} as started paused`,
      'E_MIG_SNAPSHOT_FAILED',
    )
  }

  private async startedByUs(vmId: string): Promise<boolean> {
    const r = await this.t.virsh(['metadata', '--domain', domArg(vmId), '--uri', STARTED_URI, '--live'])
    return r.code === 0 && r.stdout.includes('<started')
  }

  async createSnapshot(vmId: string, name: string): Promise<SnapshotRef> {
    if (!/^[A-Za-z0-9._-]{1,100}$/.test(name) || !name.startsWith(LIBVIRT_PREFIX))
      throw new MigError('E_MIG_SNAPSHOT_FAILED', `snapshot name ${JSON.stringify(name)}: must be ${LIBVIRT_PREFIX}<job>-<n> ([A-Za-z0-9._-])`)
    await this.endBackup(vmId)
    const { info, state, checkpoints } = await this.domain(vmId)
    if (info.disks.length === 0) throw new MigError('E_MIG_SNAPSHOT_FAILED', `domain ${info.name} has no disk to back up`)
    const job = name.replace(/-\d+$/, '')
    if (state === 'shut off' || state === 'crashed') await this.startPaused(vmId, job)
    else if (state !== 'running' && state !== 'paused' && state !== 'idle' && state !== 'blocked')
      throw new MigError('E_MIG_SNAPSHOT_FAILED', `domain ${info.name} is ${state}: a backup needs it running, paused or shut off`)
    const warm = this.cbt.has(vmId)
    let incremental: string | null = null
    if (warm) {
      const last = this.lastCheckpoint.get(vmId) ?? [...checkpoints].reverse().find((c) => c.startsWith(`${job}-`)) ?? null
      incremental = last && checkpoints.includes(last) ? last : null
    }
    const remoteSocket = `${REMOTE_SOCKET_DIR}/${name}.sock`
    const copied = new Set(info.disks.map((d) => d.target))
    const allTargets = [...info.xmlDiskTargets]
    const backupXml = [
      "<domainbackup mode='pull'>",
      incremental ? `  <incremental>${xa(incremental)}</incremental>` : '',
      `  <server transport='unix' socket='${xa(remoteSocket)}'/>`,
      '  <disks>',
      // a pull backup needs a scratch file per disk (the old blocks of guest writes during the
      // backup); libvirt removes it when the job ends
      ...allTargets.map((t) =>
        copied.has(t)
          ? `    <disk name='${xa(t)}' backup='yes' type='file'><scratch file='${xa(`${REMOTE_SOCKET_DIR}/${name}-${t}.scratch`)}'/></disk>`
          : `    <disk name='${xa(t)}' backup='no'/>`,
      ),
      '  </disks>',
      '</domainbackup>',
    ]
      .filter(Boolean)
      .join('\n')
    const args = ['backup-begin', '--domain', domArg(vmId), '--backupxml', this.t.writeFile(`${name}.backup.xml`, backupXml)]
    if (warm) {
      const ck = [
        '<domaincheckpoint>',
        `  <name>${xa(name)}</name>`,
        '  <description>taken by the VM migrator; removed when the migration ends</description>',
        '  <disks>',
        ...allTargets.map((t) => `    <disk name='${xa(t)}' checkpoint='${copied.has(t) ? 'bitmap' : 'no'}'/>`),
        '  </disks>',
        '</domaincheckpoint>',
      ].join('\n')
      args.push('--checkpointxml', this.t.writeFile(`${name}.checkpoint.xml`, ck))
    }
    await this.call(args, `backup ${name} of ${info.name}`, 'E_MIG_SNAPSHOT_FAILED', 120_000)
    const b: ActiveBackup = {
      name,
      remoteSocket,
      incremental,
      targets: [...copied],
      formats: new Map(info.disks.map((d) => [d.target, d.format])),
      forward: null,
      opening: null,
    }
    this.active.set(vmId, b)
    if (warm) this.lastCheckpoint.set(vmId, name)
    try {
      await this.socketOf(b)
    } catch (e) {
      await this.endBackup(vmId)
      throw e
    }
    const change_ids: Record<string, string> = {}
    if (warm) for (const t of copied) change_ids[t] = name
    return { id: name, change_ids }
  }

  private backupOf(vmId: string, snapshot: SnapshotRef, disk: ManifestDisk): ActiveBackup {
    const b = this.active.get(vmId)
    if (!b || b.name !== snapshot.id)
      throw new MigError(
        'E_MIG_DISK_READ_FAILED',
        `${disk.label}: backup ${snapshot.id} of ${vmId} is not running on this connection (ended or taken by another)`,
      )
    if (!b.targets.includes(disk.label)) throw new MigError('E_MIG_DISK_READ_FAILED', `${disk.label}: not a disk of backup ${snapshot.id}`)
    const now = diskFormatOf(b.formats.get(disk.label) ?? null) ?? 'raw'
    if (now !== disk.disk_format)
      throw new MigError(
        'E_MIG_DISK_READ_FAILED',
        `${disk.label}: the disk is ${now} on the source now, ${disk.disk_format} at inspection: it was converted or replaced; inspect the VM again and submit a new plan`,
        { details: { disk: disk.label } },
      )
    return b
  }

  private exportOf(b: ActiveBackup, disk: ManifestDisk): ExportEndpoint {
    return { socket: () => this.socketOf(b), exportName: disk.label, label: `${this.t.label} disk ${disk.label}` }
  }

  async openDisk(vmId: string, snapshot: SnapshotRef, disk: ManifestDisk): Promise<DiskReader> {
    const b = this.backupOf(vmId, snapshot, disk)
    try {
      return await openExportReader(this.exportOf(b, disk), disk.capacity_bytes, { attempts: this.opts.readAttempts, backoffMs: this.opts.readBackoffMs })
    } catch (e) {
      if (isMigError(e)) throw e
      throw new MigError('E_MIG_DISK_READ_FAILED', `${disk.label}: ${(e as Error).message}`, { cause: e })
    }
  }

  async changedAreas(vmId: string, snapshot: SnapshotRef, disk: ManifestDisk, sinceChangeId: string): Promise<DiskArea[]> {
    if (sinceChangeId === '*') return [{ offset: 0, length: disk.capacity_bytes }]
    const b = this.backupOf(vmId, snapshot, disk)
    if (b.incremental !== sinceChangeId)
      throw new MigError(
        'E_MIG_CBT_RESET',
        `${disk.label}: backup ${b.name} is ${b.incremental ? `incremental from ${b.incremental}` : 'a full backup'}, not from checkpoint ${sinceChangeId}`,
      )
    return dirtyAreas(this.exportOf(b, disk), `backup-${disk.label}`)
  }

  async removeSnapshot(vmId: string, snapshot: SnapshotRef): Promise<void> {
    if (this.active.get(vmId)?.name === snapshot.id) await this.endBackup(vmId)
    if (Object.keys(snapshot.change_ids).length === 0) return
    // The checkpoint of an earlier pass: the next one's bitmaps are merged by libvirt.
    const r = await this.t.virsh(['checkpoint-delete', '--domain', domArg(vmId), '--checkpointname', snapshot.id])
    if (r.code !== 0 && !/not found|no domain checkpoint/i.test(r.stderr)) {
      if (/inactive domain/i.test(r.stderr)) return // cleanup removes it with the domain started paused
      throw this.failure(r, `removing checkpoint ${snapshot.id}`, 'E_MIG_SNAPSHOT_FAILED')
    }
    if (this.lastCheckpoint.get(vmId) === snapshot.id) this.lastCheckpoint.delete(vmId)
  }

  async shutdown(vmId: string): Promise<boolean> {
    await this.endBackup(vmId)
    const d = domArg(vmId)
    const state = async () => (await this.call(['domstate', '--domain', d], `reading the state of ${vmId}`, 'E_MIG_SOURCE_UNREACHABLE')).trim()
    const s = await state()
    if (s === 'shut off' || s === 'crashed') return false
    if (await this.startedByUs(vmId)) {
      await this.call(['destroy', '--domain', d], `stopping ${vmId} (started paused by the migrator)`, 'E_MIG_INTERNAL')
      return false
    }
    if (s === 'running' || s === 'idle' || s === 'blocked') {
      await this.t.virsh(['shutdown', '--domain', d])
      const deadline = Date.now() + this.opts.shutdownTimeoutMs
      while (Date.now() < deadline) {
        if ((await state()) === 'shut off') return true
        await sleep(this.opts.pollMs)
      }
    }
    if ((await state()) === 'shut off') return true
    const r = await this.t.virsh(['destroy', '--domain', d])
    if (r.code !== 0 && (await state()) !== 'shut off') throw this.failure(r, `powering ${vmId} off`, 'E_MIG_INTERNAL')
    return true
  }

  async powerOn(vmId: string): Promise<void> {
    await this.endBackup(vmId)
    const d = domArg(vmId)
    const s = (await this.call(['domstate', '--domain', d], `reading the state of ${vmId}`, 'E_MIG_SOURCE_UNREACHABLE')).trim()
    if (s !== 'shut off' && s !== 'crashed') {
      if (!(await this.startedByUs(vmId))) return
      await this.call(['destroy', '--domain', d], `stopping ${vmId} (started paused by the migrator)`, 'E_MIG_INTERNAL')
    }
    await this.call(['start', '--domain', d], `powering ${vmId} on`, 'E_MIG_INTERNAL', 180_000)
  }

  async mark(vmId: string, note: string): Promise<void> {
    const text = `${note.replace(/[\r\n]+/g, ' ').slice(0, 500)}; ${new Date().toISOString()}`
    const d = domArg(vmId)
    const r = await this.t.virsh(['metadata', '--domain', d, '--uri', MARK_URI, '--key', 'migrator', '--config', '--set', `<migration note="${xa(text)}"/>`])
    if (r.code !== 0) throw this.failure(r, `setting the migration mark on ${vmId}`, 'E_MIG_INTERNAL')
  }

  async cleanup(vmId: string): Promise<void> {
    try {
      await this.endBackup(vmId)
      const d = domArg(vmId)
      // a backup job a dead worker left: its export socket names it
      const dump = await this.t.virsh(['backup-dumpxml', '--domain', d])
      if (dump.code === 0 && dump.stdout.includes(`${REMOTE_SOCKET_DIR}/${LIBVIRT_PREFIX}`)) await this.t.virsh(['domjobabort', '--domain', d])
      const { state, checkpoints } = await this.domain(vmId)
      const ours = checkpoints.filter((c) => c.startsWith(LIBVIRT_PREFIX))
      let started = await this.startedByUs(vmId).catch(() => false)
      if (ours.length > 0 && (state === 'shut off' || state === 'crashed')) {
        // libvirt deletes checkpoints (their qcow2 bitmaps) of running domains only
        await this.startPaused(vmId, 'cleanup')
        started = true
      }
      for (const c of ours.reverse()) {
        const r = await this.t.virsh(['checkpoint-delete', '--domain', d, '--checkpointname', c])
        if (r.code !== 0 && /inactive domain/i.test(r.stderr)) await this.t.virsh(['checkpoint-delete', '--domain', d, '--checkpointname', c, '--metadata'])
      }
      this.lastCheckpoint.delete(vmId)
      if (started) await this.t.virsh(['destroy', '--domain', d])
    } catch {
      // never throws: the job's own outcome is what matters
    }
  }

  /**
   * The domain's UEFI variable store (`<os><nvram>`), read from the host over SSH (at most
   * {@link MAX_NVRAM_BYTES}); null for a BIOS domain or one that names none. Called with the
   * domain stopped (a cold job before its copy, a warm one at the cutover), so the store is the
   * one the guest last wrote.
   */
  async readNvram(vmId: string): Promise<CarriedNvram | null> {
    const { info } = await this.domain(vmId)
    if (info.firmware !== 'efi' || !info.nvram) return null
    const bytes = await this.t.readRemoteFile(info.nvram, MAX_NVRAM_BYTES, `the UEFI variable store (<nvram>) of domain ${info.name}`)
    return { source_path: info.nvram, bytes }
  }

  async close(): Promise<void> {
    for (const vmId of [...this.active.keys()]) await this.endBackup(vmId).catch(() => {})
    this.t.close()
  }
}

/** The libosinfo OS id of a domain (`<libosinfo:os id>` that virt-install writes), or null. */
function osinfoId(xml: string): string | null {
  return /<libosinfo:os\s+id=["']([^"']{1,200})["']/.exec(xml)?.[1] ?? null
}

/**
 * The manifest of a domain: its disks by target (capacity and allocation from `domblkinfo`), its
 * NICs with their MACs, firmware, and warnings saying what does not travel or changes.
 */
export function manifestOf(info: DomainInfo, xml: string, blk: ReturnType<typeof parseDomblkinfoAll>): VmManifest {
  const warnings = [...info.skipped]
  const disks: ManifestDisk[] = []
  for (const d of info.disks) {
    const size = blk.get(d.target)
    const fmt = diskFormatOf(d.format)
    if (!fmt) warnings.push(`${d.target}: format ${d.format ?? 'unknown'} is read through the backup export as raw bytes`)
    if (d.format !== 'qcow2') warnings.push(`${d.target} is ${d.format ?? 'of unknown format'}: libvirt checkpoints need qcow2, so this VM migrates cold only`)
    if (d.hasBacking) warnings.push(`${d.target}: its backing chain is read flattened (the guest's view) into one destination volume`)
    disks.push({
      label: d.target,
      capacity_bytes: size?.capacity ?? 0,
      ...(size?.allocation != null ? { allocated_bytes: size.allocation } : {}),
      disk_format: fmt ?? 'raw',
      source: { path: d.source ?? '' },
      controller: d.bus,
      address: `${d.rawBus || 'unknown'}:${d.target}`,
    })
  }
  const nics: ManifestNic[] = info.nics.map((n, i) => ({ label: `net${i}`, mac: n.mac, model: n.model, network: n.network }))
  if (info.firmware === 'efi' && !info.nvram)
    warnings.push('UEFI guest without a variable store file (<nvram>) on the source: the destination starts with a fresh one')
  if (info.arch && info.arch !== 'x86_64') warnings.push(`architecture ${info.arch}: the destination is x86_64`)
  const id = osinfoId(xml)
  const family = guestFamilyOf(id ?? info.description)
  const cores = Math.trunc(Number(/<topology[^>]*\scores=["'](\d+)["']/.exec(xml)?.[1] ?? 1)) || 1
  return {
    name: info.name,
    source_format: 'libvirt_remote',
    guest_os: { family, id },
    firmware: info.firmware,
    secure_boot: info.secureBoot,
    cpu: { count: Math.max(1, info.vcpus), cores_per_socket: Math.min(cores, Math.max(1, info.vcpus)) },
    memory_bytes: info.memoryBytes,
    disks,
    nics,
    cbt_available: disks.length > 0 && info.disks.every((d) => d.format === 'qcow2'),
    warnings,
  }
}

/**
 * Makes a `libvirt_remote` adapter. `connect`: validates the endpoint (`E_MIG_BAD_REQUEST`),
 * writes the connection's private files, and asks libvirtd its version:
 * `E_MIG_SOURCE_UNREACHABLE` (refused, DNS, timeout), `E_MIG_AUTH_FAILED` (key refused, host key
 * mismatch with `details.reason` `host_key_mismatch`, TLS rejected).
 * `conn.password` is the opened private key; `conn.tls.known_hosts` the pinned host keys.
 */
export function createLibvirtAdapter(options: LibvirtAdapterOptions = {}): SourceAdapter {
  const opts: Required<LibvirtAdapterOptions> = {
    shutdownTimeoutMs: options.shutdownTimeoutMs ?? 300_000,
    pollMs: options.pollMs ?? 1000,
    readAttempts: options.readAttempts ?? 3,
    readBackoffMs: options.readBackoffMs ?? 1000,
  }
  return {
    kind: 'libvirt_remote',
    supportsWarm: () => true,
    async connect(conn: SourceConnection): Promise<LibvirtSession> {
      const endpoint = parseLibvirtEndpoint(conn.endpoint)
      const user = endpoint.user ?? conn.username
      const t = new LibvirtTransport({
        endpoint,
        user,
        privateKey: conn.password,
        knownHosts: conn.tls?.known_hosts,
        insecure: conn.tls?.insecure === true,
        caPem: conn.tls?.ca_pem,
        clientCertPem: conn.tls?.client_cert_pem,
      })
      const s = new LibvirtSession(t, conn.guestShutdownTimeoutMs === undefined ? opts : { ...opts, shutdownTimeoutMs: conn.guestShutdownTimeoutMs })
      try {
        await s.describe()
      } catch (e) {
        t.close()
        throw e
      }
      return s
    },
  }
}
