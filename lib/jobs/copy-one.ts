/**
 * The copy of one disk into its destination volume through the job's copy loop
 * (`OrchestratorDeps.copyDisk`), with the bookkeeping around it: the job's progress tracker, the
 * disk's durable watermark while it copies and once it is done. Shared by the offline copy
 * (offline-copy.ts) and the live copy's full pass (live-copy.ts).
 */
import type { DiskReader } from '../contracts/disk-reader.ts'
import { copyReadsStoredBytes, type ManifestDisk } from '../manifest.ts'
import type { SinkVolume } from '../sink/types.ts'
import type { OrchestratorDeps } from './orchestrator-deps.ts'
import type { ProgressTracker } from '../pipeline/progress.ts'

/**
 * Copies `disk` from `reader` into `volume`, from byte `from` to its end, feeding `tracker` (then
 * `emit`) with the copy's progress and storing each watermark the copy loop reports. Then awaits
 * `digest` (the packed file's `.mf` check run beside the copy), calls `unchanged()` (throws when
 * the input changed since it was opened) and records the disk as copied (tracker, watermark at
 * its capacity). Throws what the copy loop, `digest` or `unchanged` throw.
 */
export async function copyOne(
  deps: OrchestratorDeps,
  reader: DiskReader,
  volume: SinkVolume,
  disk: ManifestDisk,
  from: number,
  tracker: ProgressTracker,
  emit: (force?: boolean) => void,
  digest: Promise<void> = Promise.resolve(),
  unchanged: () => void = () => {},
): Promise<void> {
  let zeroSeen = 0
  const res = await deps.copyDisk(reader, volume, {
    from,
    signal: deps.signal,
    digest: copyReadsStoredBytes(disk) ? disk.source.digest : undefined,
    onProgress(p) {
      tracker.setDone(disk.label, p.bytes_done)
      if (p.bytes_read !== undefined) tracker.setRead(disk.label, p.bytes_read)
      tracker.add(disk.label, 0, p.bytes_zero - zeroSeen)
      zeroSeen = p.bytes_zero
      emit()
    },
    async onWatermark(w) {
      await deps.watermarks.set(deps.jobId, { disk_label: disk.label, watermark_bytes: w, capacity_bytes: disk.capacity_bytes }, deps.now().toISOString())
      tracker.setWatermark(disk.label, w)
    },
  })
  await digest
  unchanged()
  tracker.setRead(disk.label, res.bytes_read)
  tracker.finish(disk.label)
  await deps.watermarks.set(
    deps.jobId,
    { disk_label: disk.label, watermark_bytes: disk.capacity_bytes, capacity_bytes: disk.capacity_bytes },
    deps.now().toISOString(),
  )
}
