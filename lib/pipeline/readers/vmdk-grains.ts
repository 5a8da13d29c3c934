/**
 * Disk reader of a monolithicSparse VMDK (a hosted sparse extent whose grains are not
 * compressed, with no parent), by its grain directory and grain tables (VMware "Virtual
 * Disk Format 5.0", "Hosted Sparse Extents"), in place of qemu-nbd and the qemu-img engine
 * ({@link openBlockMapReader}: the blocks are the grains, copied by the node engine).
 *
 * - A grain table entry of 0 (absent: no parent to read it from) or 1 where the header allows
 *   zeroed grain table entries reads as zeros; any other entry is the grain's sector in the file.
 * - The directory and every grain table are checked at open, before any copy
 *   ({@link SparseExtent}, lib/formats/vmdk/sparse-extent.ts): a table or grain outside the file
 *   (a truncated image, whose missing grains qemu would read as zeros) is
 *   `E_MIG_DISK_READ_FAILED` naming it, "refusing to copy it"; this replaces `qemu-img check`
 *   for these images.
 * - Left to qemu ({@link openSparseVmdkReader} resolves null): a file without the `KDMV` magic (a
 *   descriptor file naming its extents), a header the grain table codec does not read
 *   (compressed grains, grain markers, a compression algorithm, the directory at the end:
 *   stream-optimized, which `stream-vmdk.ts` reads when it reads it well), an embedded descriptor naming a parent or any extent but one
 *   `SPARSE` extent of the header's capacity.
 */
import type { DiskReader } from '../../contracts/disk-reader.ts'
import { parentCidOf, parseVmdkDescriptor } from '../../formats/vmdk/descriptor.ts'
import { isPlainHostedSparse, parseKdmvHeader, VMDK_SPARSE_MAGIC } from '../../formats/vmdk/hosted-sparse.ts'
import { SECTOR } from '../../formats/vmdk/limits.ts'
import type { Grain } from '../../formats/vmdk/sparse-codec.ts'
import { openSparseExtent, type SparseExtent } from '../../formats/vmdk/sparse-extent.ts'
import { type BlockTable, KeptLoads, openBlockMapReader } from './block-map.ts'
import { imageFileView, type ImageFileOptions } from './image-file.ts'
import { refuseMalformed } from './stream-vmdk.ts'

/** Grain tables kept decoded (512 entries each: a few KiB). */
const KEPT_TABLES = 4

/**
 * Opens the VMDK at `path` (the byte range `offset`/`length` of it for a tar member). Returns the
 * reader of a monolithicSparse extent (`size`: its capacity), or null for any other file (see the
 * module comment). Throws `E_MIG_DISK_READ_FAILED` (cannot open or read the file, range outside
 * the file, a damaged or truncated extent: a grain directory, grain table or grain outside the
 * file; "refusing to copy it"), and `E_MIG_UNSUPPORTED_FORMAT` for header versions over 3.
 */
export function openSparseVmdkReader(path: string, opts: ImageFileOptions = {}): Promise<DiskReader | null> {
  return openBlockMapReader(path, opts, async (file) => {
    if (file.length < SECTOR) return null
    const view = imageFileView(file)
    const head = await view.read(0, SECTOR)
    if (head.toString('latin1', 0, 4) !== VMDK_SPARSE_MAGIC) return null
    if (!isPlainHostedSparse(refusing(() => parseKdmvHeader(head, file.label)))) return null
    const { extent, descriptor } = await openSparseExtent(view).catch(refuseMalformed)
    if (!descriptor || descriptor.length === 0) return null
    const d = refusing(() => parseVmdkDescriptor(descriptor, `${file.label} (embedded descriptor)`))
    const only = d.extents.length === 1 ? d.extents[0]! : null
    if (parentCidOf(d) || !only || only.type !== 'SPARSE' || only.sectors * SECTOR !== extent.g.capacityBytes) return null
    return new SparseGrains(extent)
  })
}

/** `parse()`, its malformed input refused as the copy refuses it ({@link refuseMalformed}). */
function refusing<T>(parse: () => T): T {
  try {
    return parse()
  } catch (e) {
    return refuseMalformed(e)
  }
}

/** The grain directory and tables of a monolithicSparse extent as a {@link BlockTable}. */
class SparseGrains implements BlockTable {
  readonly size: number
  readonly blockSize: number
  readonly blocks: number
  private readonly tables = new KeptLoads<Grain[] | null>(KEPT_TABLES)

  constructor(private readonly extent: SparseExtent) {
    this.size = extent.g.capacityBytes
    this.blockSize = extent.g.grainBytes
    this.blocks = Math.ceil(this.size / this.blockSize)
  }

  /** The decoded, checked grains of table `t` (null: unallocated, every grain absent). */
  private table(t: number): Promise<Grain[] | null> {
    return this.tables.get(t, () => this.extent.tableGrains(t).catch(refuseMalformed))
  }

  async dataOffset(b: number): Promise<number | null> {
    return this.offsetIn(await this.table(Math.floor(b / this.extent.g.gtEntries)), b)
  }

  known(b: number): number | null | undefined {
    const grains = this.tables.peek(Math.floor(b / this.extent.g.gtEntries))
    return grains === undefined ? undefined : this.offsetIn(grains, b)
  }

  /** Grain `b`'s file offset (null: zeros) from its decoded table `grains` (null: unallocated). */
  private offsetIn(grains: Grain[] | null, b: number): number | null {
    const g = grains?.[b % this.extent.g.gtEntries]
    return typeof g === 'number' ? g : null
  }

  async checkAll(): Promise<boolean> {
    const tables = Math.ceil(this.blocks / this.extent.g.gtEntries)
    for (let t = 0; t < tables; t++) await this.table(t)
    return true
  }
}
