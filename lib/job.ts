/**
 * The migration job resource (spec 2.3, 3; DESIGN.md section 3).
 */
import type { Plan } from './plan.ts'
import type { ErrorCode } from './errors.ts'

/** Job states: spec section 3's phases plus `Queued` (initial), `Failed`, `Cancelled`. */
export const JOB_STATES = [
  'Queued',
  'CopyingFull',
  'DeltaSyncing',
  'CuttingOver',
  'V2vProcessing',
  'Starting',
  'Completed',
  'Failed',
  'Cancelled',
] as const
export type JobState = (typeof JOB_STATES)[number]

/** Coarse status derived from the state. */
export type JobStatus = 'queued' | 'running' | 'completed' | 'failed' | 'cancelled'

/** States after which a job never moves again. */
export const TERMINAL_STATES: readonly JobState[] = ['Completed', 'Failed', 'Cancelled']

/** The status of a state: Queued -> queued, the phases -> running, terminal states by name. */
export function statusOf(state: JobState): JobStatus {
  switch (state) {
    case 'Queued':
      return 'queued'
    case 'Completed':
      return 'completed'
    case 'Failed':
      return 'failed'
    case 'Cancelled':
      return 'cancelled'
    default:
      return 'running'
  }
}

/** Per-disk progress; all values are bytes. `watermark` is the durable copy position. */
export interface DiskProgress {
  label: string
  capacity_bytes: number
  bytes_done: number
  /** Bytes of this disk found zero and discarded instead of written (counted in `bytes_done`). */
  bytes_zero: number
  /** Bytes per second over the last 5 s, and seconds left at that rate (null when unknown). */
  rate_bytes_per_s: number
  eta_s: number | null
  /** Bytes durably written (flushed) from the start of the disk: a resumed copy starts here. */
  watermark: number
  /**
   * Bytes read from the source for this disk by the current worker attempt (reset when a worker
   * resumes the job; the last attempt's figure once the job ended). A resumed copy reads only
   * what lies above its durable watermark. Absent in progress written before this field existed.
   */
  bytes_read?: number
}

/**
 * Job progress: bytes total/done/zero (zero = discarded zero runs, counted in done),
 * rate in bytes per second over the last interval, ETA in seconds (null when unknown).
 */
export interface Progress {
  bytes_total: number
  bytes_done: number
  bytes_zero: number
  rate_bytes_per_s: number
  eta_s: number | null
  disks: DiskProgress[]
}

/** `last_error`: a fatal failure, or a non-fatal notice such as `E_MIG_CBT_UNSUPPORTED` (spec 1.4). */
export interface LastError {
  code: ErrorCode
  message: string
  fatal: boolean
}

/** The host restore point taken before the job wrote anything (plan `restore_point`). */
export interface RestorePointRecord {
  backup_job_id: string
  run_id: string
  restore_point_id: string
  quiesced: boolean
  created_at: string | null
}

/** How the job runs: a live adapter (`live`), a `read_disk` loop (`offline`), or `run_full_import` (`passthrough`). */
export type Strategy = 'live' | 'offline' | 'passthrough'

/** The job resource as the API returns it. Timestamps are ISO-8601 UTC. */
export interface Job {
  id: string
  plan: Plan
  state: JobState
  status: JobStatus
  strategy: Strategy
  effective_mode: 'Warm' | 'Cold'
  progress: Progress
  last_error: LastError | null
  restore_point: RestorePointRecord | null
  /** The libvirt domain defined for the job (set in `Starting`), null before. */
  domain: string | null
  created_at: string
  updated_at: string
  started_at: string | null
  finished_at: string | null
}

/** Progress of a job nothing has been copied for yet. */
export function emptyProgress(): Progress {
  return { bytes_total: 0, bytes_done: 0, bytes_zero: 0, rate_bytes_per_s: 0, eta_s: null, disks: [] }
}
