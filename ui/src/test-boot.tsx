/**
 * The test boot card of a job's page (docs/test-boot.md): whether the job can test-boot now (a warm
 * job waiting in `DeltaSyncing` for its cutover, or a job `Completed` with `plan.start: false`),
 * the **Test boot** button (`POST /migrations/:id/test-boot`), and the latest test boot: its
 * state, duration, boot evidence, hardware, the plan's checks' results, notice and serial tail, or
 * why it failed.
 */
import { useState } from 'preact/hooks'
import type { Job, TestBootRecord } from '../../lib/job.ts'
import { api, ApiError } from './api.ts'
import { ErrorBox } from './components.tsx'
import { waitsForCutover } from './cutover.tsx'
import { time } from './format.ts'

/** True when `POST /migrations/:id/test-boot` accepts `job` now (the server decides; this only enables the button). */
export function canTestBoot(job: Job): boolean {
  const busy = job.test_boot?.state === 'requested' || job.test_boot?.state === 'running'
  return !busy && (waitsForCutover(job) || (job.state === 'Completed' && job.plan.start === false && job.domain !== null))
}

function stateText(tb: TestBootRecord): string {
  switch (tb.state) {
    case 'requested':
      return `Requested ${time(tb.requested_at)}; a warm job starts it after its delta pass under way.`
    case 'running':
      return `Running since ${time(tb.started_at)}: the clone ${tb.domain} boots off the migration's networks while the source keeps running.`
    case 'passed':
      return `Passed ${time(tb.finished_at)} in ${tb.seconds} s: ${tb.verified ? 'boot verified' : 'boot not verified'} (${tb.evidence}).`
    case 'failed':
      return `Failed ${time(tb.finished_at)} after ${tb.seconds} s. The migration goes on: read why before cutting over.`
    default:
      return `Cancelled ${time(tb.finished_at)}: ${tb.error ?? ''}`
  }
}

/** The test boot card of `job`; shown when the job can test-boot or has a test boot recorded. */
export function TestBootCard({ job, onJob }: { job: Job; onJob(j: Job): void }) {
  const [error, setError] = useState<ApiError | null>(null)
  const [sending, setSending] = useState(false)
  const tb = job.test_boot
  const can = canTestBoot(job)
  if (!tb && !can) return null
  const send = async () => {
    setSending(true)
    setError(null)
    try {
      onJob(await api<Job>('POST', `/migrations/${job.id}/test-boot`))
    } catch (e) {
      setError(e instanceof ApiError ? e : new ApiError('E_CONSOLE', (e as Error).message, 0))
    } finally {
      setSending(false)
    }
  }
  return (
    <section class="card" data-testid="test-boot" data-state={tb?.state ?? 'none'}>
      <h3>Test boot</h3>
      <p class="small muted">
        Boots a disposable clone of the destination disks ({tb?.clone ?? 'qcow2 overlay or ZFS clone'}) as its own domain, never on the migration's
        networks (with the plan's checks, on an isolated network of its own where they run), while the source keeps running; then removes it. The
        migration is not touched.
      </p>
      {error && <ErrorBox code={error.code} message={error.message} />}
      {tb && (
        <>
          <p data-testid="test-boot-state">{stateText(tb)}</p>
          {tb.error && tb.state === 'failed' && <pre class="small" data-testid="test-boot-error">{tb.error}</pre>}
          {tb.notice && (
            <p class="small" data-testid="test-boot-notice">
              Notice: {tb.notice}
            </p>
          )}
          {tb.hardware?.checks && tb.hardware.checks.length > 0 && (
            <ul class="small" data-testid="test-boot-checks">
              {tb.hardware.checks.map((c) => (
                <li key={c.name}>
                  {c.name}: {c.ok ? 'passed' : 'failed'} ({c.target ?? c.kind}: {c.result})
                </li>
              ))}
            </ul>
          )}
          {tb.hardware && (
            <dl class="kv small">
              <dt>Hardware</dt>
              <dd>
                disk bus {tb.hardware.disk_bus}, {tb.hardware.firmware}
              </dd>
              <dt>Why</dt>
              <dd>{tb.hardware.reason}</dd>
            </dl>
          )}
          {tb.serial_tail.length > 0 && (
            <details>
              <summary class="small">Serial console (last {tb.serial_tail.length} lines)</summary>
              <pre class="small">{tb.serial_tail.join('\n')}</pre>
            </details>
          )}
        </>
      )}
      {(can || tb?.state === 'requested' || tb?.state === 'running') && (
        <button class="primary" disabled={!can || sending} onClick={() => void send()} data-testid="test-boot-button">
          {tb ? 'Test boot again' : 'Test boot'}
        </button>
      )}
    </section>
  )
}
