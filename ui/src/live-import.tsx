/**
 * The live-import line of a job's page (plan `live_import`, docs/live-import.md): while the job
 * copies, whether the guest already runs on this host (its boot verdict and the time to it) or is
 * being prepared.
 */
import type { Job } from '../../lib/job.ts'

/** Says what a live import is doing; nothing for other jobs or once the job ended. */
export function LiveImportLine({ job }: { job: Job }) {
  if (!job.plan.live_import || job.status !== 'running' || job.state !== 'CopyingFull') return null
  const boot = job.hardware?.boot
  return (
    <p class="live-import" data-testid="live-import">
      <b>Live import:</b>{' '}
      {boot
        ? `the guest ${job.domain ?? ''} runs on this host (boot ${boot.verified ? 'verified' : 'not verified'}${
            boot.waited_seconds !== undefined ? ` after ${boot.waited_seconds} s` : ''
          }) while its disks copy; it moves onto them when the copy is done.`
        : 'the guest is being prepared and started on the source disks; its disks copy meanwhile.'}
    </p>
  )
}
