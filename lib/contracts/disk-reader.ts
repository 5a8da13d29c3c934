/**
 * The disk reader contract of the data path (DESIGN.md section 5, spec 1.2 `read_disk`):
 * a virtual disk seen as raw bytes, with the extents that hold data and those known to read as
 * zeros, so the copy loop never reads unallocated or zero areas it can skip.
 *
 * Lives in `lib/contracts/` because every layer depends on it: pipeline readers implement it, live
 * adapters return it, the copy loop consumes it.
 *
 * Implementations (`lib/pipeline/readers/`): `raw-file.ts` (a raw/flat file or a tar member's byte range), `nbd.ts`
 * (qemu-nbd + the NBD client, for the images the readers by block table leave to qemu),
 * `block-map.ts` with its tables (`qcow2-clusters.ts`, `vhdx-blocks.ts`, `vhd-blocks.ts`,
 * `vdi-blocks.ts`, `vmdk-grains.ts`), `stream-vmdk.ts`, `xva-blocks.ts` (XVA 1 MiB blocks),
 * the VMDK snapshot-chain reader (`lib/formats/vmdk/chain-reader.ts`, used by the vim_api adapter)
 * and the libvirt backup export reader (`lib/adapters/libvirt/export-reader.ts`).
 */

/**
 * One extent of a disk, bytes. `zero: true` means the range is known to read as zeros (an
 * unallocated or zero-flagged area) and need not be read; `zero: false` means it must be read
 * (it may still turn out to be zeros: the chunker checks).
 */
export interface DiskExtent {
  offset: number
  length: number
  zero: boolean
}

/**
 * A byte range of a disk (bytes) with no claim about its content: a changed or allocated area a
 * live source reports (CBT `QueryChangedDiskAreas`), which a reader is restricted to.
 */
export interface DiskArea {
  offset: number
  length: number
}

/**
 * A readable virtual disk.
 * - `size`: virtual size, bytes.
 * - `extents(from)`: extents from byte `from` to `size`, in increasing offset order and never
 *   overlapping. Full-disk readers cover `[from, size)` without gaps; a reader restricted to
 *   changed areas (warm deltas) may leave gaps, which the copy loop leaves untouched.
 * - `read(offset, length, into?)`: exactly `length` bytes at `offset` (`offset + length <= size`,
 *   `length` at most 32 MiB). When `into` is given and at least `length` bytes long, the reader
 *   may fill it and return a view of it (buffer reuse); callers must use the returned buffer.
 * - `qemuNode`, `preferQemuImg`: see the fields.
 * - `close()`: releases files, sockets and child processes; never throws, idempotent.
 * Failures are `MigError('E_MIG_DISK_READ_FAILED')` naming the disk and offset.
 */
export interface DiskReader {
  size: number
  /**
   * The qemu block node (a `json:` specification, QAPI `BlockdevOptions`) that reads as this
   * disk's bytes, when qemu can open the source itself (qemu-nbd images, raw and flat files, tar
   * members in place). When present, the copy loop may hand the byte moving to `qemu-img
   * convert` (lib/pipeline/qemu-img-copy.ts); `extents()` is still used for ranges and counts.
   */
  qemuNode?: Record<string, unknown>
  /**
   * An `auto` copy hands this reader's bytes to qemu-img (with `qemuNode`): set by the qemu-nbd
   * reader, whose image format qemu decodes itself, where the NBD client would add a copy and a
   * round trip per request. Readers of raw bytes (raw and flat files, tar members) leave it
   * unset: the node engine's positioned reads moved them faster than qemu-img per range (issue
   * 15, 8 GiB raw files in process: `runs` 5.9-6.4 s against 6.8-7.4, `alternating` 11.8-12.3 s
   * against 13.4-15.7).
   */
  preferQemuImg?: boolean
  /**
   * Reads the copy loop keeps in flight for this reader (default 4; a copy's own `readAhead`
   * wins): a reader that spreads each read over several connections itself (the vim_api
   * datastore reader) asks for fewer, so fewer chunk buffers are being filled at once.
   */
  readAhead?: number
  extents(from: number): AsyncIterable<DiskExtent>
  read(offset: number, length: number, into?: Buffer): Promise<Buffer>
  close(): Promise<void>
}

/**
 * Makes `into` hold `got`, the answer to a read given `into` (a reader may fill `into` and return
 * a view of it, or return its own buffer): copies `got` in unless it already is `into`'s memory.
 */
export function landInto(got: Buffer, into: Buffer): void {
  if (got.buffer !== into.buffer || got.byteOffset !== into.byteOffset) got.copy(into)
}
