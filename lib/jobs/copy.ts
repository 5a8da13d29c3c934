/**
 * Step: the copy loop of every disk, with the settings' tunables (lib/pipeline/copy-disk.ts and
 * its engines move the bytes; the copy passes offline-copy.ts and live-copy.ts call it through
 * the orchestrator's `copyDisk`): the checkpoint interval, the bandwidth cap, how long a full
 * file system and a failing source are waited out.
 */
import { spaceOf } from '../host/fs-space.ts'
import { copyDisk } from '../pipeline/copy-disk.ts'
import type { ReadRetry } from '../pipeline/read-retry.ts'
import type { SpaceWait } from '../pipeline/space-wait.ts'
import { STORE_NEEDS_BYTES } from '../store/persist.ts'
import type { CopyDiskFn } from './orchestrator-deps.ts'
import type { JobPaths, JobSettings } from './settings.ts'

/** The copy of the job's disks: the orchestrator's `copyDisk`, `spaceWait` and `readRetry`. */
export interface CopySteps {
  copyDisk: CopyDiskFn
  /** Absent when `copy.spaceWaitSeconds` is 0: a copy that runs out of space fails at once. */
  spaceWait: SpaceWait | undefined
  readRetry: ReadRetry
}

/**
 * The copy loop with the settings' checkpoint interval (`copy.flushEveryBytes`) and bandwidth cap
 * (`copy.maxBytesPerSecond`), each volume's path as its label; a file system that fills up
 * (the volumes', or the store's at `paths.dbFile`) is waited out `copy.spaceWaitSeconds`, a
 * source failing with I/O errors `copy.readRetrySeconds`.
 */
export function copySteps(settings: Pick<JobSettings, 'copy'>, paths: Pick<JobPaths, 'dbFile'>): CopySteps {
  const c = settings.copy
  return {
    copyDisk: (reader, volume, opts) =>
      copyDisk(reader, volume, { ...opts, label: volume.path, flushEveryBytes: c.flushEveryBytes, maxBytesPerSecond: c.maxBytesPerSecond }),
    spaceWait: c.spaceWaitSeconds > 0 ? { seconds: c.spaceWaitSeconds, spaceOf, storeFile: paths.dbFile, storeNeeds: STORE_NEEDS_BYTES } : undefined,
    readRetry: { seconds: c.readRetrySeconds },
  }
}
