/**
 * Messages between the supervisor (server process) and a job's worker child over the IPC
 * channel of `child_process.fork` (JSON serialization).
 */
import type { Job, JobState, Progress } from '../lib/job.ts'
import type { Config } from './config.ts'

/** Worker -> supervisor. */
export type WorkerMessage =
  | { type: 'ready' }
  | { type: 'heartbeat' }
  | { type: 'job'; job: Job }
  | { type: 'progress'; id: string; state: JobState; progress: Progress }
  | { type: 'done'; job: Job }

/**
 * Supervisor -> worker. `start` answers the worker's `ready` (sent once it listens, so nothing is
 * lost while it loads): the server's resolved configuration (the object `createApp` was given),
 * so a worker never reads the environment itself. `assign` gives a spare worker (forked with
 * `--spare` before any job was claimed) its job.
 */
export type SupervisorMessage = { type: 'start'; config: Config } | { type: 'assign'; jobId: string } | { type: 'cancel' }

/** The argument a warm spare worker is forked with instead of a job id (it gets its job by `assign`). */
export const SPARE_ARG = '--spare'
