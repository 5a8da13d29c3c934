/**
 * The Plans pages (bulk plans, roadmap v0.5): every plan (`GET /plans`) with its aggregate state
 * and per-VM counts, and one plan (`GET /plans/:id`) with each VM (key, job, state, depends_on,
 * blocked_by) and the shared **Cut over all** (`POST /plans/:id/cutover`).
 *
 * Live updates reuse the jobs' SSE stream of the store instead of polling: every VM of a plan
 * is an ordinary job, so a `migration` event of a job with `bulk_plan_id` is exactly when the
 * plan resource can change; the page then fetches the plan again (at most every 300 ms).
 */
import { useEffect, useRef, useState } from 'preact/hooks'
import type { Job } from '../../../lib/job.ts'
import type { BulkPlanView } from '../../../lib/jobs/bulk.ts'
import { api, ApiError } from '../api.ts'
import { ErrorBox, Head, StateBadge } from '../components.tsx'
import { ConfirmDialog } from '../confirm.tsx'
import { waitsForCutover } from '../cutover.tsx'
import { time } from '../format.ts'
import { TERMINAL } from '../live.ts'
import { putJob, useStore } from '../store.ts'

/** A signature of the store's jobs of plan `id` (all plans when null): changes when one of them does. */
function planJobsKey(jobs: Map<string, Job>, id: string | null): string {
  let key = ''
  for (const j of jobs.values()) {
    if (j.bulk_plan_id && (id === null || j.bulk_plan_id === id)) key += `${j.id}:${j.state}:${j.updated_at};`
  }
  return key
}

/**
 * Calls `load` now, and again whenever `key` changes or the stream reconnects, at most once per
 * 300 ms (a change while a call is scheduled is covered by it); returns the last error.
 */
function useFollow(load: () => Promise<void>, key: string): string | null {
  const [err, setErr] = useState<string | null>(null)
  const timer = useRef<ReturnType<typeof setTimeout> | undefined>(undefined)
  const first = useRef(true)
  const { connection } = useStore()
  useEffect(() => {
    if (timer.current !== undefined) return
    timer.current = setTimeout(
      () => {
        timer.current = undefined
        load()
          .then(() => setErr(null))
          .catch((e) => setErr((e as Error).message))
      },
      first.current ? 0 : 300,
    )
    first.current = false
  }, [key, connection])
  useEffect(() => () => clearTimeout(timer.current), [])
  return err
}

/** The `counts` of a plan in a few words, in the order a plan goes through them. */
function Counts({ plan }: { plan: BulkPlanView }) {
  const c = plan.counts
  const parts: [string, number][] = [
    ['queued', c.queued],
    ['running', c.running],
    ['completed', c.completed],
    ['failed', c.failed],
    ['cancelled', c.cancelled],
    ['blocked', c.blocked],
  ]
  return (
    <span class="counts" data-testid="plan-counts">
      {parts
        .filter(([, n]) => n > 0)
        .map(([k, n]) => (
          <span key={k} class={`count c-${k}`} data-count={k}>
            {n} {k}
          </span>
        ))}
    </span>
  )
}

/** Every bulk plan, newest first. */
export function PlansPage() {
  const { jobs } = useStore()
  const [plans, setPlans] = useState<BulkPlanView[] | null>(null)
  const err = useFollow(async () => setPlans((await api<{ items: BulkPlanView[] }>('GET', '/plans')).items), planJobsKey(jobs, null))
  return (
    <section>
      <h2>Plans</h2>
      <p class="muted small">
        A bulk plan (<code>POST /plans</code>, docs/architecture.md “Bulk plans”) migrates many VMs with dependency ordering and one shared cutover; each VM is an
        ordinary migration.
      </p>
      {err && <ErrorBox code="E_CONSOLE_OFFLINE" message={err} />}
      {plans === null ? (
        <p class="muted">Loading…</p>
      ) : plans.length === 0 ? (
        <p class="muted">No bulk plans yet.</p>
      ) : (
        <table class="grid-table jobs" data-testid="plans">
          <Head cols={['Name', 'State', 'VMs', 'Per source', 'Created']} />
          <tbody>
            {plans.map((p) => (
              <tr key={p.id} data-plan={p.id} data-state={p.state}>
                <td>
                  <a href={`#/plans/${p.id}`}>{p.name ?? p.id.slice(0, 8)}</a>
                </td>
                <td>
                  <span class={`badge p-${p.state}`} data-testid="plan-state">
                    {p.state}
                  </span>
                </td>
                <td>
                  {p.vms.length} VMs: <Counts plan={p} />
                </td>
                <td>{p.max_per_source ?? '–'}</td>
                <td>{time(p.created_at)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  )
}

/** One bulk plan: its VMs and the shared cutover. */
export function PlanPage({ id }: { id: string }) {
  const { jobs } = useStore()
  const [plan, setPlan] = useState<BulkPlanView | null>(null)
  const [missing, setMissing] = useState<string | null>(null)
  const [confirming, setConfirming] = useState(false)
  const [cutError, setCutError] = useState<ApiError | null>(null)
  const [sending, setSending] = useState(false)
  const err = useFollow(async () => {
    try {
      setPlan(await api<BulkPlanView>('GET', `/plans/${id}`))
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) setMissing(e.message)
      else throw e
    }
  }, planJobsKey(jobs, id))

  if (missing) return <ErrorBox code="E_MIG_NOT_FOUND" message={missing} />
  if (!plan) return err ? <ErrorBox code="E_CONSOLE_OFFLINE" message={err} /> : <p class="muted">Loading…</p>

  const jobOf = (jobId: string) => jobs.get(jobId) ?? null
  const planJobs = plan.vms.map((v) => jobOf(v.job_id)).filter((j): j is Job => j !== null)
  // warm VMs on command: waiting now, or still to reach the wait (the command covers them too)
  const onCommand = planJobs.filter((j) => j.cutover !== null && j.cutover.mode !== 'auto' && !TERMINAL.has(j.state))
  const waiting = onCommand.filter(waitsForCutover)
  const canCut = waiting.length > 0 && !sending
  const cutover = async () => {
    setConfirming(false)
    setSending(true)
    setCutError(null)
    try {
      setPlan(await api<BulkPlanView>('POST', `/plans/${id}/cutover`))
      // the jobs' cutover.requested_at is set: fetch them now rather than wait for their events
      for (const j of onCommand) putJob(await api<Job>('GET', `/migrations/${j.id}`))
    } catch (e) {
      setCutError(e instanceof ApiError ? e : new ApiError('E_CONSOLE', (e as Error).message, 0))
    } finally {
      setSending(false)
    }
  }
  const cutText = plan.cutover_requested_at
    ? `Cutover requested ${time(plan.cutover_requested_at)}${onCommand.length ? `; ${onCommand.length} warm VM(s) still to cut over` : ''}.`
    : waiting.length
      ? `${waiting.length} of ${onCommand.length} warm VM(s) wait in DeltaSyncing for the cutover; the others cut over when they reach it.`
      : onCommand.length
        ? `${onCommand.length} warm VM(s) cut over on command once their full copy is done.`
        : 'No VM of this plan waits for a cutover.'
  return (
    <section data-testid="plan" data-state={plan.state}>
      <h2>
        {plan.name ?? plan.id}{' '}
        <span class={`badge p-${plan.state}`} data-testid="plan-state">
          {plan.state}
        </span>
      </h2>
      <p class="muted mono small">
        {plan.id} · {plan.vms.length} VMs · per source {plan.max_per_source ?? 'no limit'} · created {time(plan.created_at)}
      </p>
      {err && <ErrorBox code="E_CONSOLE_OFFLINE" message={err} />}
      {cutError && <ErrorBox code={cutError.code} message={cutError.message} />}
      <section class="card">
        <h3>
          Shared cutover
          <button class="primary" disabled={!canCut} onClick={() => setConfirming(true)} data-testid="plan-cutover">
            Cut over all
          </button>
        </h3>
        <p data-testid="plan-cutover-text">{cutText}</p>
        <Counts plan={plan} />
      </section>
      <table class="grid-table jobs" data-testid="plan-vms">
        <Head cols={['Key', 'Job', 'State', 'Depends on', 'Blocked by', 'Test boot', 'Cutover']} />
        <tbody>
          {plan.vms.map((v) => {
            const j = jobOf(v.job_id)
            const c = j?.cutover ?? null
            return (
              <tr key={v.key} data-vm={v.key} data-state={v.state}>
                <td>
                  <b>{v.key}</b>
                </td>
                <td>
                  <a href={`#/migrations/${v.job_id}`} data-testid={`vm-job-${v.key}`}>
                    {v.name ?? v.job_id.slice(0, 8)}
                  </a>
                </td>
                <td>
                  <StateBadge state={v.state} />
                </td>
                <td data-testid={`depends-${v.key}`}>{v.depends_on.join(', ') || '–'}</td>
                <td data-testid={`blocked-${v.key}`} class={v.blocked_by.length ? 'err-text' : ''}>
                  {v.blocked_by.join(', ') || '–'}
                </td>
                <td data-testid={`test-boot-${v.key}`} class={v.test_boot === 'failed' ? 'err-text' : ''}>
                  {v.test_boot ?? '–'}
                </td>
                <td class="small">
                  {c === null
                    ? '–'
                    : c.started_at
                      ? `started ${time(c.started_at)}`
                      : c.requested_at
                        ? `requested ${time(c.requested_at)}`
                        : j && waitsForCutover(j)
                          ? `waiting (${c.passes_total} delta ${c.passes_total === 1 ? 'pass' : 'passes'})`
                          : c.mode}
                </td>
              </tr>
            )
          })}
        </tbody>
      </table>
      <ConfirmDialog
        open={confirming}
        testid="plan-cutover"
        confirm="Cut over all"
        keep="Not yet"
        onConfirm={() => void cutover()}
        onClose={() => setConfirming(false)}
      >
        <p>
          Cut over the warm VMs of <b>{plan.name ?? plan.id}</b>? Each waiting source VM is shut down, its final delta copied and its destination
          started; VMs still copying cut over as soon as they reach the wait.
        </p>
      </ConfirmDialog>
    </section>
  )
}
