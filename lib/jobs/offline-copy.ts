/**
 * The offline copy (spec 1.2 `read_disk`): every disk of an offline source read by its reader
 * and written into its volume from its durable watermark, the first disk's reader opened ahead
 * while the pre-copy checks run, the packed file's digest checked beside the copy, and the bytes
 * still to write when the copy stops (for the wait for space, lib/pipeline/space-wait.ts).
 */
import type { DiskReader } from '../contracts/disk-reader.ts'
import type { VmManifest } from '../manifest.ts'
import type { SinkVolume } from '../sink/types.ts'
import { copyOne } from './copy-one.ts'
import type { OrchestratorDeps } from './orchestrator-deps.ts'
import type { PreparedSource } from './prepared-source.ts'
import type { ProgressTracker } from '../pipeline/progress.ts'

/** Bytes the offline copy of `manifest` still has to write: each disk's capacity above its durable watermark. */
export async function remainingBytes(deps: OrchestratorDeps, manifest: VmManifest): Promise<number> {
  const marks = new Map((await deps.watermarks.list(deps.jobId).catch(() => [])).map((w) => [w.disk_label, w.watermark_bytes]))
  return manifest.disks.reduce((sum, d) => sum + Math.max(0, d.capacity_bytes - (marks.get(d.label) ?? 0)), 0)
}

/** The first disk's reader, opened ahead of the copy ({@link openFirstReader}); `taken` once the copy has it. */
export interface EarlyReader {
  index: number
  reader: Promise<DiskReader>
  taken: boolean
}

/**
 * Starts opening the reader of the first disk an offline copy will read (from its durable
 * watermark; none when every disk is copied), so that its fixed cost (qemu-nbd's start, a BAT
 * check) runs while the pre-copy checks run, the volumes are made and `CopyingFull` is written.
 * Nothing is read from it before the copy; its error is the copy's, raised when the
 * copy takes it (a pre-copy refusal still comes first); an untaken reader is closed by the job.
 */
export function openFirstReader(source: Extract<PreparedSource, { strategy: 'offline' }>, resumed: Map<string, number>): EarlyReader | null {
  const index = source.manifest.disks.findIndex((d) => Math.min(resumed.get(d.label) ?? 0, d.capacity_bytes) < d.capacity_bytes)
  if (index < 0) return null
  const reader = source.openReader(source.manifest.disks[index]!)
  reader.catch(() => {}) // observed when taken, or closed unused
  return { index, reader, taken: false }
}

/** The offline `read_disk` loop: every disk from its durable watermark to its end (the first reader maybe opened already: `early`). */
export async function copyOffline(
  deps: OrchestratorDeps,
  source: Extract<PreparedSource, { strategy: 'offline' }>,
  volumes: SinkVolume[],
  tracker: ProgressTracker,
  resumed: Map<string, number>,
  emit: (force?: boolean) => void,
  early: EarlyReader | null,
): Promise<void> {
  const disks = source.manifest.disks
  for (let i = 0; i < disks.length; i++) {
    const disk = disks[i]
    const from = Math.min(resumed.get(disk.label) ?? 0, disk.capacity_bytes)
    if (from >= disk.capacity_bytes) continue
    let opening: Promise<DiskReader>
    if (early?.index === i) {
      early.taken = true
      opening = early.reader
    } else opening = source.openReader(disk)
    const reader = await opening
    deps.mark?.('reader')
    // The packed file's digest is read on the other core while the disk copies (a second
    // sequential read of the file); a mismatch fails the job before the disk counts as copied.
    const stopDigest = new AbortController()
    const digest = source.verifyDigest?.(disk, stopDigest.signal) ?? Promise.resolve()
    digest.catch(() => {}) // awaited after the copy; a copy failure first is the error reported
    try {
      await copyOne(deps, reader, volumes[i], disk, from, tracker, emit, digest, () => source.assertUnchanged?.())
    } finally {
      stopDigest.abort()
      await reader.close().catch(() => {})
    }
  }
}
