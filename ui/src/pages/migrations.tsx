/** The Migrations pages: every job with live progress, and one job in detail. */
import { useEffect, useRef, useState } from 'preact/hooks'
import type { Job, JobState } from '../../../lib/job.ts'
import { api, ApiError } from '../api.ts'
import { Bar, ErrorBox, Head, NoticeBanner, ProgressFigures, StateBadge, ThroughputChart, Timeline, type Sample } from '../components.tsx'
import { CutoverCard } from '../cutover.tsx'
import { TestBootCard } from '../test-boot.tsx'
import { LiveImportLine } from '../live-import.tsx'
import { bytes, duration, rate, time } from '../format.ts'
import { applyProgress, fresher, openStream, TERMINAL, type Connection } from '../live.ts'
import { putJob, useStore } from '../store.ts'

/** What a plan migrates, in a few words. */
export function sourceOf(job: Job): string {
  const r = job.plan.source_ref
  const kind = 'Live' in job.plan.source ? job.plan.source.Live : job.plan.source.Offline
  if (r.kind === 'offline_host_path') return `${kind}: ${r.path}`
  if (r.kind === 'upload') return `${kind}: upload ${r.upload_id.slice(0, 8)}`
  if (r.kind === 'offline_url') return `${kind}: ${r.url}`
  return `${kind}: VM ${r.vm_id}`
}

/** The list of jobs, newest first, each with its state and live progress bar. */
export function MigrationsPage() {
  const { jobs, loadError } = useStore()
  const list = [...jobs.values()].sort((a, b) => b.created_at.localeCompare(a.created_at))
  return (
    <section>
      <h2>Migrations</h2>
      {loadError && <ErrorBox code="E_CONSOLE_OFFLINE" message={loadError} />}
      {list.length === 0 ? (
        <p class="muted">
          No migrations yet. <a href="#/new">Migrate from a file</a> or <a href="#/sources">from a vSphere source</a>.
        </p>
      ) : (
        <table class="grid-table jobs" data-testid="jobs">
          <Head cols={['Name', 'Source', 'State', 'Progress', 'Rate', 'ETA', 'Created']} />
          <tbody>
            {list.map((j) => (
              <tr key={j.id} data-job={j.id} data-state={j.state}>
                <td>
                  <a href={`#/migrations/${j.id}`}>{j.plan.name ?? j.domain ?? j.id.slice(0, 8)}</a>
                  {j.last_error && !j.last_error.fatal && (
                    <span class="notice-dot" title={`${j.last_error.code}: ${j.last_error.message}`}>
                      !
                    </span>
                  )}
                </td>
                <td class="muted">{sourceOf(j)}</td>
                <td>
                  <StateBadge state={j.state} />
                </td>
                <td>
                  <Bar done={j.progress.bytes_done} total={j.progress.bytes_total} zero={j.progress.bytes_zero} state={j.state} />
                  <div class="small muted">
                    {bytes(j.progress.bytes_done)} / {bytes(j.progress.bytes_total)}, {bytes(j.progress.bytes_zero)} zero skipped
                  </div>
                </td>
                <td>{j.status === 'running' ? rate(j.progress.rate_bytes_per_s) : '–'}</td>
                <td>{j.status === 'running' ? duration(j.progress.eta_s) : '–'}</td>
                <td>{time(j.created_at)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  )
}

function SerialLog({ id, auto }: { id: string; auto: boolean }) {
  const [lines, setLines] = useState<string[] | null>(null)
  const [err, setErr] = useState<string | null>(null)
  const load = () =>
    api<{ lines: string[] }>('GET', `/migrations/${id}/serial-log?lines=50`)
      .then((r) => setLines(r.lines))
      .catch((e) => setErr((e as Error).message))
  useEffect(() => {
    if (auto) void load()
  }, [id, auto])
  return (
    <section class="card">
      <h3>
        Serial console <button onClick={() => void load()}>{lines ? 'Refresh' : 'Show tail'}</button>
      </h3>
      {err && <p class="muted">{err}</p>}
      {lines && (lines.length ? <pre class="serial" data-testid="serial-log">{lines.join('\n')}</pre> : <p class="muted">The guest printed nothing on its serial port.</p>)}
    </section>
  )
}

/** One job: live progress, per-disk bars, throughput chart, state timeline, errors, Cancel. */
export function JobPage({ id }: { id: string }) {
  const store = useStore()
  const [job, setJobState] = useState<Job | null>(store.jobs.get(id) ?? null)
  const setJob = (next: Job) => setJobState((j) => fresher(j, next))
  const [missing, setMissing] = useState<string | null>(null)
  const [samples, setSamples] = useState<Sample[]>([])
  const [entered, setEntered] = useState<Map<JobState, string>>(new Map())
  const [conn, setConn] = useState<Connection>('connecting')
  const [confirming, setConfirming] = useState(false)
  const [cancelError, setCancelError] = useState<ApiError | null>(null)
  const dialog = useRef<HTMLDialogElement>(null)

  useEffect(() => {
    setSamples([])
    setEntered(new Map())
    const enter = (s: JobState, at: string) => setEntered((m) => (m.has(s) ? m : new Map(m).set(s, at)))
    const refresh = () =>
      api<Job>('GET', `/migrations/${id}`)
        .then((j) => {
          setJob(j)
          enter('Queued', j.created_at)
          enter(j.state, j.updated_at)
          putJob(j)
        })
        .catch((e) => e instanceof ApiError && e.status === 404 && setMissing(e.message))
    // the job's whole kept history (from event 0), then live: the chart and timeline of a finished job too
    return openStream(
      { id, from: 0 },
      {
        migration(j) {
          setJob(j)
          enter(j.state, j.updated_at)
        },
        progress(p) {
          setJobState((j) => (j ? applyProgress(j, p) : j))
          const t = p.at ? Date.parse(p.at) : Date.now()
          setSamples((s) => (s.length && s[s.length - 1]!.t >= t ? s : [...s, { t, rate: p.progress.rate_bytes_per_s, done: p.progress.bytes_done }]))
        },
        connection: setConn,
        open: () => void refresh(),
      },
    )
  }, [id])

  useEffect(() => {
    const d = dialog.current
    if (!d) return
    if (confirming && !d.open) d.showModal()
    if (!confirming && d.open) d.close()
  }, [confirming])

  if (missing) return <ErrorBox code="E_MIG_NOT_FOUND" message={missing} />
  if (!job) return <p class="muted">Loading…</p>

  // a live import whose guest runs: the operator chooses what becomes of the guest and its writes
  const liveGuest = !!job.plan.live_import && job.state === 'CopyingFull' && !!job.hardware?.boot
  const cancel = async (guest?: 'finish' | 'destroy') => {
    setConfirming(false)
    try {
      setJob(await api<Job>('POST', `/migrations/${id}/cancel`, guest ? { live_guest: guest } : undefined))
    } catch (e) {
      setCancelError(e as ApiError)
    }
  }
  const p = job.progress
  const le = job.last_error
  const failedBoot = job.state === 'Failed' && job.domain !== null
  return (
    <section data-testid="job" data-state={job.state}>
      <h2>
        {job.plan.name ?? job.domain ?? job.id} <StateBadge state={job.state} />
        {conn === 'lost' && <span class="muted small"> (updates paused)</span>}
      </h2>
      <p class="muted mono small" data-testid="job-meta">
        {job.id} · {sourceOf(job)} · {job.strategy}, {job.effective_mode.toLowerCase()}
        {job.plan.mode !== job.effective_mode ? ` (asked ${job.plan.mode.toLowerCase()})` : ''}
        {job.bulk_plan_id && (
          <>
            {' · '}
            <a href={`#/plans/${job.bulk_plan_id}`} data-testid="job-plan">
              plan {job.bulk_plan_id.slice(0, 8)}, VM {job.bulk_key}
            </a>
          </>
        )}
      </p>
      {le && !le.fatal && <NoticeBanner code={le.code} message={le.message} />}
      {le && le.fatal && <ErrorBox code={le.code} message={le.message} />}
      {cancelError && <ErrorBox code={cancelError.code} message={cancelError.message} />}
      <section class="card">
        <h3>Progress</h3>
        <LiveImportLine job={job} />
        <Bar done={p.bytes_done} total={p.bytes_total} zero={p.bytes_zero} state={job.state} testid="job-bar" />
        <ProgressFigures job={job} />
        {p.disks.length > 0 && (
          <div class="disks" data-testid="disk-bars">
            {p.disks.map((d) => (
              <div class="disk" key={d.label}>
                <div class="small">
                  <b>{d.label}</b> {bytes(d.bytes_done)} / {bytes(d.capacity_bytes)}, {bytes(d.bytes_zero)} zero
                  {job.status === 'running' && d.rate_bytes_per_s > 0 ? `, ${rate(d.rate_bytes_per_s)}, ETA ${duration(d.eta_s)}` : ''}
                  <span class="muted"> · durable to {bytes(d.watermark)}</span>
                </div>
                <Bar done={d.bytes_done} total={d.capacity_bytes} zero={d.bytes_zero} state={job.state} />
              </div>
            ))}
          </div>
        )}
        {!TERMINAL.has(job.state) && (
          <button class="danger" onClick={() => setConfirming(true)} data-testid="cancel">
            Cancel migration
          </button>
        )}
      </section>
      <CutoverCard
        job={job}
        onJob={(j) => {
          setJob(j)
          putJob(j)
        }}
      />
      <TestBootCard
        job={job}
        onJob={(j) => {
          setJob(j)
          putJob(j)
        }}
      />
      <section class="card">
        <h3>Throughput</h3>
        <ThroughputChart samples={samples} />
      </section>
      <section class="card">
        <h3>Timeline</h3>
        <Timeline job={job} entered={entered} />
        <dl class="kv">
          <dt>Created</dt>
          <dd>{time(job.created_at)}</dd>
          <dt>Started</dt>
          <dd>{time(job.started_at)}</dd>
          <dt>Finished</dt>
          <dd>{time(job.finished_at)}</dd>
          <dt>Domain</dt>
          <dd data-testid="domain">{job.domain ?? 'not defined yet'}</dd>
          {job.restore_point && (
            <>
              <dt>Restore point</dt>
              <dd class="mono">
                {job.restore_point.restore_point_id}
                {job.restore_point.quiesced ? ' (quiesced)' : ''}
              </dd>
            </>
          )}
        </dl>
      </section>
      {job.domain && <SerialLog id={job.id} auto={failedBoot} />}
      <details class="card">
        <summary>Plan</summary>
        <pre>{JSON.stringify(job.plan, null, 2)}</pre>
      </details>
      <dialog ref={dialog} onClose={() => setConfirming(false)} data-testid="cancel-dialog">
        {liveGuest ? (
          <p>
            Cancel <b>{job.plan.name ?? job.id}</b>? Its guest {job.domain} already runs here and may have written. Finish the copy: the
            guest keeps running and moves onto its volumes, the migration completes. Destroy the guest: it and what it wrote are removed
            with the volumes.
          </p>
        ) : (
          <p>
            Cancel <b>{job.plan.name ?? job.id}</b>? The copy stops and the volumes written so far are removed.
          </p>
        )}
        <div class="actions">
          <button onClick={() => setConfirming(false)}>Keep running</button>
          {liveGuest && (
            <button onClick={() => void cancel('finish')} data-testid="confirm-cancel-finish">
              Finish the copy
            </button>
          )}
          <button class="danger" onClick={() => void cancel(liveGuest ? 'destroy' : undefined)} data-testid="confirm-cancel">
            {liveGuest ? 'Destroy the guest' : 'Cancel migration'}
          </button>
        </div>
      </dialog>
    </section>
  )
}
