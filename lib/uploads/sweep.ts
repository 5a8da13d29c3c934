/**
 * Expiry of uploads (spec 2.4: "An upload can expire or be removed"). Expired uploads, and
 * uploads left `receiving` by a crash, lose their row and their file under `.uploads/` unless a
 * queued or running job still uses them.
 */
import { unlink } from 'node:fs/promises'
import * as path from 'node:path'
import type { Store } from '../store/index.ts'

/**
 * Removes expired and stale uploads at `now`; a `receiving` upload older than `staleSeconds`
 * is stale. Returns the removed ids. Throws `E_MIG_PERSIST_FAILED` on store failure.
 */
export async function sweepUploads(store: Store, uploadsDir: string, now: Date, staleSeconds = 24 * 3600): Promise<string[]> {
  const staleBefore = new Date(now.getTime() - staleSeconds * 1000).toISOString()
  const removed: string[] = []
  for (const id of await store.uploads.expired(now.toISOString(), staleBefore)) {
    if ((await store.jobs.activeUsing({ uploadId: id })).length > 0) continue
    await unlink(path.join(uploadsDir, id)).catch(() => {})
    await store.uploads.remove(id)
    removed.push(id)
  }
  return removed
}
