/**
 * Bulk plans (roadmap v0.5): one request submits many VMs, live and offline, as ordinary jobs
 * with dependency ordering (`depends_on`: a job starts after the jobs it depends on have
 * `Completed`), a per-source concurrency limit (`max_per_source`, applied by the supervisor's
 * claim) and one shared cutover for the plan's warm VMs. The plan resource shows the aggregate
 * state; a job whose dependency failed or was cancelled stays `Queued` and is reported blocked.
 */
import { randomUUID } from 'node:crypto'
import { z } from 'zod'
import { MigError } from '../errors.ts'
import { TERMINAL_STATES, type Job, type TestBootRecord } from '../job.ts'
import { CutoverPlan, issuesOf, Plan } from '../plan.ts'
import type { BulkPlanRow } from '../store/bulk-plans.ts'
import type { Store } from '../store/index.ts'
import { checkPlanBridges, checkPlanRefs, createJob, type SubmitOptions } from './submit.ts'

const key = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, 'must be 1-63 characters of [A-Za-z0-9._-], starting with a letter or digit')

/**
 * The body of `POST /plans`. `cutover` and `precopy_interval_seconds` apply to every warm live
 * VM whose own plan does not set them.
 */
export const BulkPlanBody = z.strictObject({
  name: z.string().min(1).max(200).optional(),
  max_per_source: z.number().int().min(1).max(1000).optional(),
  cutover: CutoverPlan.optional(),
  precopy_interval_seconds: z.number().int().min(1).max(86_400).optional(),
  vms: z
    .array(z.strictObject({ key, plan: z.unknown(), depends_on: z.array(key).max(1000).optional() }))
    .min(1)
    .max(1000),
})

/** Aggregate state of a bulk plan, from its jobs. */
export type BulkPlanState = 'Queued' | 'Running' | 'WaitingForCutover' | 'Blocked' | 'Completed' | 'Failed' | 'Cancelled'

/** One VM of the plan resource. */
export interface BulkPlanVm {
  key: string
  job_id: string
  name: string | null
  state: Job['state']
  status: Job['status']
  /** Keys of the VMs this one waits for. */
  depends_on: string[]
  /** Keys of the VMs that block this one (ended Failed/Cancelled, or blocked themselves). */
  blocked_by: string[]
  /** State of the VM's latest test boot (docs/test-boot.md), null when none was asked for. */
  test_boot: TestBootRecord['state'] | null
}

/** The plan resource (`GET /plans/:id`). Timestamps ISO-8601 UTC. */
export interface BulkPlanView {
  id: string
  name: string | null
  state: BulkPlanState
  max_per_source: number | null
  cutover_requested_at: string | null
  counts: Record<'queued' | 'running' | 'completed' | 'failed' | 'cancelled' | 'blocked', number>
  vms: BulkPlanVm[]
  created_at: string
  updated_at: string
}

function invalid(issues: { path: string; message: string }[]): MigError {
  return new MigError('E_MIG_INVALID_PLAN', `invalid plan: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`, { details: { issues } })
}

/** True when `job` waits (or will wait) in DeltaSyncing for a cutover command or time. */
function waitsForCutover(job: Job): boolean {
  return job.cutover !== null && job.cutover.mode !== 'auto' && !TERMINAL_STATES.includes(job.state)
}

/**
 * The aggregate state: `Completed` when every job completed; `Running` while a job runs or can
 * start (`Queued` when none has started yet); `WaitingForCutover` when every job still going waits
 * in DeltaSyncing for the plan's cutover; `Blocked` when only blocked jobs are left; otherwise
 * (all ended) `Failed` when one failed, else `Cancelled`.
 */
export function aggregateState(jobs: Job[]): BulkPlanState {
  if (jobs.every((j) => j.state === 'Completed')) return 'Completed'
  const going = jobs.filter((j) => !TERMINAL_STATES.includes(j.state) && j.blocked_by.length === 0)
  if (going.length > 0) {
    if (going.every((j) => j.state === 'DeltaSyncing' && waitsForCutover(j) && j.cutover!.requested_at === null)) return 'WaitingForCutover'
    return jobs.some((j) => j.state !== 'Queued') ? 'Running' : 'Queued'
  }
  if (jobs.some((j) => !TERMINAL_STATES.includes(j.state))) return 'Blocked'
  return jobs.some((j) => j.state === 'Failed') ? 'Failed' : 'Cancelled'
}

/** The plan resource of `row` over its jobs (in submission order). */
export function bulkPlanView(row: BulkPlanRow, jobs: Job[]): BulkPlanView {
  const keyOf = new Map(jobs.map((j) => [j.id, j.bulk_key ?? j.id]))
  const counts = { queued: 0, running: 0, completed: 0, failed: 0, cancelled: 0, blocked: 0 }
  for (const j of jobs) {
    if (j.blocked_by.length > 0 && j.status === 'queued') counts.blocked++
    else counts[j.status]++
  }
  return {
    id: row.id,
    name: row.name,
    state: aggregateState(jobs),
    max_per_source: row.max_per_source,
    cutover_requested_at: row.cutover_requested_at,
    counts,
    vms: jobs.map((j) => ({
      key: j.bulk_key ?? j.id,
      job_id: j.id,
      name: j.plan.name ?? null,
      state: j.state,
      status: j.status,
      depends_on: j.depends_on.map((d) => keyOf.get(d) ?? d),
      blocked_by: j.blocked_by.map((d) => keyOf.get(d) ?? d),
      test_boot: j.test_boot?.state ?? null,
    })),
    created_at: row.created_at,
    updated_at: row.updated_at,
  }
}

/** Loads bulk plan `id` with its jobs as the plan resource. `E_MIG_NOT_FOUND`, `E_MIG_PERSIST_FAILED`. */
export async function loadBulkPlan(store: Store, id: string): Promise<BulkPlanView> {
  const row = await store.bulkPlans.get(id)
  return bulkPlanView(row, await store.jobs.list(id))
}

/**
 * Validates a `POST /plans` body and persists the plan and one `Queued` job per VM, dependencies
 * first. Throws `E_MIG_INVALID_PLAN` (with `details.issues[].path` like `vms.2.plan.mode` or
 * `vms.1.depends_on.0`: an unknown key, a duplicate key, a VM depending on itself or a cycle),
 * the codes of {@link checkPlanRefs} for each VM, and `E_MIG_PERSIST_FAILED`. Returns the plan
 * resource and the created jobs.
 */
export async function submitBulkPlan(
  body: unknown,
  store: Store,
  importRoot: string,
  now: Date,
  opts: SubmitOptions = {},
): Promise<{ plan: BulkPlanView; jobs: Job[] }> {
  const r = BulkPlanBody.safeParse(body)
  if (!r.success) throw invalid(issuesOf(r.error))
  const b = r.data
  const issues: { path: string; message: string }[] = []
  const plans: Plan[] = []
  const index = new Map<string, number>()
  b.vms.forEach((vm, i) => {
    if (index.has(vm.key)) issues.push({ path: `vms.${i}.key`, message: `duplicate key ${vm.key} (also vms.${index.get(vm.key)})` })
    index.set(vm.key, i)
    const raw = vm.plan !== null && typeof vm.plan === 'object' && !Array.isArray(vm.plan) ? { ...(vm.plan as Record<string, unknown>) } : vm.plan
    // the plan-wide warm settings fill in what the VM's own plan leaves out
    const src = (raw as Record<string, unknown> | null)?.source
    if (raw && typeof raw === 'object' && (raw as Record<string, unknown>).mode === 'Warm' && typeof src === 'object' && src !== null && 'Live' in src) {
      if (b.cutover && !('cutover' in raw)) Object.assign(raw, { cutover: b.cutover })
      if (b.precopy_interval_seconds && !('precopy_interval_seconds' in raw)) Object.assign(raw, { precopy_interval_seconds: b.precopy_interval_seconds })
    }
    const p = Plan.safeParse(raw)
    if (!p.success) issues.push(...issuesOf(p.error, ['vms', String(i), 'plan']))
    else plans[i] = p.data
  })
  b.vms.forEach((vm, i) => {
    ;(vm.depends_on ?? []).forEach((d, k) => {
      if (!index.has(d)) issues.push({ path: `vms.${i}.depends_on.${k}`, message: `no VM with key ${d} in this plan` })
      else if (d === vm.key) issues.push({ path: `vms.${i}.depends_on.${k}`, message: 'a VM cannot depend on itself' })
    })
  })
  if (issues.length > 0) throw invalid(issues)
  // dependencies first (Kahn); what is left is a cycle
  const order: number[] = []
  const pending = new Map(b.vms.map((vm, i) => [i, new Set(vm.depends_on ?? [])]))
  while (pending.size > 0) {
    const ready = [...pending].filter(([, deps]) => [...deps].every((d) => !pending.has(index.get(d)!))).map(([i]) => i)
    if (ready.length === 0) {
      const cyc = [...pending.keys()].map((i) => b.vms[i].key)
      throw invalid([{ path: `vms.${[...pending.keys()][0]}.depends_on`, message: `dependency cycle among ${cyc.join(', ')}` }])
    }
    for (const i of ready) {
      order.push(i)
      pending.delete(i)
    }
  }
  for (let i = 0; i < b.vms.length; i++) {
    try {
      await checkPlanRefs(plans[i], store, importRoot, now)
      checkPlanBridges(plans[i])
    } catch (e) {
      if (e instanceof MigError) throw new MigError(e.code, `vms.${i} (${b.vms[i].key}): ${e.message}`, { details: e.details })
      throw e
    }
  }
  const id = randomUUID()
  const row = await store.bulkPlans.create({ id, name: b.name ?? null, max_per_source: b.max_per_source ?? null, now: now.toISOString() })
  const jobIds = new Map<string, string>()
  const jobs: Job[] = []
  for (const i of order) {
    const vm = b.vms[i]
    const job = await createJob(plans[i], store, now, opts, {
      bulk_plan_id: id,
      key: vm.key,
      depends_on: (vm.depends_on ?? []).map((d) => jobIds.get(d)!),
      source_limit: b.max_per_source ?? null,
    })
    jobIds.set(vm.key, job.id)
    jobs.push(job)
  }
  return { plan: bulkPlanView(row, await store.jobs.list(id)), jobs }
}

/**
 * The plan's shared cutover: every warm job of the plan that waits (or will wait) for a cutover
 * command gets it; jobs still copying or queued cut over right after their first delta pass.
 * Returns the ids told. `E_MIG_CONFLICT` when no job of the plan waits for a cutover,
 * `E_MIG_NOT_FOUND`.
 */
export async function cutoverBulkPlan(store: Store, id: string, now: Date): Promise<string[]> {
  await store.bulkPlans.get(id)
  const jobs = (await store.jobs.list(id)).filter(waitsForCutover)
  if (jobs.length === 0) throw new MigError('E_MIG_CONFLICT', `plan ${id} has no warm migration waiting for a cutover`)
  await store.bulkPlans.markCutover(id, now.toISOString())
  await store.jobs.markCutover(
    jobs.map((j) => j.id),
    now.toISOString(),
  )
  return jobs.map((j) => j.id)
}
