/**
 * What an offline copy does when a file system it writes to fills up (a volume's, or the
 * store's when it cannot record a watermark): it waits, visibly and for a bounded time, for
 * space to come back, then resumes from its durable watermarks; see docs/reliability.md.
 *
 * The wait is announced on the job as a non-fatal `last_error` notice
 * (`E_MIG_DISK_WRITE_FAILED` for the volumes, `E_MIG_PERSIST_FAILED` for the store) saying
 * "waiting for space on <mount point>", with the bytes free, the bytes needed and the fix. The
 * copy resumes once the file system has the bytes needed free; after `seconds` without them the
 * job fails with the same code.
 */
import { MigError, asMigError, type ErrorCode } from '../errors.ts'
import { isNoSpace, mib } from '../host/fs-space.ts'
import { sleep } from '../retry.ts'

/** How the notice of a space wait begins (the metrics count the jobs whose notice starts so). */
export const SPACE_WAIT_NOTICE = 'waiting for space on '

/** How a copy waits for space: settings and the host facts it reads. */
export interface SpaceWait {
  /** Longest wait before the job fails, seconds (`MIGRATOR_SPACE_WAIT_SECONDS`). */
  seconds: number
  /** Looks at the file system every this many ms (default 1000). */
  pollMs?: number
  /** The file system of a path: mount point and free bytes (lib/host/fs-space.ts `spaceOf`). */
  spaceOf(path: string): { mount: string; free: number }
  /** The database file of the store (where a store failure for want of space waits). */
  storeFile: string
  /** The store's own floor: bytes it needs free to take writes again (its reserve's size). */
  storeNeeds: number
}

/** A failure a copy may wait out: what filled up, and how much must be free to go on. */
export interface SpaceShortage {
  code: ErrorCode
  /** A path on the file system that filled up. */
  path: string
  /** Bytes that must be free to resume. */
  needed: number
  /** What filled up, for the message (`the volumes of the job`, `the store`). */
  what: string
  /** The error the copy failed with. */
  cause: MigError
}

/**
 * The shortage behind copy error `e`, or null when `e` is no "no space left" failure. A store
 * failure (`E_MIG_PERSIST_FAILED`) waits for the store's floor on the store's file system; a
 * volume failure waits for `remaining` bytes (what the copy still has to write) on `volumePath`'s.
 */
export function shortageOf(e: unknown, wait: SpaceWait, volumePath: string, remaining: number): SpaceShortage | null {
  if (!isNoSpace(e)) return null
  const cause = asMigError(e, 'E_MIG_DISK_WRITE_FAILED', volumePath)
  if (cause.code === 'E_MIG_PERSIST_FAILED') return { code: cause.code, path: wait.storeFile, needed: wait.storeNeeds, what: 'the store', cause }
  return { code: 'E_MIG_DISK_WRITE_FAILED', path: volumePath, needed: remaining, what: "the job's volumes", cause }
}

/**
 * Waits until the shortage's file system has `needed` bytes free. `notify(message)` is called
 * once at the start with the "waiting for space" notice. Throws `E_MIG_CANCELLED` when `signal`
 * aborts, and the shortage's code (fatal) when `seconds` pass without the space, naming the mount
 * point, both figures, the fix and the original error.
 */
export async function waitForSpace(s: SpaceShortage, wait: SpaceWait, signal: AbortSignal, notify: (message: string) => Promise<void>): Promise<void> {
  const deadline = Date.now() + wait.seconds * 1000
  await notify(spaceWaitNotice(s, wait, wait.spaceOf(s.path), deadline, 'the copy resumes from its durable watermark by itself'))
  for (;;) {
    if (signal.aborted) throw new MigError('E_MIG_CANCELLED', 'cancelled by operator')
    const now = wait.spaceOf(s.path)
    if (now.free >= s.needed) return
    if (Date.now() >= deadline) throw spaceWaitExpired(s, wait, now)
    await sleep(wait.pollMs ?? 1000, signal).catch(() => {})
  }
}

/**
 * The notice that starts a wait for shortage `s`: the mount point, the bytes free (`at`) and
 * needed, what happens once there is room (`resumes`), when the job fails (`deadline`, epoch ms)
 * and the cause.
 */
export function spaceWaitNotice(
  s: SpaceShortage,
  wait: Pick<SpaceWait, 'seconds'>,
  at: { mount: string; free: number },
  deadline: number,
  resumes: string,
): string {
  return `${SPACE_WAIT_NOTICE}${at.mount} (the file system of ${s.what}): ${mib(at.free)} free, ${mib(s.needed)} needed; free space on ${at.mount}: ${resumes}, or the job fails at ${new Date(deadline).toISOString()} (MIGRATOR_SPACE_WAIT_SECONDS=${wait.seconds}); cause: ${s.cause.message}`
}

/**
 * The error (shortage `s`'s code) of a wait that ran `seconds` without the space: the mount point,
 * the bytes free (`now`) and needed, the fix, the cause; `details` are added to its own.
 */
export function spaceWaitExpired(
  s: SpaceShortage,
  wait: Pick<SpaceWait, 'seconds'>,
  now: { mount: string; free: number },
  details: Record<string, unknown> = {},
): MigError {
  return new MigError(
    s.code,
    `no space left on ${now.mount} (the file system of ${s.what}): ${mib(now.free)} free, ${mib(s.needed)} needed after waiting ${wait.seconds} s; free space on ${now.mount} and submit the migration again; cause: ${s.cause.message}`,
    { cause: s.cause, details: { mount: now.mount, free_bytes: now.free, needed_bytes: s.needed, ...details } },
  )
}
