/**
 * Progress accounting of one job (DESIGN.md section 3 `progress`): bytes total/done/zero, rate and
 * ETA per job, bytes done and watermark per disk. Rate is measured over a sliding window of the
 * last 5 seconds. Units: bytes, bytes per second, seconds.
 */
import type { DiskProgress, Progress } from '../job.ts'

const WINDOW_MS = 5000

/** Accumulates copy progress and produces `Progress` snapshots. */
export class ProgressTracker {
  private readonly disks: DiskProgress[]
  private zero = 0
  private samples: Array<{ t: number; done: number }> = []

  /** `disks`: label and capacity of every disk, in copy order; `resumed` watermarks by label. */
  constructor(disks: Array<{ label: string; capacity_bytes: number }>, resumed: Map<string, number> = new Map(), private readonly clock: () => number = () => Date.now()) {
    this.disks = disks.map((d) => {
      const w = Math.min(resumed.get(d.label) ?? 0, d.capacity_bytes)
      return { label: d.label, capacity_bytes: d.capacity_bytes, bytes_done: w, watermark: w }
    })
  }

  private disk(label: string): DiskProgress {
    const d = this.disks.find((x) => x.label === label)
    if (!d) throw new Error(`progress: unknown disk ${label}`)
    return d
  }

  /** Records that `bytes` more of disk `label` were handled (`zeroBytes` of them discarded as zero runs). */
  add(label: string, bytes: number, zeroBytes = 0): void {
    const d = this.disk(label)
    d.bytes_done = Math.min(d.capacity_bytes, d.bytes_done + bytes)
    this.zero += zeroBytes
  }

  /** Sets the absolute position of disk `label` (bytes handled from its start). */
  setDone(label: string, bytesDone: number): void {
    const d = this.disk(label)
    d.bytes_done = Math.min(d.capacity_bytes, Math.max(d.watermark, bytesDone))
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
    this.samples.push({ t: now, done })
    while (this.samples.length > 2 && now - this.samples[0].t > WINDOW_MS) this.samples.shift()
    const first = this.samples[0]
    const dt = (now - first.t) / 1000
    const rate = dt > 0 ? Math.max(0, (done - first.done) / dt) : 0
    const left = total - done
    return {
      bytes_total: total,
      bytes_done: done,
      bytes_zero: this.zero,
      rate_bytes_per_s: Math.round(rate),
      eta_s: left === 0 ? 0 : rate > 0 ? Math.round(left / rate) : null,
      disks: this.disks.map((d) => ({ ...d })),
    }
  }
}
