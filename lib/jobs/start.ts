/**
 * Step: `Starting`. The volumes are flushed, the libvirt domain is defined on them and started
 * (lib/domain/start.ts: the guest inspected, its hardware chosen, its network identity carried),
 * and the boot check decides from evidence (lib/domain/boot-check.ts). A Linux guest with no
 * driver for any controller qemu emulates is converted in place first (lib/jobs/convert.ts).
 */
import { mkdir } from 'node:fs/promises'
import * as path from 'node:path'
import { defineAndStart } from '../domain/start.ts'
import type { Virsh } from '../domain/virsh.ts'
import { MigError } from '../errors.ts'
import type { Job } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { DomainVolume } from '../domain/xml.ts'
import type { SinkVolume } from '../sink/types.ts'
import type { ConvertInPlace } from './convert.ts'
import { bootCheckOf } from './destination.ts'
import type { StartCarried, StartOutcome } from './orchestrator-deps.ts'
import type { JobLogger, JobPaths, JobSettings } from './settings.ts'

/** What the start of job `jobId` needs: the settings, the logs directory, libvirt, the conversion, the name reservation, the logger. */
export interface StartInput {
  settings: Pick<JobSettings, 'domain'>
  paths: Pick<JobPaths, 'logs'>
  jobId: string
  virsh: Virsh
  convert: ConvertInPlace
  /** Reserves the job's name again against `taken` (the names libvirt has now): lib/jobs/reserve.ts `rename`. */
  rename(job: Job, manifest: VmManifest, taken: ReadonlySet<string>): Promise<string>
  logger: JobLogger
}

/** Defines and starts the job's domain on `volumes` (one per manifest disk, in order), as {@link domainStart} documents. */
export type StartDomain = (job: Job, manifest: VmManifest, volumes: DomainVolume[], signal: AbortSignal, carried?: StartCarried) => Promise<StartOutcome>

/**
 * The orchestrator's `start`: the sink's volumes flushed, then {@link domainStart} on them.
 */
export function startStep(
  startDomain: StartDomain,
): (job: Job, manifest: VmManifest, volumes: SinkVolume[], signal: AbortSignal, carried?: StartCarried) => Promise<StartOutcome> {
  return async (job, manifest, volumes, sig, carried) => {
    for (const v of volumes) await v.flush()
    return startDomain(
      job,
      manifest,
      manifest.disks.map((d, i) => ({ label: d.label, path: volumes[i]!.path })),
      sig,
      carried,
    )
  }
}

/**
 * The domain start of a job: the domain defined on `volumes` (the sink's volumes, or a live
 * import's overlays) named `job.domain` (the reserved name), its serial console logged to
 * `<data dir>/logs/<job id>.serial.log`, started unless the plan says `start: false`, and its boot
 * checked. `carried.nvram`: the source's UEFI variable store, the domain's NVRAM (lib/domain/start.ts). Throws what lib/domain/start.ts throws (`E_MIG_GUEST_BOOT_FAILED`, `E_MIG_V2V_FAILED`
 * ...); any other failure as `E_MIG_DOMAIN_DEFINE_FAILED`.
 */
export function domainStart(input: StartInput): StartDomain {
  const { settings, paths, jobId, virsh, convert, rename, logger } = input
  return async (job, manifest, volumes, sig, carried) => {
    const logDir = paths.logs
    await mkdir(logDir, { recursive: true, mode: 0o750 })
    const result = await defineAndStart({
      virsh,
      manifest,
      plan: {
        name: job.domain ?? job.plan.name,
        guest_os: job.plan.guest_os,
        firmware: job.plan.firmware,
        networks: job.plan.networks,
        start: job.plan.start,
        checks: job.plan.checks,
      },
      volumes,
      domainType: settings.domain.type,
      defaultBridge: settings.domain.defaultBridge,
      serialLogPath: path.join(logDir, `${jobId}.serial.log`),
      // A Linux guest with no driver for any controller qemu emulates is converted in place.
      convertGuest: (paths, convertSignal) =>
        convert(
          job.id,
          manifest,
          paths.map((p, i) => ({ label: manifest.disks[i]?.label ?? `disk${i}`, path: p })),
          false,
          convertSignal,
        ),
      bootCheck: bootCheckOf(settings),
      // A reserved name libvirt has by now (a job that ended defined it after this one's list):
      // reserved again against that list and every active job's reservation.
      rename: (taken) => rename(job, manifest, taken),
      signal: sig,
      nvram: carried?.nvram ?? undefined,
    }).catch((e: unknown) => {
      throw e instanceof MigError ? e : new MigError('E_MIG_DOMAIN_DEFINE_FAILED', (e as Error).message)
    })
    logger.info({ domain: result.name, started: result.started, hardware: result.hardware, inspection_s: result.inspection?.seconds }, 'domain defined')
    return { domain: result.name, hardware: result.hardware, notice: result.notice, networkNotice: result.networkNotice }
  }
}
