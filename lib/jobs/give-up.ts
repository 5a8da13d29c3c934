/**
 * The end of a job whose worker died on every attempt (`MIGRATOR_MAX_ATTEMPTS`): no worker ran
 * its cleanup, so the source VM of a live job is released here (the snapshots the attempts
 * took removed, the VM powered on again when the job had shut it down and died before starting
 * the destination), and the job ends `Failed` saying so. Called by the supervisor.
 */
import { releaseLiveVm } from '../adapters/session.ts'
import type { Sealer } from '../crypto/seal.ts'
import type { Job } from '../job.ts'
import type { Store } from '../store/index.ts'
import type { JobLogger } from './settings.ts'

/** What giving up on a job needs: the store, the sealing key (the source's credentials), the logger, the clock. */
export interface GiveUpInput {
  store: Store
  sealer: Sealer
  logger: JobLogger
  now(): Date
}

/**
 * Releases the source VM of a live `job` given up on (best effort: a failure is logged and named
 * in the returned `note`, never thrown). In `Starting` the VM is not powered on: the destination
 * may already run, the operator decides. Returns the note for the job's error message and when
 * the VM was powered on again (null: it was not).
 */
async function releaseSource(input: GiveUpInput, job: Job): Promise<{ note: string; powered_on_at: string | null }> {
  const ref = job.plan.source_ref
  if (!('Live' in job.plan.source) || ref.kind !== 'live_vm') return { note: '', powered_on_at: null }
  const powerOn = !!job.source_vm?.shut_down_at && !job.source_vm.powered_on_at && job.state !== 'Starting'
  try {
    await releaseLiveVm(input.store.sources, input.sealer, ref.source_id, ref.vm_id, { powerOn })
    input.logger.info({ job: job.id, vm: ref.vm_id, powerOn }, 'released the source VM of a job given up')
    return powerOn ? { note: `; the source VM ${ref.vm_id} was powered on again`, powered_on_at: input.now().toISOString() } : { note: '', powered_on_at: null }
  } catch (e) {
    input.logger.warn({ job: job.id, vm: ref.vm_id, err: (e as Error).message }, 'could not release the source VM of a job given up')
    return { note: powerOn ? `; powering the source VM ${ref.vm_id} on again failed: ${(e as Error).message}` : '', powered_on_at: null }
  }
}

/**
 * Ends job `id`, whose worker died `attempts - 1` times, `Failed` with `E_MIG_INTERNAL`, after
 * releasing its source VM; returns the job as stored. Throws what the store throws
 * (`E_MIG_NOT_FOUND`, `E_MIG_PERSIST_FAILED`).
 */
export async function giveUpJob(input: GiveUpInput, id: string, attempts: number): Promise<Job> {
  const { jobs } = input.store
  const before = await jobs.get(id)
  const released = await releaseSource(input, before)
  const sourceVm = released.powered_on_at && before.source_vm ? { source_vm: { ...before.source_vm, powered_on_at: released.powered_on_at } } : {}
  const message = `the job's worker died ${attempts - 1} times; giving up${released.note}`
  return jobs.update(
    id,
    { state: 'Failed', finished_at: input.now().toISOString(), last_error: { code: 'E_MIG_INTERNAL', message, fatal: true }, ...sourceVm },
    input.now().toISOString(),
  )
}
