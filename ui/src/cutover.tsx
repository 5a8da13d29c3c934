/**
 * The warm phase of a live job on its page (plan `cutover`, roadmap v0.6, docs/architecture.md "Warm
 * cutover on command"): how the job cuts over, its delta passes while it waits in `DeltaSyncing` (the
 * last pass's time, changed bytes and duration), the projected downtime of a cutover now, and
 * the **Cut over** button (with confirmation) that sends `POST /migrations/:id/cutover`.
 */
import { useState } from 'preact/hooks'
import type { CutoverStatus, Job } from '../../lib/job.ts'
import { api, ApiError } from './api.ts'
import { ErrorBox } from './components.tsx'
import { ConfirmDialog } from './confirm.tsx'
import { bytes, duration, rate, time } from './format.ts'

/**
 * True when `job` waits in `DeltaSyncing` for an operator's cutover (mode `manual`, or
 * `scheduled` before its time) that nobody has asked for yet: what `POST .../cutover` accepts.
 */
export function waitsForCutover(job: Job): boolean {
  const c = job.cutover
  return job.state === 'DeltaSyncing' && c !== null && c.mode !== 'auto' && c.requested_at === null
}

/** Seconds with a decimal below 10 s (a delta pass takes fractions of a second), else as `duration`. */
function secs(s: number): string {
  return s < 10 ? `${s.toFixed(1)} s` : duration(s)
}

function modeText(c: CutoverStatus): string {
  if (c.mode === 'auto') return 'automatic: when a delta pass is small enough'
  if (c.mode === 'manual') return 'on the operator’s command'
  return `scheduled at ${time(c.at)} (or earlier on command)`
}

/** What the cutover card says about the job's position in the warm phase. */
function phaseText(job: Job, c: CutoverStatus): string {
  if (c.started_at) return `Cutover started ${time(c.started_at)}: the source VM is shut down, the final delta copied, then the destination started.`
  if (c.requested_at) return `Cutover requested ${time(c.requested_at)}; it starts after the pass under way.`
  if (c.mode === 'auto') return 'The job cuts over by itself when the deltas converge.'
  if (job.state === 'DeltaSyncing') return 'Waiting for the cutover: the source VM keeps running and a delta pass keeps the copy warm.'
  if (job.state === 'Queued' || job.state === 'CopyingFull') return 'The cutover can be started once the full copy is done and the job waits in DeltaSyncing.'
  return 'The job no longer waits for a cutover.'
}

/** The warm phase card of `job` (warm live jobs only); `onJob` receives the answer of the cutover. */
export function CutoverCard({ job, onJob }: { job: Job; onJob(j: Job): void }) {
  const [confirming, setConfirming] = useState(false)
  const [error, setError] = useState<ApiError | null>(null)
  const [sending, setSending] = useState(false)
  const c = job.cutover
  if (!c) return null
  const last = c.passes.length ? c.passes[c.passes.length - 1]! : null
  const pd = c.projected_downtime
  const waiting = waitsForCutover(job)
  const manual = c.mode !== 'auto'
  const cutover = async () => {
    setConfirming(false)
    setSending(true)
    setError(null)
    try {
      onJob(await api<Job>('POST', `/migrations/${job.id}/cutover`))
    } catch (e) {
      setError(e instanceof ApiError ? e : new ApiError('E_CONSOLE', (e as Error).message, 0))
    } finally {
      setSending(false)
    }
  }
  return (
    <section class="card" data-testid="cutover" data-waiting={String(waiting)} data-mode={c.mode}>
      <h3>Warm cutover</h3>
      <p data-testid="cutover-phase">{phaseText(job, c)}</p>
      {error && <ErrorBox code={error.code} message={error.message} />}
      <dl class="kv">
        <dt>Cutover</dt>
        <dd>{modeText(c)}</dd>
        {c.precopy_interval_seconds !== null && (
          <>
            <dt>Delta pass every</dt>
            <dd>{duration(c.precopy_interval_seconds)}</dd>
          </>
        )}
        <dt>Delta passes</dt>
        <dd data-testid="cutover-passes" data-passes={c.passes_total}>
          {c.passes_total}
        </dd>
        <dt>Last delta sync</dt>
        <dd data-testid="cutover-last-pass">
          {last
            ? `${time(last.started_at)}: ${bytes(last.changed_bytes)} changed, pass took ${secs(last.duration_s)}${last.rate_bytes_per_s ? ` (copy at ${rate(last.rate_bytes_per_s)})` : ''}`
            : 'none yet'}
        </dd>
        {pd && (
          <>
            <dt>Projected downtime</dt>
            <dd data-testid="cutover-downtime" title="guest shutdown + final delta (snapshot, copy) + start">
              {duration(pd.total_s)}: shutdown ≤ {duration(pd.shutdown_s)}, final delta {bytes(pd.final_delta_bytes)} in {secs(pd.snapshot_s + pd.copy_s)}, start {duration(pd.start_s)}
            </dd>
          </>
        )}
      </dl>
      {c.passes.length > 1 && (
        <details>
          <summary class="small">Last {c.passes.length} delta passes</summary>
          <table class="grid-table small">
            <thead>
              <tr>
                <th>Pass</th>
                <th>Started</th>
                <th>Changed</th>
                <th>Duration</th>
              </tr>
            </thead>
            <tbody>
              {c.passes.map((p) => (
                <tr key={p.pass}>
                  <td>{p.pass}</td>
                  <td>{time(p.started_at)}</td>
                  <td>{bytes(p.changed_bytes)}</td>
                  <td>{secs(p.duration_s)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </details>
      )}
      {manual && !c.started_at && !c.requested_at && (
        <button class="primary cutover-button" disabled={!waiting || sending} onClick={() => setConfirming(true)} data-testid="cutover-button">
          Cut over
        </button>
      )}
      <ConfirmDialog
        open={confirming}
        testid="cutover"
        confirm="Cut over now"
        keep="Not yet"
        onConfirm={() => void cutover()}
        onClose={() => setConfirming(false)}
      >
        <p>
          Cut over <b>{job.plan.name ?? job.id}</b> now? The source VM is shut down (powered off after the shutdown timeout), the final delta
          is copied, then the destination takes over.
        </p>
        {pd && <p class="small muted">Projected downtime: {duration(pd.total_s)}.</p>}
      </ConfirmDialog>
    </section>
  )
}
