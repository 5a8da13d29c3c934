/**
 * The destination sink contract (spec 1.3, DESIGN.md section 6): one volume per disk of a job,
 * written with positioned writes, zero runs discarded instead of written, flushed to make
 * progress durable before a watermark is persisted.
 *
 * Implementations: `file.ts` (sparse raw files, embedded default) and `zvol.ts` (ZFS zvols).
 */

/** A piece of a buffer to write: `buf[start, start+length)` at volume offset `offset`, bytes. */
export type WriteSegment = { offset: number; start: number; length: number }

/**
 * One destination volume (a disk of the migrated VM). Offsets and lengths in bytes.
 * - `path`: what the domain's disk points at (raw file or `/dev/zvol/...` block device).
 * - `capacity`: size of the volume as created (at least the requested capacity).
 * - `blockSize`: granularity at which zero runs are worth detecting and discarding (file sink:
 *   4 KiB filesystem blocks; zvol: the 64 KiB volblocksize). Optional for test doubles.
 * - `qemuTarget`: see the field.
 * - `write(offset, buf)`: writes all of `buf` at `offset`.
 * - `writeSegments(buf, segments)` (optional): writes several {@link WriteSegment}s of one buffer
 *   in their order, as one operation (a chunk's data pieces; what `write` does for each, at the
 *   cost of one). Absent: the copy calls `write` for each.
 * - `zero(offset, length)`: makes the range read as zeros, discarding it where possible
 *   (a range never written on a freshly created volume needs no I/O).
 * - `flush()`: fsync; after it resolves, everything written or zeroed before is durable.
 * - `close()`: closes the handle; never throws, idempotent.
 * Failures are `MigError('E_MIG_DISK_WRITE_FAILED')` naming the volume and offset.
 */
export interface SinkVolume {
  path: string
  capacity?: number
  blockSize?: number
  /**
   * How qemu opens this volume for writing (`qemu-img convert -n` into a range of it), when it
   * can: `node` is the qemu block node (`file` for an image file, `host_device` for a block
   * device); `isZero(offset)` tells whether everything from `offset` on still reads as zeros
   * (a fresh volume never written there); `noteWritten(end)` records that bytes up to `end` may
   * have been written outside `write()`; `takeDirect(length)`: whether qemu writes the next
   * `length` data bytes with `-t none` (cache=none, `O_DIRECT`: past the page cache); when not,
   * they are counted against the volume's page-cache budget. `inOrder`: qemu must write in disk
   * order (an image file: writes out of order grow its file system's extent tree, so the file
   * takes more blocks than `qemu-img convert`'s); a block device takes out-of-order writes
   * (`qemu-img -W`).
   */
  qemuTarget?: {
    node: Record<string, unknown>
    inOrder: boolean
    takeDirect(length: number): boolean
    isZero(offset: number): boolean
    noteWritten(end: number): void
  }
  /**
   * Whether a copy should go on flushing this volume back to back (the writeback loop of
   * lib/pipeline/writeback.ts; absent: true), read before each of those flushes: true while what
   * is written goes through the page cache, where the flushes have the kernel write it back as it comes. A block
   * device's volume answers false once its writes go `O_DIRECT`: its flush is then a flush of the
   * device (a zvol's ZIL commit; a loop device's fsync of its backing file) that writes nothing
   * the kernel would not write on its own, and back-to-back flushes slowed the copy into the zvol
   * sink's stand-in. The checkpoints flush either way.
   */
  readonly writeback?: boolean
  write(offset: number, buf: Buffer): Promise<void>
  writeSegments?(buf: Buffer, segments: readonly WriteSegment[]): Promise<void>
  zero(offset: number, length: number): Promise<void>
  flush(): Promise<void>
  close(): Promise<void>
}

/**
 * A destination for the volumes of jobs.
 * - `create(jobId, label, capacityBytes)`: creates the volume of disk `label` (sanitized with
 *   `sanitizeLabel`), or reopens it when it exists already (a resumed job), and opens it for
 *   writing. `E_MIG_DISK_WRITE_FAILED`.
 * - `remove(jobId)`: removes every volume of the job (and their container); volumes must be
 *   closed first; removing a job with nothing on the destination succeeds.
 *   `E_MIG_DISK_WRITE_FAILED`.
 * - `snapshot(jobId)`: a point-in-time copy of all the job's volumes taken before V2V rewrites
 *   them (spec 1.5): `take`, then `rollback` + `release` on failure or `release` on success.
 *   Failures are `E_MIG_DISK_WRITE_FAILED`.
 */
export interface Sink {
  create(jobId: string, label: string, capacityBytes: number): Promise<SinkVolume>
  remove(jobId: string): Promise<void>
  snapshot(jobId: string): VolumeSnapshot
  /** The disposable clone of the job's volumes a test boot boots (absent: the sink cannot test-boot). */
  testBootClone?(jobId: string): VolumeClone
}

/**
 * One disk of a {@link VolumeClone}: what the clone's domain boots. `format` is the image format
 * qemu opens `path` with; `backing` the job's volume under a `qcow2` overlay (null for a full
 * clone), which the test boot reads for the inspection (an overlay never written equals it).
 */
export interface CloneVolume {
  label: string
  path: string
  format: 'raw' | 'qcow2'
  backing: string | null
}

/**
 * A disposable clone of a job's volumes for a test boot (docs/test-boot.md): writes of the booted
 * clone never reach the job's volumes. `take` makes it (`E_MIG_DISK_WRITE_FAILED`), `remove` removes
 * everything the clone made, idempotent, also after a crash (`E_MIG_DISK_WRITE_FAILED`).
 * `holdsWrites`: the clone reads the job's volumes live (an overlay), so nothing may write them
 * while it exists (a warm job's delta passes wait); false for a point-in-time clone.
 * `kind` says what it is in words.
 */
export interface VolumeClone {
  kind: string
  holdsWrites: boolean
  take(labels: string[]): Promise<CloneVolume[]>
  remove(): Promise<void>
}

/** A snapshot of a job's volumes (same shape as the V2V preparer's `V2vSnapshot`). */
export interface VolumeSnapshot {
  take(): Promise<void>
  rollback(): Promise<void>
  release(): Promise<void>
}
