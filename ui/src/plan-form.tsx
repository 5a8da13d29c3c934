/**
 * The plan form (name, mode, networks -> bridges, start, restore point) that submits
 * `POST /migrations`; `E_MIG_INVALID_PLAN` issues (`details.issues[].path`) are shown next to
 * the field they name, the rest above the button. The server is the only validator.
 */
import { useState } from 'preact/hooks'
import type { Job } from '../../lib/job.ts'
import type { VmManifest } from '../../lib/manifest.ts'
import type { Plan } from '../../lib/plan.ts'
import { api, ApiError, type FieldIssue } from './api.ts'
import { ErrorBox } from './components.tsx'

/** A default domain name from a manifest name, in the plan's `name` alphabet. */
export function defaultName(name: string): string {
  return name.replace(/[^A-Za-z0-9._-]+/g, '-').replace(/^[^A-Za-z0-9]+/, '').slice(0, 63)
}

/** The form field a plan issue path belongs to (`plan.networks.1.bridge` -> `networks.1`). */
export function fieldOf(path: string): string {
  const p = path.replace(/^plan\./, '')
  const m = /^networks\.(\d+)/.exec(p)
  if (m) return `networks.${m[1]}`
  return p.split('.')[0]!
}

function FieldError({ issues, field }: { issues: FieldIssue[]; field: string }) {
  const mine = issues.filter((i) => fieldOf(i.path) === field)
  if (!mine.length) return null
  return (
    <div class="field-error" role="alert" data-testid={`field-error-${field}`}>
      {mine.map((i) => (
        <div key={i.path}>
          {i.message} <span class="mono muted">({i.path})</span>
        </div>
      ))}
    </div>
  )
}

/**
 * `base` holds `source` and `source_ref`; `live` allows choosing Warm. Calls `onSubmitted`
 * with the created job.
 */
export function PlanForm(props: { base: Pick<Plan, 'source' | 'source_ref'>; manifest: VmManifest; live: boolean; onSubmitted(job: Job): void }) {
  const { manifest } = props
  const [name, setName] = useState(defaultName(manifest.name))
  const [mode, setMode] = useState<'Warm' | 'Cold'>(props.live && manifest.cbt_available ? 'Warm' : 'Cold')
  const [start, setStart] = useState(true)
  const [bridges, setBridges] = useState<string[]>(manifest.nics.map(() => ''))
  const [backupJob, setBackupJob] = useState('')
  const [quiesced, setQuiesced] = useState(false)
  const [issues, setIssues] = useState<FieldIssue[]>([])
  const [error, setError] = useState<ApiError | null>(null)
  const [busy, setBusy] = useState(false)

  // NICs the operator mapped, in the order they are sent (to put `networks.N` issues back on the right row)
  const mapped = manifest.nics.map((n, i) => ({ i, source: n.network ?? n.label, bridge: bridges[i]!.trim() })).filter((n) => n.bridge !== '')

  async function submit(e: Event) {
    e.preventDefault()
    setBusy(true)
    setIssues([])
    setError(null)
    const plan: Record<string, unknown> = { ...props.base, mode, start }
    if (name.trim() !== '') plan.name = name.trim()
    if (mapped.length) plan.networks = mapped.map((n) => ({ source: n.source, bridge: n.bridge }))
    if (backupJob.trim() !== '') plan.restore_point = { backup_job_id: backupJob.trim(), ...(quiesced ? { require_quiesced: true } : {}) }
    try {
      props.onSubmitted(await api<Job>('POST', '/migrations', { plan }))
    } catch (err) {
      const ae = err instanceof ApiError ? err : new ApiError('E_CONSOLE', String(err), 0)
      // issue paths name the submitted networks array: map them to the NIC rows of the form
      const got = (ae.details?.issues ?? []).map((i) => {
        const m = /^plan\.networks\.(\d+)(.*)$/.exec(i.path)
        return m && mapped[Number(m[1])] ? { ...i, path: `plan.networks.${mapped[Number(m[1])]!.i}${m[2]}` } : i
      })
      setIssues(got)
      setError(ae)
    } finally {
      setBusy(false)
    }
  }

  const known = new Set(['name', 'mode', 'start', 'restore_point', ...manifest.nics.map((_, i) => `networks.${i}`)])
  const other = issues.filter((i) => !known.has(fieldOf(i.path)))

  return (
    <form class="card plan-form" onSubmit={submit} data-testid="plan-form">
      <h3>Migration plan</h3>
      <label>
        Domain name
        <input name="name" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} placeholder={defaultName(manifest.name)} />
      </label>
      <FieldError issues={issues} field="name" />
      <fieldset>
        <legend>Mode</legend>
        <label class="inline">
          <input type="radio" name="mode" value="Cold" checked={mode === 'Cold'} onChange={() => setMode('Cold')} /> Cold
        </label>
        <label class="inline">
          <input type="radio" name="mode" value="Warm" checked={mode === 'Warm'} disabled={!props.live} onChange={() => setMode('Warm')} /> Warm
          {!props.live && <span class="muted"> (live sources only: a file has no changed-block tracking)</span>}
          {props.live && !manifest.cbt_available && <span class="muted"> (no CBT on this VM: the job will run cold)</span>}
        </label>
      </fieldset>
      <FieldError issues={issues} field="mode" />
      {manifest.nics.length > 0 && (
        <fieldset>
          <legend>Networks → bridges</legend>
          {manifest.nics.map((n, i) => (
            <div key={n.label}>
              <label>
                {n.label} <span class="mono muted">{n.mac ?? ''}</span> {n.network ? `on ${n.network}` : ''}
                <input name={`bridge-${i}`} value={bridges[i]} placeholder="bridge (empty: the default)" onInput={(e) => setBridges(bridges.map((b, j) => (j === i ? (e.target as HTMLInputElement).value : b)))} />
              </label>
              <FieldError issues={issues} field={`networks.${i}`} />
            </div>
          ))}
        </fieldset>
      )}
      <label class="inline">
        <input type="checkbox" name="start" checked={start} onChange={(e) => setStart((e.target as HTMLInputElement).checked)} /> Start the domain when the copy is done
      </label>
      <FieldError issues={issues} field="start" />
      <fieldset>
        <legend>Restore point (optional)</legend>
        <label>
          Backup job id
          <input name="backup_job_id" value={backupJob} placeholder="UUID of a host backup job" onInput={(e) => setBackupJob((e.target as HTMLInputElement).value)} />
        </label>
        <label class="inline">
          <input type="checkbox" name="require_quiesced" checked={quiesced} onChange={(e) => setQuiesced((e.target as HTMLInputElement).checked)} /> Require a quiesced restore point
        </label>
        <FieldError issues={issues} field="restore_point" />
      </fieldset>
      {error && (issues.length === 0 || other.length > 0) && <ErrorBox code={error.code} message={other.length ? other.map((i) => `${i.path}: ${i.message}`).join('; ') : error.message} />}
      <button type="submit" class="primary" disabled={busy} data-testid="submit-plan">
        {busy ? 'Submitting…' : 'Start migration'}
      </button>
    </form>
  )
}
