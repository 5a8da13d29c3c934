/**
 * Repository of migration jobs (spec 2.3). Rows store plan, progress and last_error as JSON.
 */
import { sql, type Kysely, type Selectable } from 'kysely'
import { MigError } from '../errors.ts'
import {
  emptyProgress,
  jobStatusOf,
  TERMINAL_STATES,
  TEST_BOOT_ACTIVE,
  type CutoverStatus,
  type HardwareRecord,
  type Job,
  type JobState,
  type LastError,
  type LiveGuestOnCancel,
  type Progress,
  type RestorePointRecord,
  type SourceVmRecord,
  type TestBootRecord,
} from '../job.ts'
import { cutoverModeOf, type Plan, type Strategy } from '../plan.ts'
import { persist } from './persist.ts'
import { writeTransaction } from './tx.ts'
import type { Database, JobsTable } from './schema.ts'

function toJob(r: Selectable<JobsTable>, blockedBy: string[] = []): Job {
  const cutover = r.cutover === null ? null : (JSON.parse(r.cutover) as CutoverStatus)
  if (cutover) cutover.requested_at = r.cutover_requested_at
  return {
    id: r.id,
    plan: JSON.parse(r.plan) as Plan,
    state: r.state as JobState,
    status: jobStatusOf(r.state as JobState),
    strategy: r.strategy as Strategy,
    effective_mode: r.effective_mode as Job['effective_mode'],
    progress: JSON.parse(r.progress) as Progress,
    last_error: r.last_error === null ? null : (JSON.parse(r.last_error) as LastError),
    restore_point: r.restore_point === null ? null : (JSON.parse(r.restore_point) as RestorePointRecord),
    domain: r.domain,
    cutover,
    source_vm: r.source_vm === null ? null : (JSON.parse(r.source_vm) as SourceVmRecord),
    bulk_plan_id: r.bulk_plan_id,
    bulk_key: r.bulk_key,
    depends_on: r.depends_on === null ? [] : (JSON.parse(r.depends_on) as string[]),
    blocked_by: blockedBy,
    hardware: r.hardware == null ? null : (JSON.parse(r.hardware) as HardwareRecord),
    test_boot: r.test_boot == null ? null : (JSON.parse(r.test_boot) as TestBootRecord),
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
  cutover?: CutoverStatus
  source_vm?: SourceVmRecord
  hardware?: HardwareRecord | null
  test_boot?: TestBootRecord | null
}

/**
 * The initial `cutover` record of a job: warm live plans only; `precopyIntervalSeconds` is the
 * configured default used when the plan has no `precopy_interval_seconds`.
 */
export function initialCutover(plan: Plan, strategy: Strategy, precopyIntervalSeconds: number): CutoverStatus | null {
  if (strategy !== 'live' || plan.mode !== 'Warm') return null
  const mode = cutoverModeOf(plan)
  return {
    mode,
    at: plan.cutover && 'at' in plan.cutover ? new Date(plan.cutover.at).toISOString() : null,
    precopy_interval_seconds: mode === 'auto' ? null : (plan.precopy_interval_seconds ?? precopyIntervalSeconds),
    requested_at: null,
    started_at: null,
    passes_total: 0,
    passes: [],
    projected_downtime: null,
  }
}

/** Extra fields of a job submitted in a bulk plan. */
export interface JobPlacement {
  bulk_plan_id: string
  /** The VM's key in the bulk plan. */
  key: string
  /** Job ids that must be `Completed` before this one starts. */
  depends_on: string[]
  /** At most this many jobs of the same live source run at once (null: no plan limit). */
  source_limit: number | null
}

/**
 * Ids of `deps` (job ids) that block a job: ended `Failed` or `Cancelled`, or blocked themselves
 * (transitively). `rows` maps job ids to their state and dependencies.
 */
function blockersOf(deps: string[], rows: Map<string, { state: string; depends_on: string[] }>, seen = new Set<string>()): string[] {
  const out: string[] = []
  for (const d of deps) {
    const r = rows.get(d)
    if (!r || seen.has(d)) continue
    seen.add(d)
    if (r.state === 'Failed' || r.state === 'Cancelled' || blockersOf(r.depends_on, rows, seen).length > 0) out.push(d)
  }
  return out
}

const ACTIVE = ['queued', 'running'] as const

/** `jobs.cancel_requested`: 0 none, 1 cancel (a live guest's copy finishes), 2 cancel destroying a live guest. */
const CANCEL_FINISH = 1
const CANCEL_DESTROY = 2

/** Jobs table access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class JobsRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** Persists a new `Queued` job. */
  create(j: {
    id: string
    plan: Plan
    strategy: Strategy
    effective_mode: Job['effective_mode']
    now: string
    cutover?: CutoverStatus | null
    placement?: JobPlacement
  }): Promise<Job> {
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
      cutover: j.cutover ? JSON.stringify(j.cutover) : null,
      cutover_requested_at: null,
      source_vm: null,
      bulk_plan_id: j.placement?.bulk_plan_id ?? null,
      bulk_key: j.placement?.key ?? null,
      depends_on: j.placement && j.placement.depends_on.length > 0 ? JSON.stringify(j.placement.depends_on) : null,
      source_limit: j.placement?.source_limit ?? null,
      hardware: null,
      space_reserved: null,
      input_identity: null,
      test_boot: null,
    }
    return persist('create job', async () => {
      await this.db.insertInto('jobs').values(row).execute()
      return toJob(row)
    })
  }

  /** Jobs (rows) with their `blocked_by` computed over the jobs of their bulk plans. */
  private async withBlockers(rows: Selectable<JobsTable>[]): Promise<Job[]> {
    const planIds = [...new Set(rows.filter((r) => r.depends_on !== null && r.bulk_plan_id !== null).map((r) => r.bulk_plan_id!))]
    if (planIds.length === 0) return rows.map((r) => toJob(r))
    const peers = await this.db.selectFrom('jobs').select(['id', 'state', 'depends_on']).where('bulk_plan_id', 'in', planIds).execute()
    const map = new Map(peers.map((p) => [p.id, { state: p.state, depends_on: p.depends_on === null ? [] : (JSON.parse(p.depends_on) as string[]) }]))
    return rows.map((r) => toJob(r, r.depends_on === null ? [] : blockersOf(JSON.parse(r.depends_on) as string[], map)))
  }

  /** All jobs, newest first (`bulkPlanId`: only that plan's, oldest first). */
  list(bulkPlanId?: string): Promise<Job[]> {
    return persist('list jobs', async () => {
      let q = this.db.selectFrom('jobs').selectAll()
      q =
        bulkPlanId === undefined
          ? q.orderBy('created_at', 'desc').orderBy('id', 'desc')
          : q
              .where('bulk_plan_id', '=', bulkPlanId)
              .orderBy('created_at')
              .orderBy('rowid' as never)
      return this.withBlockers(await q.execute())
    })
  }

  /** One job; `E_MIG_NOT_FOUND` when absent. */
  async get(id: string): Promise<Job> {
    const row = await persist('load job', () => this.db.selectFrom('jobs').selectAll().where('id', '=', id).executeTakeFirst())
    if (!row) throw new MigError('E_MIG_NOT_FOUND', `migration ${id} not found`)
    return row.depends_on === null ? toJob(row) : (await persist('load job dependencies', () => this.withBlockers([row])))[0]
  }

  /**
   * Records the operator's cutover command for warm job `id` waiting in `DeltaSyncing` with a
   * `manual` or `scheduled` cutover (idempotent). `E_MIG_CONFLICT` when the job does not wait for
   * one (another state, or an `auto` cutover), `E_MIG_NOT_FOUND` when absent.
   */
  async requestCutover(id: string, now: string): Promise<Job> {
    const job = await this.get(id)
    const waits = job.state === 'DeltaSyncing' && job.cutover !== null && job.cutover.mode !== 'auto'
    if (!waits) {
      const why =
        job.cutover === null
          ? 'it is not a warm live migration'
          : job.cutover.mode === 'auto'
            ? 'its plan cuts over automatically when the deltas converge'
            : `it is ${job.state}, not DeltaSyncing`
      throw new MigError('E_MIG_CONFLICT', `migration ${id} is not waiting for a cutover: ${why}`)
    }
    if (job.cutover!.requested_at !== null) return job
    if (job.plan.cutover?.require_test_boot && job.test_boot?.state !== 'passed') {
      throw new MigError(
        'E_MIG_CONFLICT',
        `migration ${id} cannot cut over yet: its plan requires a passing test boot (cutover.require_test_boot) and ${
          job.test_boot ? `the latest test boot is ${job.test_boot.state}` : 'none was run'
        }; run POST /migrations/${id}/test-boot first`,
      )
    }
    return this.markCutover([id], now).then(() => this.get(id))
  }

  /**
   * Records the operator's test-boot request for job `id` (docs/test-boot.md): a warm job waiting
   * in `DeltaSyncing` for a `manual` or `scheduled` cutover not yet requested (its worker takes the
   * request at its next pass boundary: `runner` `worker`), or a job that ended `Completed` with
   * `plan.start: false` (domain defined, never started; the server runs it: `runner` `server`).
   * A test boot already requested or running is answered as it is (`changed: false`). Throws
   * `E_MIG_CONFLICT` with when it becomes possible, `E_MIG_NOT_FOUND`.
   */
  async requestTestBoot(id: string, now: string): Promise<{ job: Job; runner: 'worker' | 'server'; changed: boolean }> {
    const job = await this.get(id)
    const warm = job.state === 'DeltaSyncing' && job.cutover !== null && job.cutover.mode !== 'auto' && job.cutover.requested_at === null
    const defined = job.state === 'Completed' && job.plan.start === false && job.domain !== null
    if (!warm && !defined) {
      const why =
        job.state === 'Completed'
          ? job.plan.start === false
            ? 'it defined no domain'
            : 'its destination domain was started already: the guest runs, there is nothing left to rehearse'
          : job.state === 'DeltaSyncing' && job.cutover?.requested_at
            ? 'its cutover was requested already'
            : job.state === 'DeltaSyncing' && job.cutover?.mode === 'auto'
              ? 'its plan cuts over automatically when the deltas converge (use cutover {"mode": "manual"} or {"at": ...})'
              : TERMINAL_STATES.includes(job.state)
                ? `it ended ${job.state}`
                : `it is ${job.state}`
      throw new MigError(
        'E_MIG_CONFLICT',
        `migration ${id} cannot test-boot now: ${why}. A test boot is possible once the disks hold a complete copy: a warm job with a manual or scheduled cutover waiting in DeltaSyncing, or an offline or cold job that ended Completed with plan start: false`,
      )
    }
    const runner = warm ? 'worker' : 'server'
    if (job.test_boot && TEST_BOOT_ACTIVE.includes(job.test_boot.state)) return { job, runner, changed: false }
    const record: TestBootRecord = {
      state: 'requested',
      requested_at: now,
      started_at: null,
      finished_at: null,
      seconds: null,
      verified: false,
      evidence: null,
      domain: null,
      clone: null,
      hardware: null,
      serial_tail: [],
      error: null,
    }
    // Only one request wins: the row is updated only while no test boot is active on it.
    const r = await persist('request test boot', () =>
      this.db
        .updateTable('jobs')
        .set({ test_boot: JSON.stringify(record), updated_at: now })
        .where('id', '=', id)
        .where((eb) =>
          eb.or([eb('test_boot', 'is', null), eb(sql<string>`json_extract(test_boot, '$.state')`, 'not in', TEST_BOOT_ACTIVE as unknown as string[])]),
        )
        .executeTakeFirst(),
    )
    return { job: await this.get(id), runner, changed: Number(r.numUpdatedRows) > 0 }
  }

  /** The test boot of job `id` as stored now (null when none). */
  async testBoot(id: string): Promise<TestBootRecord | null> {
    const r = await persist('read test boot', () => this.db.selectFrom('jobs').select('test_boot').where('id', '=', id).executeTakeFirst())
    return r?.test_boot ? (JSON.parse(r.test_boot) as TestBootRecord) : null
  }

  /** Ids of jobs whose test boot is `requested` or `running` (a clone may exist). */
  async withActiveTestBoot(): Promise<string[]> {
    return persist('list active test boots', async () =>
      (
        await this.db
          .selectFrom('jobs')
          .select('id')
          .where(sql<string>`json_extract(test_boot, '$.state')`, 'in', TEST_BOOT_ACTIVE as unknown as string[])
          .execute()
      ).map((r) => r.id),
    )
  }

  /** Sets the cutover command time on jobs `ids` that have none yet (a bulk plan's shared cutover). */
  async markCutover(ids: string[], now: string): Promise<void> {
    if (ids.length === 0) return
    await persist('request cutover', () =>
      this.db
        .updateTable('jobs')
        .set({ cutover_requested_at: now, updated_at: now })
        .where('id', 'in', ids)
        .where('cutover_requested_at', 'is', null)
        .execute(),
    )
  }

  /** When the operator asked job `id` to cut over, or null. */
  async cutoverRequestedAt(id: string): Promise<string | null> {
    const r = await persist('read cutover command', () => this.db.selectFrom('jobs').select('cutover_requested_at').where('id', '=', id).executeTakeFirst())
    return r?.cutover_requested_at ?? null
  }

  /**
   * The identity of job `id`'s remote input as its first attempt saw it (`RemoteFile.identity`:
   * validator and size), or null before any attempt opened it (lib/jobs/prepare.ts).
   */
  async inputIdentity(id: string): Promise<string | null> {
    const r = await persist('read input identity', () => this.db.selectFrom('jobs').select('input_identity').where('id', '=', id).executeTakeFirst())
    return r?.input_identity ?? null
  }

  /** Records the identity of job `id`'s remote input (see {@link inputIdentity}). */
  async setInputIdentity(id: string, identity: string): Promise<void> {
    await persist('record input identity', () => this.db.updateTable('jobs').set({ input_identity: identity }).where('id', '=', id).execute())
  }

  /**
   * Applies `patch` (and the derived `status`) at time `now`; returns the updated job. A patch
   * that sets `last_error` (a failure, a notice) may spend the store's space reserve (persist.ts).
   */
  async update(id: string, patch: JobPatch, now: string): Promise<Job> {
    return persist(
      'update job',
      async () => {
        const set: Partial<Selectable<JobsTable>> = { updated_at: now }
        if (patch.state !== undefined) Object.assign(set, { state: patch.state, status: jobStatusOf(patch.state) })
        if (patch.progress !== undefined) set.progress = JSON.stringify(patch.progress)
        if (patch.last_error !== undefined) set.last_error = patch.last_error === null ? null : JSON.stringify(patch.last_error)
        if (patch.effective_mode !== undefined) set.effective_mode = patch.effective_mode
        if (patch.started_at !== undefined) set.started_at = patch.started_at
        if (patch.finished_at !== undefined) set.finished_at = patch.finished_at
        if (patch.domain !== undefined) set.domain = patch.domain
        if (patch.cutover !== undefined) set.cutover = JSON.stringify({ ...patch.cutover, requested_at: null })
        if (patch.source_vm !== undefined) set.source_vm = JSON.stringify(patch.source_vm)
        if (patch.hardware !== undefined) set.hardware = patch.hardware === null ? null : JSON.stringify(patch.hardware)
        if (patch.test_boot !== undefined) set.test_boot = patch.test_boot === null ? null : JSON.stringify(patch.test_boot)
        if (patch.restore_point !== undefined) set.restore_point = patch.restore_point === null ? null : JSON.stringify(patch.restore_point)
        await this.db.updateTable('jobs').set(set).where('id', '=', id).execute()
        return this.get(id)
      },
      { useReserve: patch.last_error !== undefined },
    )
  }

  /**
   * Reserves a libvirt domain name for job `id`, atomically against every other
   * job that has not ended (the store's unique index `jobs_active_domain`): the first of `base`,
   * `base-2`, `base-3`, ... (at most 63 characters) that is not in `taken` (the domains libvirt
   * has) and no active job holds; stored as the job's `domain`. A job that holds a name already
   * keeps it, unless `replace` (its name turned out taken in libvirt at define: a job that ended
   * had defined it after `taken` was listed; `taken` is then libvirt's list of that moment).
   * Throws `E_MIG_DOMAIN_DEFINE_FAILED` when no name is free within 10 000 tries,
   * `E_MIG_PERSIST_FAILED`.
   */
  async reserveDomain(id: string, base: string, taken: ReadonlySet<string>, now: string, opts: { replace?: boolean } = {}): Promise<string> {
    const job = await this.get(id)
    if (job.domain && !opts.replace) return job.domain
    for (let i = 1; i <= 10_000; i++) {
      const suffix = i === 1 ? '' : `-${i}`
      const candidate = base.slice(0, 63 - suffix.length) + suffix
      if (taken.has(candidate)) continue
      try {
        await this.db.updateTable('jobs').set({ domain: candidate, updated_at: now }).where('id', '=', id).execute()
        return candidate
      } catch (e) {
        if (!/UNIQUE constraint/i.test((e as Error).message)) return persist('reserve domain name', () => Promise.reject(e))
      }
    }
    throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', `no free domain name for ${base}`)
  }

  /**
   * Records a cancellation request. A `Queued` job becomes `Cancelled` at once with
   * `E_MIG_CANCELLED`; a running job is flagged for its worker. `liveGuest` says what a live
   * import whose guest already runs does ({@link LiveGuestOnCancel}; default `finish`); a later
   * `destroy` overrides an earlier `finish`, never the reverse. `E_MIG_CONFLICT` when the job
   * already ended; `E_MIG_NOT_FOUND` when absent.
   */
  async requestCancel(id: string, now: string, liveGuest: LiveGuestOnCancel = 'finish'): Promise<{ job: Job; changed: boolean }> {
    const job = await this.get(id)
    if (TERMINAL_STATES.includes(job.state)) throw new MigError('E_MIG_CONFLICT', `migration ${id} already ended (${job.state})`)
    if (job.state === 'Queued') {
      const lastError: LastError = { code: 'E_MIG_CANCELLED', message: 'cancelled by operator before it started', fatal: true }
      return { job: await this.update(id, { state: 'Cancelled', last_error: lastError, finished_at: now }, now), changed: true }
    }
    const flag = liveGuest === 'destroy' ? CANCEL_DESTROY : CANCEL_FINISH
    await persist('flag job cancel', () =>
      this.db
        .updateTable('jobs')
        .set({ cancel_requested: sql<number>`max(cancel_requested, ${flag})`, updated_at: now })
        .where('id', '=', id)
        .execute(),
    )
    return { job: await this.get(id), changed: false }
  }

  /** Whether a cancellation was requested for a running job. */
  async cancelRequested(id: string): Promise<boolean> {
    return (await this.cancelChoice(id)) !== null
  }

  /** The cancellation requested for a running job: what to do with a live guest, or null when none was. */
  async cancelChoice(id: string): Promise<LiveGuestOnCancel | null> {
    const r = await persist('read cancel flag', () => this.db.selectFrom('jobs').select('cancel_requested').where('id', '=', id).executeTakeFirst())
    const flag = r?.cancel_requested ?? 0
    return flag >= CANCEL_DESTROY ? 'destroy' : flag === CANCEL_FINISH ? 'finish' : null
  }

  /** Ids of queued or running jobs whose plan uses upload `uploadId` / source `sourceId`. */
  activeUsing(ref: { uploadId?: string; sourceId?: string }): Promise<string[]> {
    const [key, value] = ref.uploadId !== undefined ? ['$.source_ref.upload_id', ref.uploadId] : ['$.source_ref.source_id', ref.sourceId ?? '']
    return persist('find jobs using a resource', async () =>
      (await this.db.selectFrom('jobs').select('id').where('status', 'in', ACTIVE).where(sql<string>`json_extract(plan, ${key})`, '=', value).execute()).map(
        (r) => r.id,
      ),
    )
  }

  /**
   * Claims the oldest `queued` or `running` job whose lease is free or expired (never claimed,
   * released for a retry, or its worker or server died) for `owner` until `now + leaseSeconds`,
   * skipping jobs that wait for others (a `depends_on` job not `Completed`) and live jobs whose
   * source already runs its limit of jobs (held leases; the job's bulk-plan `source_limit`, and
   * `perSourceLimit` when above 0), and the jobs of `running` (ids whose worker this supervisor
   * still runs: their lease may have expired while the store could not be written). Returns its
   * id, or null.
   */
  claimNext(owner: string, leaseSeconds: number, now: Date, perSourceLimit = 0, running: readonly string[] = []): Promise<string | null> {
    const nowIso = now.toISOString()
    const until = new Date(now.getTime() + leaseSeconds * 1000).toISOString()
    const sourceOf = sql<string | null>`json_extract(plan, '$.source_ref.source_id')`
    return persist('claim job', () =>
      writeTransaction(this.db, async (tx) => {
        const rows = await tx
          .selectFrom('jobs')
          .select(['id', 'status', 'depends_on', 'source_limit', sourceOf.as('source_id')])
          .where('status', 'in', ['queued', 'running'])
          .where((eb) => eb.or([eb('lease_expires_at', 'is', null), eb('lease_expires_at', '<', nowIso)]))
          .orderBy('created_at')
          .orderBy('id')
          .execute()
        for (const row of rows) {
          if (running.includes(row.id)) continue
          if (row.depends_on !== null && row.status === 'queued') {
            const deps = JSON.parse(row.depends_on) as string[]
            const done = await tx.selectFrom('jobs').select('id').where('id', 'in', deps).where('state', '=', 'Completed').execute()
            if (done.length < deps.length) continue
          }
          const limits = [row.source_limit ?? 0, perSourceLimit].filter((l) => l > 0)
          if (row.source_id && limits.length > 0) {
            const held = await tx
              .selectFrom('jobs')
              .select((eb) => eb.fn.countAll<number>().as('n'))
              .where('status', 'in', ['queued', 'running'])
              .where('lease_expires_at', '>=', nowIso)
              .where(sourceOf, '=', row.source_id)
              .executeTakeFirstOrThrow()
            if (Number(held.n) >= Math.min(...limits)) continue
          }
          await tx.updateTable('jobs').set({ lease_owner: owner, lease_expires_at: until }).where('id', '=', row.id).execute()
          return row.id
        }
        return null
      }),
    )
  }

  /** Extends the lease of `id` held by `owner`; false when another owner holds it now. */
  renewLease(id: string, owner: string, leaseSeconds: number, now: Date): Promise<boolean> {
    const until = new Date(now.getTime() + leaseSeconds * 1000).toISOString()
    return persist(
      'renew job lease',
      async () =>
        Number(
          (await this.db.updateTable('jobs').set({ lease_expires_at: until }).where('id', '=', id).where('lease_owner', '=', owner).executeTakeFirst())
            .numUpdatedRows,
        ) > 0,
    )
  }

  /** Drops the lease of `id` so any supervisor may claim it at once (a retry). */
  releaseLease(id: string): Promise<void> {
    return persist('release job lease', async () => {
      await this.db.updateTable('jobs').set({ lease_owner: null, lease_expires_at: null }).where('id', '=', id).execute()
    })
  }

  /**
   * Reserves `bytes` on file system or pool `key` for job `id`, atomically against every other
   * job's reservation (one write transaction: two jobs checking at once see each other): calls
   * `check(others)` with the other queued or running jobs that reserved on `key`, each with what
   * it still has to write (`remainingOf(id, reserved bytes)`), and stores the reservation when
   * `check` returns. `check` throws to refuse (its error is thrown, nothing stored).
   * `E_MIG_PERSIST_FAILED` when the store fails.
   */
  reserveSpace(
    id: string,
    key: string,
    bytes: number,
    remainingOf: (jobId: string, reserved: number) => Promise<number>,
    check: (others: Array<{ id: string; remaining: number }>) => void,
  ): Promise<void> {
    return persist('reserve space', () =>
      writeTransaction(this.db, async (tx) => {
        const rows = await tx
          .selectFrom('jobs')
          .select(['id', 'space_reserved'])
          .where('status', 'in', ACTIVE)
          .where('id', '!=', id)
          .where('space_reserved', 'is not', null)
          .execute()
        const others: Array<{ id: string; remaining: number }> = []
        for (const r of rows) {
          const res = JSON.parse(r.space_reserved!) as { key: string; bytes: number }
          if (res.key === key) others.push({ id: r.id, remaining: Math.max(0, await remainingOf(r.id, res.bytes)) })
        }
        check(others)
        await tx
          .updateTable('jobs')
          .set({ space_reserved: JSON.stringify({ key, bytes }) })
          .where('id', '=', id)
          .execute()
      }),
    )
  }

  /** Counts one more worker attempt at `id`; returns the new count. */
  addAttempt(id: string): Promise<number> {
    return persist('count job attempt', async () => {
      await this.db
        .updateTable('jobs')
        .set((eb) => ({ attempts: eb('attempts', '+', 1) }))
        .where('id', '=', id)
        .execute()
      const r = await this.db.selectFrom('jobs').select('attempts').where('id', '=', id).executeTakeFirstOrThrow()
      return r.attempts
    })
  }
}
