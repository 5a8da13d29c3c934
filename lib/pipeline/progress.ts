/**
 * Progress accounting of one job (DESIGN.md section 3 `progress`): bytes total/done/zero, rate and
 * ETA per job and per disk, and each disk's durable watermark. Rates are measured over a sliding
 * window of the last 5 seconds. Units: bytes, bytes per second, seconds.
 */
import type { DiskProgress, Progress } from '../job.ts'

const WINDOW_MS = 5000

type Sample = { t: number; done: number }
type DiskState = Omit<DiskProgress, 'rate_bytes_per_s' | 'eta_s'> & { samples: Sample[] }

/** Rate (bytes/s) over the window of `samples` after adding (`now`, `done`), and the ETA for `left` bytes. */
function rateOf(samples: Sample[], now: number, done: number, left: number): { rate: number; eta: number | null } {
  samples.push({ t: now, done })
  while (samples.length > 2 && now - samples[0].t > WINDOW_MS) samples.shift()
  const first = samples[0]
  const dt = (now - first.t) / 1000
  const rate = dt > 0 ? Math.max(0, (done - first.done) / dt) : 0
  return { rate: Math.round(rate), eta: left === 0 ? 0 : rate > 0 ? Math.round(left / rate) : null }
}

/** Accumulates copy progress and produces `Progress` snapshots. */
export class ProgressTracker {
  private readonly disks: DiskState[]
  private readonly samples: Sample[] = []

  /** `disks`: label and capacity of every disk, in copy order; `resumed` watermarks by label. */
  constructor(
    disks: Array<{ label: string; capacity_bytes: number }>,
    resumed: Map<string, number> = new Map(),
    private readonly clock: () => number = () => Date.now(),
  ) {
    this.disks = disks.map((d) => {
      const w = Math.min(resumed.get(d.label) ?? 0, d.capacity_bytes)
      return { label: d.label, capacity_bytes: d.capacity_bytes, bytes_done: w, bytes_zero: 0, watermark: w, bytes_read: 0, samples: [] }
    })
  }

  private disk(label: string): DiskState {
    const d = this.disks.find((x) => x.label === label)
    if (!d) throw new Error(`progress: unknown disk ${label}`)
    return d
  }

  /** Records that `bytes` more of disk `label` were handled (`zeroBytes` of them discarded as zero runs). */
  add(label: string, bytes: number, zeroBytes = 0): void {
    const d = this.disk(label)
    d.bytes_done = Math.min(d.capacity_bytes, d.bytes_done + bytes)
    d.bytes_zero += zeroBytes
  }

  /** Sets the absolute position of disk `label` (bytes handled from its start). */
  setDone(label: string, bytesDone: number): void {
    const d = this.disk(label)
    d.bytes_done = Math.min(d.capacity_bytes, Math.max(d.watermark, bytesDone))
  }

  /** Sets the bytes read from the source for disk `label` by this attempt. */
  setRead(label: string, bytesRead: number): void {
    this.disk(label).bytes_read = bytesRead
  }

  /** Records a durable watermark of disk `label`. */
  setWatermark(label: string, watermark: number): void {
    const d = this.disk(label)
    d.watermark = watermark
    if (d.bytes_done < watermark) d.bytes_done = watermark
  }

  /** Marks disk `label` complete. */
  finish(label: string): void {
    const d = this.disk(label)
    d.bytes_done = d.capacity_bytes
    d.watermark = d.capacity_bytes
  }

  /** A snapshot of the progress at this instant. */
  snapshot(): Progress {
    const now = this.clock()
    const total = this.disks.reduce((s, d) => s + d.capacity_bytes, 0)
    const done = this.disks.reduce((s, d) => s + d.bytes_done, 0)
    const job = rateOf(this.samples, now, done, total - done)
    return {
      bytes_total: total,
      bytes_done: done,
      bytes_zero: this.disks.reduce((s, d) => s + d.bytes_zero, 0),
      rate_bytes_per_s: job.rate,
      eta_s: job.eta,
      disks: this.disks.map(({ samples, ...d }) => {
        const r = rateOf(samples, now, d.bytes_done, d.capacity_bytes - d.bytes_done)
        return { ...d, rate_bytes_per_s: r.rate, eta_s: r.eta }
      }),
    }
  }
}
