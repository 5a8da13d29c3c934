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
 * so a worker never reads the environment itself.
 */
export type SupervisorMessage = { type: 'start'; config: Config } | { type: 'cancel' }
