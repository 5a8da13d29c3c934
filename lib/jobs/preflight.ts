/**
 * Step: the checks run before any destination volume is created (lib/host/precopy.ts: room
 * for the disks on the sink, counted against what the other jobs of this host still have to
 * write; qemu's access to the volumes; the bridges the domain will use). A refusal fails the
 * job with its `E_MIG_*` code before anything is written.
 */
import { run } from '../host/doctor.ts'
import { allocatedBelow, checkBeforeCopy } from '../host/precopy.ts'
import type { QemuUser } from '../host/qemu-access.ts'
import type { Job } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { Plan } from '../plan.ts'
import { FileSink } from '../sink/file.ts'
import type { Sink } from '../sink/types.ts'
import { ZvolSink } from '../sink/zvol.ts'
import type { JobsRepo } from '../store/jobs.ts'
import type { JobPaths, JobSettings } from './settings.ts'

/**
 * The bridges the domain of `manifest` will use: for each NIC, the `plan.networks` bridge its
 * network maps to, else `defaultBridge` (none: user-mode networking), with where each comes from.
 */
export function bridgesInUse(manifest: VmManifest, networks: Plan['networks'], defaultBridge: string | null): Array<{ name: string; from: string }> {
  const out = new Map<string, string>()
  for (const nic of manifest.nics) {
    const i = (networks ?? []).findIndex((m) => m.source === nic.network)
    if (i >= 0) out.set(networks![i].bridge, `plan.networks[${i}].bridge`)
    else if (defaultBridge) out.set(defaultBridge, 'MIGRATOR_DEFAULT_BRIDGE')
  }
  return [...out].map(([name, from]) => ({ name, from }))
}

/**
 * What the pre-copy checks of job `jobId` need: its sink and pool (the plan's, else the
 * settings'), the job table, and the user qemu runs as (read while the job inspects its source;
 * an unreadable qemu.conf fails the checks, which await it).
 */
export interface PreflightInput {
  settings: Pick<JobSettings, 'zfsPool' | 'domain'>
  qemuUser: Promise<QemuUser>
  paths: Pick<JobPaths, 'volumes'>
  jobId: string
  sink: Sink
  pool?: string
  jobs: Pick<JobsRepo, 'reserveSpace'>
}

/** What another job of this host still has to write on its reservation of `reserved` bytes: less what its volumes hold. */
async function remainingOf(sink: Sink, other: string, reserved: number): Promise<number> {
  if (sink instanceof FileSink) return reserved - allocatedBelow(sink.jobDir(other))
  if (sink instanceof ZvolSink) {
    const used = await run('zfs', ['list', '-H', '-p', '-o', 'used', sink.jobDataset(other)])
    return reserved - (used.code === 0 && /^\d+$/.test(used.stdout.trim()) ? Number(used.stdout.trim()) : 0)
  }
  return reserved
}

/**
 * The pre-copy checks of one job (the orchestrator's `preflight`). The checks throw `E_MIG_DISK_WRITE_FAILED` (no room) or
 * `E_MIG_DOMAIN_DEFINE_FAILED` (qemu cannot reach the volumes, a missing bridge), as
 * lib/host/precopy.ts documents.
 */
export function precopyChecks(input: PreflightInput): (job: Job, manifest: VmManifest) => Promise<void> {
  const { settings, paths, jobId, sink, pool, jobs, qemuUser } = input
  return async (job, manifest) => {
    await checkBeforeCopy({
      disks: manifest.disks,
      file: sink instanceof FileSink ? { volumesDir: paths.volumes, jobDir: sink.jobDir(jobId) } : undefined,
      zvol: sink instanceof ZvolSink ? { pool: pool ?? settings.zfsPool, jobDataset: sink.jobDataset(jobId) } : undefined,
      qemu: await qemuUser,
      bridges: bridgesInUse(manifest, job.plan.networks, settings.domain.defaultBridge),
      reserve: (key, bytes, check) => jobs.reserveSpace(jobId, key, bytes, (other, reserved) => remainingOf(sink, other, reserved), check),
    })
  }
}
