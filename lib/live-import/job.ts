/**
 * A job's live import (plan `live_import`, docs/live-import.md) over the job's systems: the
 * source's readers, the sink's volumes, libvirt, the domain start the worker wires, and the job
 * record (the started guest, the wait for the source). lib/live-import/run.ts does the work.
 */
import * as path from 'node:path'
import type { Virsh } from '../domain/virsh.ts'
import type { DomainVolume } from '../domain/xml.ts'
import { MigError } from '../errors.ts'
import type { QemuUser } from '../host/qemu-access.ts'
import type { HardwareRecord, Job, LiveGuestOnCancel } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { StartCarried } from '../jobs/orchestrator-deps.ts'
import type { PreparedSource } from '../jobs/prepared-source.ts'
import type { SpaceWait } from '../pipeline/space-wait.ts'
import type { SinkVolume } from '../sink/types.ts'
import type { JobPatch } from '../store/jobs.ts'
import { runLiveImport } from './run.ts'

/** What the guest's start reports (the shape of the orchestrator's `StartOutcome`). */
export interface JobStartOutcome {
  domain: string
  hardware: HardwareRecord | null
  notice: string | null
  networkNotice?: string | null
}

/** The job's private directory of a live import (sockets, overlays): `<dataDir>/live/<jobId>`. */
export function liveImportDir(dataDir: string, jobId: string): string {
  return path.join(dataDir, 'live', jobId)
}

/** Input of {@link runJobLiveImport}. */
export interface JobLiveImportInput {
  job: Job
  source: Extract<PreparedSource, { strategy: 'offline' }>
  volumes: SinkVolume[]
  hooks: { progress(label: string, bytes: number): void; patch(extra: JobPatch): Promise<Job> }
  virsh: Virsh
  dataDir: string
  qemuUser: Promise<QemuUser>
  startDomain(job: Job, manifest: VmManifest, volumes: DomainVolume[], signal: AbortSignal, carried?: StartCarried): Promise<JobStartOutcome>
  /** What the source brought beside its disks (a live adapter's UEFI variable store), for the start. */
  carried?: StartCarried
  signal: AbortSignal
  logger: { info(fields: Record<string, unknown>, message: string): void }
  /** The cancel asked for this job: what to do with its running guest (null: none asked; read as `finish`). */
  cancelChoice(): Promise<LiveGuestOnCancel | null>
  /** The copy cap, bytes per second (0: none), shared by the disks' block jobs. */
  bytesPerSecond: number
  /** How a full destination is waited out (absent: a stopped block copy is started again at once). */
  spaceWait?: SpaceWait
}

/**
 * Runs (or resumes, when the job records a started guest) the live import of `input.job`.
 * Throws `E_MIG_INVALID_PLAN` naming `plan.live_import` for a source it cannot serve (a Windows
 * guest, a gzip-compressed or chunked OVF disk), else what lib/live-import/run.ts throws.
 */
export async function runJobLiveImport(input: JobLiveImportInput): Promise<JobStartOutcome> {
  const { job, source, volumes, hooks, logger } = input
  const manifest = source.manifest
  if ((job.plan.guest_os ?? manifest.guest_os.family) === 'windows')
    throw new MigError(
      'E_MIG_INVALID_PLAN',
      'plan.live_import: a Windows guest gets its virtio drivers by V2V on the copied disks before it starts; import it without live_import',
    )
  for (const d of manifest.disks) {
    const src = d.source
    if (src.compression === 'gzip' || src.layout === 'ovf_chunks')
      throw new MigError(
        'E_MIG_INVALID_PLAN',
        `plan.live_import: disk ${d.label} is ${src.compression === 'gzip' ? 'a gzip-compressed file' : 'a chunked OVF file'}, read only front to back (staged whole before any offset can be read); import it without live_import`,
      )
  }
  const started: JobStartOutcome | undefined =
    job.domain && job.hardware && (job.hardware as HardwareRecord).boot
      ? {
          domain: job.domain,
          hardware: job.hardware,
          notice: job.hardware.boot && !job.hardware.boot.verified ? `boot not verified: ${job.hardware.boot.evidence}` : null,
        }
      : undefined
  const qemu = await input.qemuUser.catch(() => null)
  const n = manifest.disks.length
  const outcome = await runLiveImport({
    virsh: input.virsh,
    dir: liveImportDir(input.dataDir, job.id),
    disks: manifest.disks.map((d, i) => ({
      label: d.label,
      capacity: d.capacity_bytes,
      volumePath: volumes[i]!.path,
      block: volumes[i]!.path.startsWith('/dev/'),
    })),
    openReader: (i) => source.openReader(manifest.disks[i]!),
    qemuGid: qemu?.gid ?? null,
    start: (overlays, sig) => input.startDomain(job, manifest, overlays, sig, input.carried),
    started,
    domainName: job.domain,
    onStarted: async (o) => {
      await hooks.patch({ domain: o.domain, hardware: (o.hardware as HardwareRecord | null) ?? undefined })
      logger.info({ domain: o.domain, notice: o.notice }, 'live import: the guest runs, its disks copy')
    },
    cancelChoice: async () => (await input.cancelChoice()) ?? 'finish',
    onFinishing: () => {
      const message = `cancel requested while the guest ${job.domain ?? ''} runs: its copy is being finished (live_guest "finish"); the job then completes with the guest running on its volumes; cancel with {"live_guest": "destroy"} to remove it and its writes instead`
      void hooks.patch({ last_error: { code: 'E_MIG_CANCELLED', message, fatal: false } }).catch(() => {})
    },
    onProgress: (i, bytes) => hooks.progress(manifest.disks[i]!.label, bytes),
    onWaiting: (message, on) => {
      const code = on === 'source' ? 'E_MIG_DISK_READ_FAILED' : on === 'space' ? 'E_MIG_DISK_WRITE_FAILED' : 'E_MIG_GUEST_BOOT_FAILED'
      void hooks.patch({ last_error: message ? { code, message, fatal: false } : null }).catch(() => {})
    },
    onGuestNotice: (message) => {
      void hooks.patch({ last_error: { code: 'E_MIG_GUEST_BOOT_FAILED', message, fatal: false } }).catch(() => {})
    },
    spaceWait: input.spaceWait,
    bytesPerSecond: input.bytesPerSecond > 0 ? Math.max(1, Math.floor(input.bytesPerSecond / n)) : null,
    signal: input.signal,
    log: (message, fields) => logger.info(fields ?? {}, message),
  })
  return {
    domain: outcome.domain,
    hardware: (outcome.hardware as HardwareRecord | null) ?? null,
    notice: outcome.notice,
    networkNotice: outcome.networkNotice ?? null,
  }
}
