/**
 * Step: the job's domain name, reserved once the manifest is known, before anything is copied
 * (stored as `job.domain`; a resumed job keeps its name). The name is the plan's `name` or the
 * source VM's, made a valid libvirt name, and taken against libvirt's domains and every active
 * job's reservation (lib/store/jobs.ts `reserveDomain`).
 */
import type { Virsh } from '../domain/virsh.ts'
import { sanitizeDomainName } from '../domain/xml.ts'
import type { Job } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { JobsRepo } from '../store/jobs.ts'

/** What the reservation needs: the job table, the destination's libvirt, the clock. */
export interface ReservationInput {
  jobs: JobsRepo
  virsh: Pick<Virsh, 'list'>
  now(): Date
}

/** The job's name reservation: `reserve` before the copy, `rename` when libvirt has the name by the define. */
export interface DomainNameReservation {
  /** Reserves the job's name against libvirt's domains (listed when the reservation was made) and every active job. */
  reserve(job: Job, manifest: VmManifest): Promise<string>
  /** Reserves the name again against `taken` (the names libvirt has now: a job that ended defined it after this one's list). */
  rename(job: Job, manifest: VmManifest, taken: ReadonlySet<string>): Promise<string>
}

/**
 * The reservation of one job's domain name. libvirt's domain list is asked for now, so
 * `virsh list` runs while the job inspects its source (a fixed cost of every job); a failure
 * surfaces at `reserve`. libvirt out of reach (a daemon restart) is waited for by the client.
 * Throws what the store throws (`E_MIG_PERSIST_FAILED`) and what `virsh list` throws.
 */
export function domainNameReservation(input: ReservationInput): DomainNameReservation {
  const domains = input.virsh.list()
  domains.catch(() => {})
  const reserveName = (job: Job, manifest: VmManifest, taken: ReadonlySet<string>, replace: boolean) =>
    input.jobs.reserveDomain(job.id, sanitizeDomainName(job.plan.name ?? manifest.name), taken, input.now().toISOString(), { replace })
  return {
    reserve: async (job, manifest) => reserveName(job, manifest, new Set(await domains), false),
    rename: (job, manifest, taken) => reserveName(job, manifest, taken, true),
  }
}
