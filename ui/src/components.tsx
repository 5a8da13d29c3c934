/** Small shared views: progress bars, notice banner, error box, throughput chart, manifest. */
import type { ComponentChildren } from 'preact'
import type { Job, JobState } from '../../lib/job.ts'
import type { VmManifest } from '../../lib/manifest.ts'
import { bytes, duration, percent, rate, time } from './format.ts'

/** A table head with the column titles `cols`. */
export function Head({ cols }: { cols: string[] }) {
  return (
    <thead>
      <tr>
        {cols.map((c, i) => (
          <th key={i}>{c}</th>
        ))}
      </tr>
    </thead>
  )
}

/** A labelled bar: `done` of `total` bytes, with an optional zero-skipped share. */
export function Bar(props: { done: number; total: number; zero?: number; state?: JobState; testid?: string }) {
  const p = percent(props.done, props.total)
  const z = props.zero ? percent(props.zero, props.total) : 0
  const cls = props.state === 'Failed' ? 'bar failed' : props.state === 'Cancelled' ? 'bar cancelled' : props.state === 'Completed' ? 'bar done' : 'bar'
  return (
    <div class={cls} role="progressbar" aria-valuemin={0} aria-valuemax={100} aria-valuenow={Math.round(p)} data-testid={props.testid}>
      <div class="fill" style={{ width: `${p}%` }} />
      {z > 0 && <div class="zero" style={{ width: `${Math.min(z, p)}%` }} title="zero bytes skipped" />}
      <span class="bar-label">{p.toFixed(0)}%</span>
    </div>
  )
}

/** The progress figures of a job: bytes done/total, zero skipped, rate, ETA. */
export function ProgressFigures({ job }: { job: Job }) {
  const p = job.progress
  const running = job.status === 'running'
  return (
    <div class="figures" data-testid="figures">
      <span>
        <b>{bytes(p.bytes_done)}</b> of {bytes(p.bytes_total)}
      </span>
      <span>{bytes(p.bytes_zero)} zero, skipped</span>
      {running && <span>{rate(p.rate_bytes_per_s)}</span>}
      {running && <span>ETA {duration(p.eta_s)}</span>}
    </div>
  )
}

/** The state as a coloured badge. */
export function StateBadge({ state }: { state: JobState }) {
  return (
    <span class={`badge s-${state}`} data-testid="state">
      {state}
    </span>
  )
}

/** A non-fatal notice (spec 1.4, 6: "the UI shows the message as a banner"). */
export function NoticeBanner({ code, message }: { code: string; message: string }) {
  return (
    <div class="banner" role="status" data-testid="notice-banner">
      <b>{code}</b> {message}
    </div>
  )
}

/** An error with its E_MIG_* code. */
export function ErrorBox({ code, message, children }: { code: string; message: string; children?: ComponentChildren }) {
  return (
    <div class="error" role="alert" data-testid="error">
      <b class="code">{code}</b> {message}
      {children}
    </div>
  )
}

/** One throughput sample: time (ms since the epoch) and rate in bytes per second. */
export interface Sample {
  t: number
  rate: number
  done: number
}

/** Throughput over time as an SVG area chart (rate in MiB/s against seconds since the first sample). */
export function ThroughputChart({ samples }: { samples: Sample[] }) {
  const W = 640
  const H = 180
  const L = 56
  const B = 24
  if (samples.length < 2) return <p class="muted" data-testid="chart-empty">Not enough progress samples to chart yet.</p>
  const t0 = samples[0]!.t
  const span = Math.max(1, samples[samples.length - 1]!.t - t0)
  const peak = Math.max(1, ...samples.map((s) => s.rate))
  const x = (t: number) => L + ((t - t0) / span) * (W - L - 8)
  const y = (r: number) => H - B - (r / peak) * (H - B - 10)
  const line = samples.map((s) => `${x(s.t).toFixed(1)},${y(s.rate).toFixed(1)}`).join(' ')
  const area = `${L},${H - B} ${line} ${x(samples[samples.length - 1]!.t).toFixed(1)},${H - B}`
  return (
    <svg class="chart" viewBox={`0 0 ${W} ${H}`} role="img" aria-label="throughput over time" data-testid="chart" data-samples={samples.length}>
      <line x1={L} y1={H - B} x2={W - 8} y2={H - B} class="axis" />
      <line x1={L} y1={10} x2={L} y2={H - B} class="axis" />
      <line x1={L} y1={y(peak)} x2={W - 8} y2={y(peak)} class="grid" />
      <polygon points={area} class="area" />
      <polyline points={line} class="line" />
      <text x={L - 6} y={y(peak) + 4} text-anchor="end">{rate(peak)}</text>
      <text x={L - 6} y={H - B + 4} text-anchor="end">0</text>
      <text x={L} y={H - 6}>0 s</text>
      <text x={W - 8} y={H - 6} text-anchor="end">{duration(span / 1000)}</text>
    </svg>
  )
}

/** The states a job goes through, by its strategy and effective mode. */
export function flowOf(job: Job): JobState[] {
  const warm = job.strategy === 'live' && job.effective_mode === 'Warm'
  const copy: JobState[] = warm ? ['CopyingFull', 'DeltaSyncing', 'CuttingOver'] : ['CopyingFull']
  const v2v: JobState[] = job.plan.guest_os === 'windows' ? ['V2vProcessing'] : []
  return ['Queued', ...copy, ...v2v, 'Starting', 'Completed']
}

/** The state timeline: states passed (with the time each was entered), the current one, those to come. */
export function Timeline({ job, entered }: { job: Job; entered: Map<JobState, string> }) {
  const flow = flowOf(job)
  const visited = [...entered.keys()]
  const states: JobState[] = [...flow]
  for (const s of visited) if (!states.includes(s)) states.push(s)
  if (job.state === 'Failed' || job.state === 'Cancelled') {
    // after the failure nothing else comes: keep what was reached, then the terminal state
    const reached = states.filter((s) => entered.has(s) && s !== job.state)
    states.splice(0, states.length, ...reached, job.state)
  }
  return (
    <ol class="timeline" data-testid="timeline">
      {states.map((s) => {
        const cls = s === job.state ? `current s-${s}` : entered.has(s) ? 'done' : 'todo'
        return (
          <li class={cls} key={s}>
            <span class="dot" />
            <span class="st">{s}</span>
            <span class="at">{entered.has(s) ? time(entered.get(s)) : ''}</span>
          </li>
        )
      })}
    </ol>
  )
}

/** A manifest: name, firmware, guest OS, CPU and memory, disks with capacities, NICs with MACs. */
export function ManifestView({ kind, manifest }: { kind: string; manifest: VmManifest }) {
  return (
    <section class="card" data-testid="manifest">
      <h3>
        {manifest.name} <span class="muted">({kind})</span>
      </h3>
      <dl class="kv">
        <dt>Firmware</dt>
        <dd data-testid="firmware">
          {manifest.firmware}
          {manifest.secure_boot ? ', Secure Boot' : ''}
        </dd>
        <dt>Guest OS</dt>
        <dd data-testid="guest-os">
          {manifest.guest_os.family}
          {manifest.guest_os.id ? ` (${manifest.guest_os.id})` : ''}
        </dd>
        <dt>CPU</dt>
        <dd>
          {manifest.cpu.count} vCPU ({manifest.cpu.cores_per_socket} per socket)
        </dd>
        <dt>Memory</dt>
        <dd>{bytes(manifest.memory_bytes)}</dd>
        <dt>CBT</dt>
        <dd>{manifest.cbt_available ? 'available' : 'not available'}</dd>
      </dl>
      <h4>Disks</h4>
      <table class="grid-table" data-testid="disks">
        <Head cols={['Label', 'Capacity', 'Format', 'Controller']} />
        <tbody>
          {manifest.disks.map((d) => (
            <tr key={d.label}>
              <td>{d.label}</td>
              <td>{bytes(d.capacity_bytes)}</td>
              <td>{d.disk_format}</td>
              <td>{d.controller}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h4>Network adapters</h4>
      {manifest.nics.length === 0 ? (
        <p class="muted">None.</p>
      ) : (
        <table class="grid-table" data-testid="nics">
          <Head cols={['Label', 'MAC', 'Model', 'Network']} />
          <tbody>
            {manifest.nics.map((n) => (
              <tr key={n.label}>
                <td>{n.label}</td>
                <td class="mono">{n.mac ?? 'generated'}</td>
                <td>{n.model}</td>
                <td>{n.network ?? '–'}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {manifest.warnings.length > 0 && (
        <ul class="warnings">
          {manifest.warnings.map((w) => (
            <li key={w}>{w}</li>
          ))}
        </ul>
      )}
    </section>
  )
}
