/**
 * Disk reader of a qcow2 image without a backing file, by its L1 and L2 tables (qemu
 * `docs/interop/qcow2.txt`, "Cluster mapping"), in place of qemu-nbd and the qemu-img engine
 * ({@link openBlockMapReader}: the blocks are the image's clusters, copied by the node engine).
 *
 * - The L1 table maps the virtual disk in pieces of `cluster_size * cluster_size / 8` bytes to
 *   L2 tables; an L2 entry maps one cluster to a host cluster offset. An L1 entry of offset 0, an
 *   L2 entry of offset 0 or with the zero flag (bit 0, version 3) read as zeros (no backing
 *   file); any other cluster reads from its host offset.
 * - Every entry is checked when used, and every L1 entry and L2 table at open, before any copy
 *   (one L2 table at a time, {@link Qcow2Clusters.checkAll}): reserved bits set, an L2 table or
 *   cluster not aligned to a cluster or beyond the end of the file (a truncated image, whose
 *   missing clusters qemu would read as zeros) is
 *   `E_MIG_DISK_READ_FAILED` naming the cluster or L1 entry; this replaces `qemu-img check` for
 *   these images, as the BAT checks do for VHDX.
 * - Not read here ({@link openQcow2ClustersReader} resolves null, the caller uses qemu-nbd): a
 *   backing file, extended L2 entries (subclusters), the dirty bit (lazy refcounts left
 *   unrepaired), compressed clusters (found by the check at open). Encrypted images and external
 *   data files are refused by the header reader, as before.
 */
import { MigError } from '../../errors.ts'
import type { DiskReader } from '../../contracts/disk-reader.ts'
import { type Qcow2Header, qcow2L1EntryAt, qcow2L2EntryAt, readQcow2HeaderFrom } from '../../formats/qcow2.ts'
import { readAt } from '../../formats/io.ts'
import { type BlockTable, KeptLoads, openBlockMapReader, TableWindows } from './block-map.ts'
import type { ImageFile, ImageFileOptions } from './image-file.ts'

/** L1 entries per window read at once (64 KiB). */
const L1_WINDOW = 8192
/** L2 tables kept in memory (one cluster each: at most 8 MiB with 2 MiB clusters). */
const KEPT_L2 = 4

/**
 * Opens the qcow2 image at `path` (the byte range `offset`/`length` of it for a tar member).
 * Returns the reader (`size`: the header's virtual size), or null for an image this reader leaves
 * to qemu-nbd (see the module comment).
 * Throws `E_MIG_DISK_READ_FAILED` (cannot open or read the file, range outside the file, an
 * entry that cannot be trusted), and the errors of the header reader (`E_MIG_UNSUPPORTED_FORMAT`,
 * `E_MIG_MALFORMED_ARCHIVE`).
 */
export function openQcow2ClustersReader(path: string, opts: ImageFileOptions = {}): Promise<DiskReader | null> {
  return openBlockMapReader(path, opts, async (file) => {
    const h = await readQcow2HeaderFrom(file.fh, file.label, { offset: file.base, length: file.length })
    if (h.backing_file !== null || h.extended_l2 || h.dirty) return null
    return new Qcow2Clusters(file, h)
  })
}

/** The L1 and L2 tables of a qcow2 image without a backing file as a {@link BlockTable}. */
class Qcow2Clusters implements BlockTable {
  readonly size: number
  readonly blockSize: number
  readonly blocks: number
  /** L2 entries per L2 table (one cluster of 8-byte entries). */
  private readonly perL2: number
  private readonly l1: TableWindows
  private readonly l2 = new KeptLoads<Buffer | null>(KEPT_L2)

  constructor(
    private readonly file: ImageFile,
    private readonly h: Qcow2Header,
  ) {
    this.size = h.virtual_size
    this.blockSize = h.cluster_size
    this.blocks = Math.ceil(this.size / this.blockSize)
    this.perL2 = h.cluster_size / 8
    this.l1 = new TableWindows(file, h.l1_table_offset, L1_WINDOW, 8)
  }

  private fail(why: string): MigError {
    return new MigError('E_MIG_DISK_READ_FAILED', `${this.file.label}: ${why}; refusing to copy it`)
  }

  /** A host offset (an L2 table's or a cluster's) that must hold `need` bytes inside the file. */
  private checkHost(what: string, offset: number, need: number): void {
    const C = this.blockSize
    // Aligned and not 0 (0 means unallocated): past the header cluster.
    if (offset % C !== 0) throw this.fail(`${what} lies at file offset ${offset}, not aligned to the ${C}-byte cluster`)
    if (offset + need > this.file.length)
      throw this.fail(
        `${what} at file offset ${offset} (+${need} bytes) lies beyond the end of the file (${this.file.length} bytes): the image is truncated or damaged, and its missing data would read as zeros`,
      )
  }

  /** The L2 table of L1 entry `i` (checked), or null when the entry is unallocated. */
  private table(i: number): Promise<Buffer | null> {
    return this.l2.get(i, () => this.loadTable(i))
  }

  private async loadTable(i: number): Promise<Buffer | null> {
    const raw = await this.l1.entry(i)
    if (!raw) throw this.fail(`L1 entry ${i} lies beyond the end of the file (truncated image)`)
    const { l2Offset, reserved } = qcow2L1EntryAt(raw, 0)
    if (reserved) throw this.fail(`L1 entry ${i} has reserved bits set`)
    if (l2Offset === 0) return null
    this.checkHost(`the L2 table of L1 entry ${i}`, l2Offset, this.blockSize)
    return readAt(this.file.fh, `${this.file.label} (L2 table)`, this.blockSize, this.file.base + l2Offset)
  }

  /** The host offset of cluster `b` from its L2 table `t` (null: zeros), checked; `compressed` when it is. */
  private entry(t: Buffer, b: number): number | null | 'compressed' {
    const e = qcow2L2EntryAt(t, (b % this.perL2) * 8, this.h.version)
    if (e.compressed) return 'compressed'
    if (e.reserved) throw this.fail(`the L2 entry of cluster ${b} has reserved bits set`)
    if (e.zero || e.offset === 0) return null
    this.checkHost(`cluster ${b}`, e.offset, Math.min(this.blockSize, this.size - b * this.blockSize))
    return e.offset
  }

  async dataOffset(b: number): Promise<number | null> {
    return this.offsetIn(await this.table(Math.floor(b / this.perL2)), b)
  }

  known(b: number): number | null | undefined {
    const t = this.l2.peek(Math.floor(b / this.perL2))
    return t === undefined ? undefined : this.offsetIn(t, b)
  }

  /** Cluster `b`'s host offset (null: zeros) from its L2 table `t` (null: unallocated), checked. */
  private offsetIn(t: Buffer | null, b: number): number | null {
    if (!t) return null
    const at = this.entry(t, b)
    if (at === 'compressed') throw this.fail(`cluster ${b} is compressed (read only through qemu)`)
    return at
  }

  async checkAll(): Promise<boolean> {
    const tables = Math.ceil(this.blocks / this.perL2)
    for (let i = 0; i < tables; i++) {
      const t = await this.table(i)
      if (!t) continue
      const end = Math.min(this.blocks, (i + 1) * this.perL2)
      for (let b = i * this.perL2; b < end; b++) if (this.entry(t, b) === 'compressed') return false
    }
    return true
  }
}
