/**
 * Messages between the supervisor (server process) and a job's worker child over the IPC
 * channel of `child_process.fork` (JSON serialization).
 */
import type { Job, JobState, Progress } from '../lib/job.ts'

/** Worker -> supervisor. */
export type WorkerMessage =
  | { type: 'heartbeat' }
  | { type: 'job'; job: Job }
  | { type: 'progress'; id: string; state: JobState; progress: Progress }
  | { type: 'done'; job: Job }

/** Supervisor -> worker. */
export type SupervisorMessage = { type: 'cancel' }
