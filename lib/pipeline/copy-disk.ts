/**
 * The `read_disk` loop of spec 1.2 (offline importers; also live snapshot and delta copies):
 * copies one disk from a {@link DiskReader} into a {@link SinkVolume}. {@link copyDisk} is the
 * entry point and chooses who moves the bytes ({@link usesQemuImg}):
 * - the node engine (copy-engine-node.ts): this process reads the reader's extents from the
 *   resume watermark and writes them, zero runs discarded, with checkpoints (fsync, then the
 *   durable watermark), progress, the bandwidth cap and an optional digest;
 * - the qemu-img engine (copy-engine-qemu-img.ts, {@link copyWithQemuImg}): `qemu-img convert`
 *   per range between checkpoints, when the reader has a qemu block node (and, for `auto`,
 *   prefers it: a qemu-nbd reader) and the volume a qemu target; the checkpoints, watermarks,
 *   progress, cap and cancel stay the migrator's.
 * Both engines take the options of copy-common.ts and run the writeback loop of writeback.ts
 * between their checkpoints.
 */
import { MigError } from '../errors.ts'
import type { DiskReader } from '../contracts/disk-reader.ts'
import type { SinkVolume } from '../sink/types.ts'
import type { CopyDiskOptions, CopyDiskResult } from './copy-common.ts'
import { copyWithNode } from './copy-engine-node.ts'
import { copyWithQemuImg } from './copy-engine-qemu-img.ts'

/** Whether {@link copyDisk} hands this copy to qemu-img (see {@link CopyDiskOptions.engine}). */
export function usesQemuImg(reader: DiskReader, volume: SinkVolume, opts: Pick<CopyDiskOptions, 'engine' | 'digest'>): boolean {
  const engine = opts.engine ?? 'auto'
  if (engine === 'node') return false
  const able = !!reader.qemuNode && !!volume.qemuTarget && reader.size % 512 === 0 && !opts.digest
  if (engine === 'qemu-img' && !able)
    throw new MigError(
      'E_MIG_INTERNAL',
      `${volume.path}: the qemu-img copy engine needs a qemu source node, a qemu target, a size multiple of 512 bytes and no digest`,
    )
  return able && (engine === 'qemu-img' || !!reader.preferQemuImg)
}

/**
 * Copies `reader` into `volume` from `opts.from` to `reader.size` (see the module comment).
 * Throws `E_MIG_CANCELLED` (signal aborted; the watermark reported last stays valid),
 * `E_MIG_DISK_READ_FAILED` / `E_MIG_DISK_WRITE_FAILED` from the reader and the volume,
 * `E_MIG_MALFORMED_ARCHIVE` when a digest was given and differs.
 */
export async function copyDisk(reader: DiskReader, volume: SinkVolume, opts: CopyDiskOptions): Promise<CopyDiskResult> {
  if (usesQemuImg(reader, volume, opts)) return copyWithQemuImg(reader, volume, opts)
  return copyWithNode(reader, volume, opts)
}
