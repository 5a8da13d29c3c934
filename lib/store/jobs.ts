/**
 * Repository of migration jobs (spec 2.3). Rows store plan, progress and last_error as JSON.
 */
import { sql, type Kysely, type Selectable } from 'kysely'
import { MigError } from '../errors.ts'
import { emptyProgress, statusOf, TERMINAL_STATES, type HardwareRecord, type Job, type JobState, type LastError, type Progress, type RestorePointRecord, type Strategy } from '../job.ts'
import type { Plan } from '../plan.ts'
import { persist } from './persist.ts'
import type { Database, JobsTable } from './schema.ts'

function toJob(r: Selectable<JobsTable>): Job {
  return {
    id: r.id,
    plan: JSON.parse(r.plan) as Plan,
    state: r.state as JobState,
    status: statusOf(r.state as JobState),
    strategy: r.strategy as Strategy,
    effective_mode: r.effective_mode as Job['effective_mode'],
    progress: JSON.parse(r.progress) as Progress,
    last_error: r.last_error === null ? null : (JSON.parse(r.last_error) as LastError),
    restore_point: r.restore_point === null ? null : (JSON.parse(r.restore_point) as RestorePointRecord),
    domain: r.domain,
    hardware: r.hardware == null ? null : (JSON.parse(r.hardware) as HardwareRecord),
    created_at: r.created_at,
    updated_at: r.updated_at,
    started_at: r.started_at,
    finished_at: r.finished_at,
  }
}

/** Fields a state change or progress update may set. */
export interface JobPatch {
  state?: JobState
  progress?: Progress
  last_error?: LastError | null
  effective_mode?: Job['effective_mode']
  started_at?: string | null
  finished_at?: string | null
  restore_point?: RestorePointRecord | null
  domain?: string | null
  hardware?: HardwareRecord | null
}

const ACTIVE = ['queued', 'running'] as const

/** Jobs table access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class JobsRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** Persists a new `Queued` job. */
  create(j: { id: string; plan: Plan; strategy: Strategy; effective_mode: Job['effective_mode']; now: string }): Promise<Job> {
    const row: Selectable<JobsTable> = {
      id: j.id,
      plan: JSON.stringify(j.plan),
      state: 'Queued',
      status: 'queued',
      strategy: j.strategy,
      effective_mode: j.effective_mode,
      progress: JSON.stringify(emptyProgress()),
      last_error: null,
      cancel_requested: 0,
      attempts: 0,
      lease_owner: null,
      lease_expires_at: null,
      created_at: j.now,
      updated_at: j.now,
      started_at: null,
      finished_at: null,
      restore_point: null,
      domain: null,
      hardware: null,
    }
    return persist('create job', async () => {
      await this.db.insertInto('jobs').values(row).execute()
      return toJob(row)
    })
  }

  /** All jobs, newest first. */
  list(): Promise<Job[]> {
    return persist('list jobs', async () => (await this.db.selectFrom('jobs').selectAll().orderBy('created_at', 'desc').orderBy('id', 'desc').execute()).map(toJob))
  }

  /** One job; `E_MIG_NOT_FOUND` when absent. */
  async get(id: string): Promise<Job> {
    const row = await persist('load job', () => this.db.selectFrom('jobs').selectAll().where('id', '=', id).executeTakeFirst())
    if (!row) throw new MigError('E_MIG_NOT_FOUND', `migration ${id} not found`)
    return toJob(row)
  }

  /** Applies `patch` (and the derived `status`) at time `now`; returns the updated job. */
  async update(id: string, patch: JobPatch, now: string): Promise<Job> {
    return persist('update job', async () => {
      const set: Partial<Selectable<JobsTable>> = { updated_at: now }
      if (patch.state !== undefined) Object.assign(set, { state: patch.state, status: statusOf(patch.state) })
      if (patch.progress !== undefined) set.progress = JSON.stringify(patch.progress)
      if (patch.last_error !== undefined) set.last_error = patch.last_error === null ? null : JSON.stringify(patch.last_error)
      if (patch.effective_mode !== undefined) set.effective_mode = patch.effective_mode
      if (patch.started_at !== undefined) set.started_at = patch.started_at
      if (patch.finished_at !== undefined) set.finished_at = patch.finished_at
      if (patch.domain !== undefined) set.domain = patch.domain
      if (patch.hardware !== undefined) set.hardware = patch.hardware === null ? null : JSON.stringify(patch.hardware)
      if (patch.restore_point !== undefined) set.restore_point = patch.restore_point === null ? null : JSON.stringify(patch.restore_point)
      await this.db.updateTable('jobs').set(set).where('id', '=', id).execute()
      return this.get(id)
    })
  }

  /**
   * Records a cancellation request. A `Queued` job becomes `Cancelled` at once with
   * `E_MIG_CANCELLED`; a running job is flagged for its worker. `E_MIG_CONFLICT` when the job
   * already ended; `E_MIG_NOT_FOUND` when absent.
   */
  async requestCancel(id: string, now: string): Promise<{ job: Job; changed: boolean }> {
    const job = await this.get(id)
    if (TERMINAL_STATES.includes(job.state)) throw new MigError('E_MIG_CONFLICT', `migration ${id} already ended (${job.state})`)
    if (job.state === 'Queued') {
      const lastError: LastError = { code: 'E_MIG_CANCELLED', message: 'cancelled by operator before it started', fatal: true }
      return { job: await this.update(id, { state: 'Cancelled', last_error: lastError, finished_at: now }, now), changed: true }
    }
    await persist('flag job cancel', () => this.db.updateTable('jobs').set({ cancel_requested: 1, updated_at: now }).where('id', '=', id).execute())
    return { job: await this.get(id), changed: false }
  }

  /** Whether a cancellation was requested for a running job. */
  async cancelRequested(id: string): Promise<boolean> {
    const r = await persist('read cancel flag', () => this.db.selectFrom('jobs').select('cancel_requested').where('id', '=', id).executeTakeFirst())
    return r?.cancel_requested === 1
  }

  /** Ids of queued or running jobs whose plan uses upload `uploadId` / source `sourceId`. */
  activeUsing(ref: { uploadId?: string; sourceId?: string }): Promise<string[]> {
    const [key, value] = ref.uploadId !== undefined ? ['$.source_ref.upload_id', ref.uploadId] : ['$.source_ref.source_id', ref.sourceId ?? '']
    return persist('find jobs using a resource', async () =>
      (
        await this.db
          .selectFrom('jobs')
          .select('id')
          .where('status', 'in', ACTIVE)
          .where(sql<string>`json_extract(plan, ${key})`, '=', value)
          .execute()
      ).map((r) => r.id),
    )
  }

  /**
   * Claims the oldest `queued` or `running` job whose lease is free or expired (never claimed,
   * released for a retry, or its worker or server died) for `owner` until `now + leaseSeconds`.
   * Returns its id, or null.
   */
  claimNext(owner: string, leaseSeconds: number, now: Date): Promise<string | null> {
    const nowIso = now.toISOString()
    const until = new Date(now.getTime() + leaseSeconds * 1000).toISOString()
    return persist('claim job', () =>
      this.db.transaction().execute(async (tx) => {
        const row = await tx
          .selectFrom('jobs')
          .select('id')
          .where('status', 'in', ['queued', 'running'])
          .where((eb) => eb.or([eb('lease_expires_at', 'is', null), eb('lease_expires_at', '<', nowIso)]))
          .orderBy('created_at')
          .orderBy('id')
          .limit(1)
          .executeTakeFirst()
        if (!row) return null
        await tx.updateTable('jobs').set({ lease_owner: owner, lease_expires_at: until }).where('id', '=', row.id).execute()
        return row.id
      }),
    )
  }

  /** Extends the lease of `id` held by `owner`; false when another owner holds it now. */
  renewLease(id: string, owner: string, leaseSeconds: number, now: Date): Promise<boolean> {
    const until = new Date(now.getTime() + leaseSeconds * 1000).toISOString()
    return persist('renew job lease', async () => Number((await this.db.updateTable('jobs').set({ lease_expires_at: until }).where('id', '=', id).where('lease_owner', '=', owner).executeTakeFirst()).numUpdatedRows) > 0)
  }

  /** Drops the lease of `id` so any supervisor may claim it at once (a retry). */
  releaseLease(id: string): Promise<void> {
    return persist('release job lease', async () => {
      await this.db.updateTable('jobs').set({ lease_owner: null, lease_expires_at: null }).where('id', '=', id).execute()
    })
  }

  /** Counts one more worker attempt at `id`; returns the new count. */
  addAttempt(id: string): Promise<number> {
    return persist('count job attempt', async () => {
      await this.db.updateTable('jobs').set((eb) => ({ attempts: eb('attempts', '+', 1) })).where('id', '=', id).execute()
      const r = await this.db.selectFrom('jobs').select('attempts').where('id', '=', id).executeTakeFirstOrThrow()
      return r.attempts
    })
  }
}

