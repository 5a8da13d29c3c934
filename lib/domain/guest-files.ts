/**
 * Writes files into a guest on its DESTINATION volumes (never the source), for the guest conversion
 * steps of the Starting state (docs/network-identity.md): libguestfs read-write (`guestfish --rw`),
 * the guest's file systems mounted where the inspection of the same disks found them
 * (`GuestInspection.mounts`), so the session does not run `inspect-os` again (the costliest step of
 * a session on a TCG appliance).
 *
 * Undo: before a file is written, what was there (its bytes and mode, or that it did not exist) is
 * kept in memory; every written file is read back and compared. When a write or a check fails, or
 * the run is cancelled, the files touched so far are put back as they were (removed when they
 * did not exist) before the error is thrown; a later failure of the job can undo them with
 * {@link restoreGuestFiles} and the returned {@link GuestFilesUndo}.
 */
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { catFile, fishEnv, mountAt, startFish, type Fish, type GuestMount } from './guestfish.ts'
import type { GuestFileWrite } from './net-identity.ts'

/** What a file was before {@link writeGuestFiles} wrote it: its text and mode, or null when it did not exist. */
export interface GuestFileBefore {
  path: string
  content: string | null
  mode: number | null
}

/** The undo record of a run of {@link writeGuestFiles}: the files in the order written. */
export interface GuestFilesUndo {
  before: GuestFileBefore[]
}

/**
 * Options: the guest's file systems and mount points (`mounts`, from the inspection; `/` required),
 * the disks' image formats (`formats`, default raw), libguestfs on TCG (`tcg`), per-command time
 * limit (ms, default 900 s), cancellation.
 */
export interface GuestFilesOptions {
  mounts: GuestMount[]
  /** Image format of each disk (default `raw`; a test boot's clone is qcow2 overlays). */
  formats?: string[]
  tcg: boolean
  timeoutMs?: number
  signal?: AbortSignal
}

async function withGuest<T>(disks: string[], opts: GuestFilesOptions, fn: (fish: Fish) => Promise<T>, signal?: AbortSignal): Promise<T> {
  const fish = await startFish(disks, fishEnv(opts.tcg), opts.timeoutMs ?? 900_000, true, opts.formats)
  const onAbort = () => {
    try {
      process.kill(Number(fish.pid), 'SIGKILL')
    } catch {
      // gone
    }
  }
  signal?.addEventListener('abort', onAbort, { once: true })
  try {
    await fish.run(['run'])
    await mountAt(fish, opts.mounts, true)
    const out = await fn(fish)
    await fish.run(['umount-all'])
    await fish.run(['sync'])
    return out
  } finally {
    signal?.removeEventListener('abort', onAbort)
    await fish.stop()
  }
}

async function putBack(fish: Fish, before: GuestFileBefore[]): Promise<void> {
  for (const b of [...before].reverse()) {
    if (b.content === null) await fish.run(['rm-f', b.path])
    else {
      await fish.run(['write', b.path, b.content])
      if (b.mode !== null) await fish.run(['chmod', `0${(b.mode & 0o7777).toString(8)}`, b.path])
    }
  }
}

/**
 * Writes `writes` into the guest on `disks` (raw destination volumes, boot disk first); parent
 * directories are created (mode 0755). Resolves with the undo record. Throws `E_MIG_V2V_FAILED`
 * (the files already put back, `details.rolled_back`) when libguestfs fails or a file does not
 * read back as written; `E_MIG_CANCELLED` on `signal` (files put back in a new session).
 */
export async function writeGuestFiles(disks: string[], writes: GuestFileWrite[], opts: GuestFilesOptions): Promise<GuestFilesUndo> {
  const before: GuestFileBefore[] = []
  if (writes.length === 0) return { before }
  if (opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', 'cancelled before the guest files were written')
  if (!opts.mounts.some((m) => m.mountpoint === '/'))
    throw new MigError('E_MIG_V2V_FAILED', 'the inspection found no root file system to write the guest files into')
  let failure: Error | null = null
  try {
    await withGuest(
      disks,
      opts,
      async (fish) => {
        try {
          for (const w of writes) {
            const exists = (await fish.run(['is-file', w.path])).trim() === 'true'
            const content = exists ? await catFile(fish, w.path) : null
            const mode = exists ? Number(/^st_mode: (\d+)$/m.exec(await fish.run(['lstatns', w.path]))?.[1] ?? 'NaN') : null
            await fish.run(['mkdir-p', path.posix.dirname(w.path)])
            // recorded once its directory exists: a write that cannot start leaves nothing to undo
            before.push({ path: w.path, content, mode: Number.isFinite(mode) ? mode : null })
            if (w.expect !== undefined && content !== w.expect) throw new Error(`${w.path} changed since the inspection read it`)
            await fish.run(['write', w.path, w.content])
            const keep = Number.isFinite(mode) && mode !== null ? mode & 0o7777 : 0o644
            await fish.run(['chmod', `0${(w.mode ?? keep).toString(8)}`, w.path])
            const back = await catFile(fish, w.path)
            if (back !== w.content) throw new Error(`${w.path} does not read back as written`)
          }
        } catch (e) {
          failure = e as Error
          await putBack(fish, before)
        }
      },
      opts.signal,
    )
  } catch (e) {
    // The session itself failed (or was killed on cancel): put the files back in a new one.
    failure ??= e as Error
    if (before.length) {
      try {
        await withGuest(disks, { ...opts, signal: undefined }, (fish) => putBack(fish, before))
      } catch (re) {
        throw new MigError(
          'E_MIG_V2V_FAILED',
          `writing ${writes.map((w) => w.path).join(', ')} into the guest failed (${failure.message}); putting back the files it touched failed too: ${(re as Error).message}`,
          {
            details: { rolled_back: false, files: before.map((b) => b.path) },
          },
        )
      }
    }
  }
  if (opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', 'cancelled while the guest files were written; the files were put back')
  if (failure) {
    throw new MigError(
      'E_MIG_V2V_FAILED',
      `writing ${writes.map((w) => w.path).join(', ')} into the guest failed: ${(failure as Error).message}; the files were put back`,
      {
        details: { rolled_back: true, files: before.map((b) => b.path) },
      },
    )
  }
  return { before }
}

/** Puts back what {@link writeGuestFiles} changed (`undo`), in a new libguestfs session. Throws `E_MIG_V2V_FAILED`. */
export async function restoreGuestFiles(disks: string[], undo: GuestFilesUndo, opts: GuestFilesOptions): Promise<void> {
  if (undo.before.length === 0) return
  try {
    await withGuest(disks, { ...opts, signal: undefined }, (fish) => putBack(fish, undo.before))
  } catch (e) {
    throw new MigError('E_MIG_V2V_FAILED', `putting back ${undo.before.map((b) => b.path).join(', ')} in the guest failed: ${(e as Error).message}`)
  }
}
