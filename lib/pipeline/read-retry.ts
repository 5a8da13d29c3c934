/**
 * What an offline copy does when its source returns I/O errors (EIO: a failing disk, a network
 * file system or FUSE export that lost its backend): the read is tried again, from the copy's
 * durable watermarks, every few seconds for a bounded time, with a notice on the job; a source
 * that reads again lets the copy go on without reading what is already durable twice. After
 * `seconds` of errors the job fails with the read's `E_MIG_DISK_READ_FAILED` (see
 * docs/reliability.md). Other read failures (a malformed table, a source that changed) are not
 * waited out: trying again cannot mend them.
 */
import { causeMatches, MigError } from '../errors.ts'
import { sleep } from '../retry.ts'

/** How a copy waits out source I/O errors: longest wait (seconds, `MIGRATOR_READ_RETRY_SECONDS`) and the pause between tries (ms, default 5000). */
export interface ReadRetry {
  seconds: number
  pollMs?: number
}

/** True when `e` is a source read that failed with an I/O error (EIO anywhere in its cause chain, or its message). */
export function isSourceIoError(e: unknown): boolean {
  return e instanceof MigError && e.code === 'E_MIG_DISK_READ_FAILED' && causeMatches(e, ['EIO'], /\bEIO\b|input\/output error|i\/o error/i)
}

/**
 * Tracks a copy's source I/O errors: `wait(e, signal, notify)` is called with each failure; it
 * calls `notify` with the notice (the first failure's time, the deadline, the try), sleeps the
 * pause and returns (the caller tries again from its watermarks); once `seconds` have passed since
 * the first failure it throws `E_MIG_DISK_READ_FAILED` saying so; `E_MIG_CANCELLED` when `signal`
 * aborts. Failures more than three pauses apart are separate windows (the source read in between).
 */
export class ReadRetryWindow {
  private since: number | null = null
  private last = 0
  private tries = 0

  constructor(private readonly opts: ReadRetry) {}

  async wait(e: MigError, signal: AbortSignal, notify: (message: string) => Promise<void>): Promise<void> {
    const now = Date.now()
    const pause = this.opts.pollMs ?? 5000
    // A source that read again for a while (three pauses) and fails anew starts a new window.
    if (this.since === null || now - this.last > 3 * pause + 1000) {
      this.since = now
      this.tries = 0
    }
    this.last = now
    this.tries++
    if (now - this.since >= this.opts.seconds * 1000) {
      throw new MigError(
        'E_MIG_DISK_READ_FAILED',
        `${e.message}; the source still returned I/O errors after ${this.opts.seconds} s of tries; mend its storage and submit the migration again`,
        {
          cause: e,
        },
      )
    }
    // Said again at every try: the copy in between clears the job's notice.
    const until = new Date(this.since + this.opts.seconds * 1000).toISOString()
    await notify(
      `the source returns I/O errors (${e.message}); trying again from the durable watermark every ${Math.round(pause / 1000)} s until ${until} (try ${this.tries}, MIGRATOR_READ_RETRY_SECONDS=${this.opts.seconds}): check the storage or share the export is read from`,
    )
    await sleep(pause, signal, () => new MigError('E_MIG_CANCELLED', 'cancelled by operator'))
  }
}
