/**
 * The orchestrator's contract with the outer systems: `OrchestratorDeps`, what `runJob`
 * (lib/jobs/orchestrator.ts) needs to run one job, with the hooks, tunables and results it
 * carries (the copy loop, the start, the warm delta policy and cutover timing, the test boot).
 * lib/jobs/job-deps.ts wires the real systems; tests inject doubles. Types only: the orchestrator
 * and its copy passes (offline-copy.ts, live-copy.ts, copy-one.ts) import them from here.
 */
import type { CarriedNvram } from '../adapters/types.ts'
import type { DiskReader } from '../contracts/disk-reader.ts'
import type { HardwareRecord, Job, JobState, RestorePointRecord } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { Sink, SinkVolume } from '../sink/types.ts'
import type { JobPatch, JobsRepo } from '../store/jobs.ts'
import type { WatermarksRepo } from '../store/watermarks.ts'
import type { PreparedSource } from './prepared-source.ts'
import type { ReadRetry } from '../pipeline/read-retry.ts'
import type { SpaceWait } from '../pipeline/space-wait.ts'

/** What the copy brought from the source beside the disks, for the start: the UEFI variable store (a live source's `readNvram`). */
export interface StartCarried {
  nvram?: CarriedNvram | null
}

/**
 * What `start` reports: the domain, the hardware chosen, a boot notice (null: boot verified or
 * not started), and a network notice (configured interfaces of the guest that were not carried
 * over to the domain, in words; absent or null: none).
 */
export interface StartOutcome {
  domain: string
  hardware: HardwareRecord | null
  notice: string | null
  networkNotice?: string | null
}

/** Result of copying one disk (bytes). */
export interface CopyResult {
  bytes_read: number
  bytes_written: number
  bytes_zero: number
}

/** The copy loop used for every disk (lib/pipeline/copy-disk.ts in production). */
export type CopyDiskFn = (
  reader: DiskReader,
  volume: SinkVolume,
  opts: {
    from: number
    signal: AbortSignal
    /** `bytes_read`: bytes read from the source in this run (absent: not counted). */
    onProgress(p: { bytes_done: number; bytes_zero: number; watermark: number; bytes_read?: number }): void
    onWatermark(watermark: number): Promise<void>
    /** Expected digest of the reader's bytes (a raw disk file's `.mf` digest). */
    digest?: { algorithm: 'sha1' | 'sha256' | 'sha512'; hex: string }
  },
) => Promise<CopyResult>

/** Tunables of the warm delta loop (spec 3 rule 2; "not shown" thresholds are config). */
export interface DeltaPolicy {
  /** A pass that changed fewer bytes than this counts as converged (default 64 MiB). */
  convergeBelowBytes: number
  /** Delta passes before `E_MIG_DELTA_TOO_LARGE` (default 8). */
  maxPasses: number
}

/**
 * Timing of a warm job that waits for its cutover (plan `cutover` manual or at a time), seconds
 * unless the name says ms.
 */
export interface CutoverTiming {
  /** Shutdown part of the projected downtime: the guest shutdown timeout (default 300). */
  shutdownEstimateSeconds: number
  /** Start part of the projected downtime: the boot check's grace period (default 10). */
  startEstimateSeconds: number
  /** How often the wait between passes looks for the operator's command (default 1000 ms). */
  pollMs: number
}

/**
 * The test boot of a warm job waiting in `DeltaSyncing` (docs/test-boot.md; lib/jobs/test-boot.ts
 * wires lib/domain/test-boot.ts).
 * - `requested()`: the operator asked for a test boot that has not started (store).
 * - `start(...)`: starts one over the job's volumes (flushed), publishing each change of the job
 *   with `onJob`; `cloned` resolves once its clone
 *   exists (or it ended before), `done` once it ended and its domain and clone are gone; neither
 *   rejects. `holdsWrites`: the clone reads the volumes live (no delta pass while it runs).
 *   `signal` ends it as `cancelled` (its `reason` string is recorded).
 * - `recover(job)`: removes what a test boot the previous worker left running (a crash) made, and
 *   records it `cancelled`; never rejects.
 */
export interface TestBootHook {
  requested(): Promise<boolean>
  start(
    job: Job,
    manifest: VmManifest,
    volumes: SinkVolume[],
    signal: AbortSignal,
    onJob: (job: Job) => void,
  ): { holdsWrites: boolean; cloned: Promise<void>; done: Promise<void> }
  recover(job: Job, onJob: (job: Job) => void): Promise<void>
}

/** Everything the orchestrator needs; tests inject doubles of the outer systems. */
export interface OrchestratorDeps {
  jobId: string
  jobs: JobsRepo
  watermarks: WatermarksRepo
  now(): Date
  signal: AbortSignal
  /** Called after every state change with the whole job (SSE `migration`). */
  onJob(job: Job): void
  /**
   * Called with progress snapshots, at most every `PROGRESS_EVERY_MS` of orchestrator.ts (SSE
   * `progress`); a change inside an interval is sent when the interval ends.
   */
  onProgress(p: { id: string; state: JobState; progress: Job['progress'] }): void
  prepare(job: Job, signal: AbortSignal): Promise<PreparedSource>
  sink: Sink
  copyDisk: CopyDiskFn
  /** Windows virtio driver injection over the destination volumes. */
  v2v(job: Job, manifest: VmManifest, volumes: SinkVolume[], signal: AbortSignal): Promise<void>
  /**
   * Defines and starts the domain; returns the domain name, or the name with the chosen hardware
   * (recorded on the job) and `notice` (the boot is not verified: recorded as a non-fatal
   * `E_MIG_GUEST_BOOT_FAILED` in `last_error`) and `networkNotice` (interfaces not carried over:
   * a non-fatal `E_MIG_V2V_FAILED`, kept inside the boot notice's message when both happen).
   */
  start(job: Job, manifest: VmManifest, volumes: SinkVolume[], signal: AbortSignal, carried?: StartCarried): Promise<string | StartOutcome>
  /**
   * Runs the plan's host backup job and waits for its restore point (plan `restore_point`);
   * called before anything is written to the destination. Absent: a plan asking for one fails.
   */
  takeRestorePoint?(job: Job, signal: AbortSignal): Promise<RestorePointRecord>
  delta?: Partial<DeltaPolicy>
  /**
   * Checks run before any destination volume is created (room for the disks, qemu's access,
   * bridges: lib/host/precopy.ts); a throw fails the job with its code before anything is written.
   */
  preflight?(job: Job, manifest: VmManifest): Promise<void>
  cutover?: Partial<CutoverTiming>
  /** Keep destination volumes of a cancelled job (default false: remove them). */
  keepOnCancel?: boolean
  /**
   * Reserves the job's domain name once the manifest is known, before anything is copied
   * (stored as `job.domain`; a resumed job keeps its name). Absent: the name is chosen at define.
   */
  reserveDomainName?(job: Job, manifest: VmManifest): Promise<string>
  /** Rewrites a failure message before it is stored on the job (absolute host paths out); default unchanged. */
  redact?: (message: string) => string
  /**
   * Records that phase `name` ended now (the worker's fixed-cost breakdown, logged as `job
   * timings`): `inspected`, `volumes`, `copying`, `reader` (per disk: its reader is open), `copied`,
   * `started` (domain defined/started), `completed`.
   */
  mark?(name: string): void
  /**
   * Offline copies: a file system that fills up during the copy (the volumes', the store's) is
   * waited out for a bounded time with a visible notice, then the copy resumes from its durable
   * watermarks (lib/pipeline/space-wait.ts). Absent: such a copy fails at once.
   */
  spaceWait?: SpaceWait
  /**
   * Source reads failing with I/O errors during an offline copy: tried again from the durable
   * watermarks for a bounded time with a visible notice (lib/pipeline/read-retry.ts). Absent:
   * such a copy fails at once.
   */
  readRetry?: ReadRetry
  /** The test boot of a warm job waiting for its cutover (absent: none is run). */
  testBoot?: TestBootHook
  /**
   * A live import (plan `live_import`, lib/live-import/run.ts): the guest started on overlays over
   * the source's readers while the volumes fill, ending on them; replaces the copy, the V2V and
   * the start. `progress(label, bytes)` reports each disk's bytes in its volume, `patch` records
   * the started guest (domain, hardware) and the wait for the source on the job; `carried`: what
   * the source brought beside its disks (a live adapter's UEFI variable store). Absent: a plan
   * asking for it fails with `E_MIG_INVALID_PLAN`.
   */
  liveImport?(
    job: Job,
    source: Extract<PreparedSource, { strategy: 'offline' }>,
    volumes: SinkVolume[],
    hooks: { progress(label: string, bytes: number): void; patch(extra: JobPatch): Promise<Job> },
    carried?: StartCarried,
  ): Promise<StartOutcome>
}
