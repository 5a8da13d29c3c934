/**
 * Step: the guest converted in place by virt-v2v-in-place over the job's volumes (lib/v2v/),
 * the sink's snapshot taken first and rolled back on failure. Windows guests are converted in
 * `V2vProcessing` with the virtio-win ISO (the orchestrator's `v2v`); Linux guests without a
 * usable controller driver from the `Starting` state, without the ISO (lib/jobs/start.ts).
 * libguestfs runs on TCG where the domains do.
 */
import type { Job } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { Sink, SinkVolume } from '../sink/types.ts'
import { V2vPreparer, type V2vVolume } from '../v2v/preparer.ts'
import type { JobLogger, JobSettings } from './settings.ts'

/** What a conversion needs: the settings' virt-v2v binaries and domain type, the job's sink (its snapshot), the logger. */
export interface ConvertInput {
  settings: Pick<JobSettings, 'v2v' | 'domain'>
  sink: Sink
  logger: JobLogger
}

/** Converts the guest of job `jobId` on `disks` in place; `needsVirtioWin`: a Windows guest (the ISO is required). */
export type ConvertInPlace = (jobId: string, manifest: VmManifest, disks: V2vVolume[], needsVirtioWin: boolean, signal?: AbortSignal) => Promise<void>

/**
 * virt-v2v-in-place over a job's volumes (snapshot first, rolled back on failure); its progress
 * and warnings go to the log. Throws `E_MIG_V2V_FAILED` (lib/v2v/preparer.ts).
 */
export function convertInPlace(input: ConvertInput): ConvertInPlace {
  const { settings, sink, logger } = input
  return async (jobId, manifest, disks, needsVirtioWin, signal) => {
    const preparer = new V2vPreparer({
      virtioWinIso: settings.v2v.virtioWinIso,
      binary: settings.v2v.binary,
      env: settings.domain.type === 'qemu' ? { LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' } : {},
    })
    logger.info({ disks: disks.map((d) => d.label), needsVirtioWin }, 'V2V: converting the guest in place')
    const result = await preparer.run(disks, manifest, {
      signal,
      snapshot: sink.snapshot(jobId),
      needsVirtioWin,
      onProgress: (p) => p.message && logger.info({ v2v: p.message }, 'V2V'),
    })
    for (const w of result.warnings) logger.warn({ v2v: w }, 'V2V warning')
  }
}

/**
 * The orchestrator's `v2v` (`V2vProcessing`, Windows guests): the volumes flushed, then
 * converted in place with virtio-win.
 */
export function windowsConversion(convert: ConvertInPlace): (job: Job, manifest: VmManifest, volumes: SinkVolume[], signal: AbortSignal) => Promise<void> {
  return async (job, manifest, volumes, signal) => {
    for (const v of volumes) await v.flush()
    await convert(
      job.id,
      manifest,
      manifest.disks.map((d, i) => ({ label: d.label, path: volumes[i]!.path })),
      true,
      signal,
    )
  }
}
