/**
 * Decoding a VMDK and its snapshot delta chain from random-access files (a datastore's
 * `/folder` interface in production, see `datastore.ts`) into a {@link DiskReader}.
 *
 * One *layer* is one VMDK: a descriptor (`# Disk DescriptorFile`) naming its extents, or a
 * monolithicSparse file with an embedded descriptor. Extents (VMware "Virtual Disk Format 5.0"):
 * - `FLAT`/`VMFS`: raw byte ranges; `ZERO`: reads as zeros;
 * - `SPARSE`: a hosted sparse extent (magic `KDMV`; 32-bit grain directory and tables, grain
 *   table entry 1 is a zeroed grain when header flag bit 2 is set);
 * - `VMFSSPARSE`: an ESXi vmfsSparse delta (magic `COWD`; the VMDK3 header of qemu's
 *   `block/vmdk.c`: disk sectors, granularity, grain directory offset and size, 4096 entries per
 *   grain table, 32-bit entries);
 * - `SESPARSE`: an ESXi seSparse delta (const header magic `0xcafebabe`, version `0x200000001`,
 *   4 KiB grains, 4096 64-bit entries per grain table; volatile header magic `0xcafecafe`; grain
 *   directory entries `0x1000_0000_<table index>`; grain table entries by top nibble: 0
 *   unallocated, 1 unmapped and 2 zero (read as zeros), 3 allocated with the grain number split
 *   as qemu's `get_cluster_offset` decodes it). The format is not published; this follows qemu's
 *   reader (`vmdk_open_se_sparse`) and refuses what it refuses.
 *
 * A layer with a parent (`parentFileNameHint`, `parentCID` other than `ffffffff`) is a delta:
 * grains it does not hold read from the parent, recursively down to the base disk, where they
 * read as zeros. Each child's `parentCID` must equal its parent's `CID`, else the chain changed
 * under the reader (`E_MIG_DISK_READ_FAILED`).
 *
 * Refused: raw device mappings, compressed or stream-optimized grains, seSparse files with a
 * journal to replay (`E_MIG_UNSUPPORTED_FORMAT`); malformed or hostile headers, extent names
 * leaving the disk's directory, chains deeper than 64 or looping, short or failed reads
 * (`E_MIG_DISK_READ_FAILED`).
 */
import { MigError } from '../../errors.ts'
import type { DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'

/** Random access to the bytes of one file. Offsets and lengths in bytes. */
export interface RemoteFile {
  /** For messages. */
  name: string
  size: number
  /** Exactly `length` bytes at `offset` (at most {@link MAX_RANGE}); `E_MIG_DISK_READ_FAILED` otherwise. */
  read(offset: number, length: number): Promise<Buffer>
}

/** Largest single read of a {@link RemoteFile}, bytes. */
export const MAX_RANGE = 32 * 1024 * 1024

const SECTOR = 512
/** Grain table bytes kept per sparse extent before the cache is dropped. */
const TABLE_CACHE_BYTES = 16 * 1024 * 1024
/** Bytes read at once when a grain table is needed (neighbouring tables come along). */
const TABLE_WINDOW = 256 * 1024
/** Largest grain directory read: 4 Mi entries (a 64 TB seSparse disk; 2 TB vmfsSparse needs 1 Mi). */
const MAX_GD_ENTRIES = 4 * 1024 * 1024
/** Deepest snapshot chain followed (ESXi allows 32 snapshots). */
const MAX_DEPTH = 64

/** A run of a layer over `[offset, offset + length)` of the virtual disk. */
type Run = { offset: number; length: number; kind: 'zero' | 'absent' } | { offset: number; length: number; kind: 'data'; file: RemoteFile; fileOffset: number }

/** What a grain table entry says of its grain: its file byte offset, `zero`, or `absent` (ask the parent). */
type Grain = number | 'zero' | 'absent'

type SparseFormat = 'hosted' | 'cowd' | 'sesparse'

/** The geometry of a sparse extent, in bytes and entries. */
interface SparseGeometry {
  format: SparseFormat
  capacityBytes: number
  grainBytes: number
  /** Entries per grain table. */
  gtEntries: number
  /** Grain directory: file offset (bytes) and entry count. */
  gdOffset: number
  gdEntries: number
  /** hosted: header flag bit 2 (entry 1 is a zeroed grain). */
  zeroGrain: boolean
  /** sesparse: file offsets (bytes) of the grain table area and the grain area. */
  tablesOffset: number
  grainsOffset: number
}

/** A sparse extent of any of the three formats: grain directory in memory, grain tables on demand. */
class SparseExtent {
  private readonly entryBytes: number
  private readonly tableBytes: number
  /** File byte offset of each grain table, or -1 when the directory entry is unallocated. */
  private readonly tableAt: Float64Array
  /** Directory indexes sorted by table offset, for loading neighbouring tables in one read. */
  private byOffset: Int32Array | null = null
  private readonly tables = new Map<number, Uint32Array>()
  private cachedBytes = 0

  private constructor(
    readonly file: RemoteFile,
    readonly g: SparseGeometry,
    gd: Buffer,
  ) {
    this.entryBytes = g.format === 'sesparse' ? 8 : 4
    this.tableBytes = g.gtEntries * this.entryBytes
    this.tableAt = new Float64Array(g.gdEntries)
    for (let i = 0; i < g.gdEntries; i++) {
      let at: number
      if (g.format === 'sesparse') {
        const lo = gd.readUInt32LE(i * 8)
        const hi = gd.readUInt32LE(i * 8 + 4)
        if (hi === 0 && lo === 0) at = -1
        else if (hi !== 0x10000000)
          throw this.fail(`grain directory entry ${i} is not an allocated table (0x${hi.toString(16)}${lo.toString(16).padStart(8, '0')})`)
        else at = g.tablesOffset + lo * this.tableBytes
      } else {
        const e = gd.readUInt32LE(i * 4)
        at = e === 0 ? -1 : e * SECTOR
      }
      if (at !== -1 && at + this.tableBytes > file.size) throw this.fail(`grain table ${i} at byte ${at} lies outside the file (truncated?)`)
      this.tableAt[i] = at
    }
  }

  private fail(why: string): MigError {
    return new MigError('E_MIG_DISK_READ_FAILED', `${this.file.name}: ${why}`)
  }

  /** Virtual bytes one grain table covers. */
  get span(): number {
    return this.g.grainBytes * this.g.gtEntries
  }

  /**
   * Opens the sparse extent in `file` (any of the three magics). Returns the extent and, for a
   * hosted sparse file, its embedded descriptor text. `E_MIG_DISK_READ_FAILED` on a malformed
   * header, `E_MIG_UNSUPPORTED_FORMAT` on compressed grains or an seSparse journal to replay.
   */
  static async open(file: RemoteFile): Promise<{ extent: SparseExtent; descriptor: string | null }> {
    const fail = (why: string) => new MigError('E_MIG_DISK_READ_FAILED', `${file.name}: ${why}`)
    const unsupported = (why: string) => new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file.name}: ${why}`)
    if (file.size < SECTOR) throw fail('too small for a sparse extent header')
    const h = await file.read(0, SECTOR)
    const u64 = (o: number) => {
      const v = h.readBigUInt64LE(o)
      return v > BigInt(Number.MAX_SAFE_INTEGER) ? -1 : Number(v)
    }
    const magic = h.toString('latin1', 0, 4)
    let g: SparseGeometry
    let descriptor: string | null = null
    if (magic === 'KDMV') {
      const version = h.readUInt32LE(4)
      const flags = h.readUInt32LE(8)
      const capacity = u64(12)
      const grainSize = u64(20)
      const descriptorOffset = u64(28)
      const descriptorSize = u64(36)
      const numGTEs = h.readUInt32LE(44)
      const gdOffset = u64(56)
      if (version < 1 || version > 3) throw fail(`unsupported sparse version ${version}`)
      if (gdOffset === -1 || (flags & 0x30000) !== 0 || h.readUInt16LE(77) !== 0)
        throw unsupported('compressed or stream-optimized grains are not read over the datastore interface')
      if (capacity < 0 || capacity > 2 ** 40) throw fail(`implausible capacity ${capacity} sectors`)
      if (grainSize < 1 || grainSize > 2048 || (grainSize & (grainSize - 1)) !== 0) throw fail(`invalid grain size ${grainSize} sectors`)
      if (numGTEs < 1 || numGTEs > 4096) throw fail(`invalid grain table size ${numGTEs}`)
      if (descriptorOffset > 0 && descriptorSize > 0) {
        const len = Math.min(descriptorSize * SECTOR, 64 * 1024)
        if (descriptorOffset * SECTOR + len > file.size) throw fail('embedded descriptor lies outside the file')
        descriptor = (await file.read(descriptorOffset * SECTOR, len)).toString('latin1').replace(/\0.*$/s, '')
      }
      g = {
        format: 'hosted',
        capacityBytes: capacity * SECTOR,
        grainBytes: grainSize * SECTOR,
        gtEntries: numGTEs,
        gdOffset: gdOffset * SECTOR,
        gdEntries: Math.ceil(capacity / grainSize / numGTEs),
        zeroGrain: (flags & 4) !== 0,
        tablesOffset: 0,
        grainsOffset: 0,
      }
    } else if (magic === 'COWD') {
      const capacity = h.readUInt32LE(12)
      const granularity = h.readUInt32LE(16)
      const gdOffset = h.readUInt32LE(20)
      const gdEntries = h.readUInt32LE(24)
      if (granularity < 1 || granularity > 2048 || (granularity & (granularity - 1)) !== 0) throw fail(`invalid vmfsSparse granularity ${granularity} sectors`)
      if (gdEntries * 4096 * granularity < capacity) throw fail(`grain directory of ${gdEntries} entries does not cover ${capacity} sectors`)
      g = {
        format: 'cowd',
        capacityBytes: capacity * SECTOR,
        grainBytes: granularity * SECTOR,
        gtEntries: 4096,
        gdOffset: gdOffset * SECTOR,
        gdEntries,
        zeroGrain: false,
        tablesOffset: 0,
        grainsOffset: 0,
      }
    } else if (h.readUInt32LE(0) === 0xcafebabe && h.readUInt32LE(4) === 0) {
      const f = (i: number) => u64(i * 8)
      if (h.readUInt32LE(8) !== 1 || h.readUInt32LE(12) !== 2)
        throw unsupported(`unsupported seSparse version 0x${h.readUInt32LE(12).toString(16)}${h.readUInt32LE(8).toString(16).padStart(8, '0')}`)
      const [capacity, grainSize, gtSize, flags] = [f(2), f(3), f(4), f(5)]
      if (grainSize !== 8 || gtSize !== 64 || flags !== 0 || f(6) !== 0 || f(7) !== 0 || f(8) !== 0 || f(9) !== 0 || !h.subarray(208).every((b) => b === 0)) {
        throw unsupported(
          `seSparse with grain size ${grainSize}, table size ${gtSize}, flags ${flags} or reserved fields set is not read (only the layout ESXi writes)`,
        )
      }
      const [volatileAt, gdAt, gdSize, tablesAt, grainsAt] = [f(10), f(16), f(17), f(18), f(24)]
      if ([capacity, volatileAt, gdAt, gdSize, tablesAt, grainsAt].some((v) => v < 0 || v > 2 ** 40)) throw fail('implausible seSparse header offsets')
      if (capacity > 2 ** 37) throw fail(`implausible capacity ${capacity} sectors`)
      if ((volatileAt + 1) * SECTOR > file.size) throw fail('seSparse volatile header lies outside the file')
      const v = await file.read(volatileAt * SECTOR, SECTOR)
      if (v.readUInt32LE(0) !== 0xcafecafe || v.readUInt32LE(4) !== 0) throw fail('bad seSparse volatile header magic')
      if (v.readBigUInt64LE(24) !== 0n) throw unsupported('the seSparse file is dirty (its journal needs replaying); consolidate the VM on ESXi first')
      const gdEntries = (gdSize * SECTOR) / 8
      if (gdEntries * 4096 * 8 < capacity) throw fail(`seSparse grain directory of ${gdEntries} entries does not cover ${capacity} sectors`)
      g = {
        format: 'sesparse',
        capacityBytes: capacity * SECTOR,
        grainBytes: 8 * SECTOR,
        gtEntries: 4096,
        gdOffset: gdAt * SECTOR,
        gdEntries,
        zeroGrain: false,
        tablesOffset: tablesAt * SECTOR,
        grainsOffset: grainsAt * SECTOR,
      }
    } else {
      throw fail('not a sparse extent (no KDMV, COWD or seSparse magic)')
    }
    // a directory longer than the capacity needs is only read as far as it is used
    g.gdEntries = Math.min(g.gdEntries, Math.ceil(g.capacityBytes / (g.grainBytes * g.gtEntries)))
    if (g.gdEntries > MAX_GD_ENTRIES) throw fail(`grain directory of ${g.gdEntries} entries is too large`)
    const gdBytes = g.gdEntries * (g.format === 'sesparse' ? 8 : 4)
    if (g.gdOffset <= 0 || g.gdOffset + gdBytes > file.size) throw fail(`grain directory at byte ${g.gdOffset} lies outside the file`)
    const gd = Buffer.alloc(gdBytes)
    for (let o = 0; o < gdBytes; o += MAX_RANGE) (await file.read(g.gdOffset + o, Math.min(MAX_RANGE, gdBytes - o))).copy(gd, o)
    return { extent: new SparseExtent(file, g, gd), descriptor }
  }

  /** Grain table `t` as 32-bit words (two per entry for seSparse), or null when unallocated. */
  private async table(t: number): Promise<Uint32Array | null> {
    const start = this.tableAt[t]
    if (start < 0) return null
    const cached = this.tables.get(t)
    if (cached) return cached
    if (!this.byOffset) {
      const idx = Array.from({ length: this.g.gdEntries }, (_, i) => i).filter((i) => this.tableAt[i] >= 0)
      this.byOffset = Int32Array.from(idx.sort((a, b) => this.tableAt[a] - this.tableAt[b]))
    }
    const end = Math.min(this.file.size, Math.max(start + this.tableBytes, start + TABLE_WINDOW))
    const buf = await this.file.read(start, end - start)
    if (this.cachedBytes + buf.length > TABLE_CACHE_BYTES) {
      this.tables.clear()
      this.cachedBytes = 0
    }
    // every table lying wholly inside the window: binary search for the first at or after `start`
    const order = this.byOffset
    let lo = 0
    let hi = order.length
    while (lo < hi) {
      const mid = (lo + hi) >> 1
      if (this.tableAt[order[mid]] < start) lo = mid + 1
      else hi = mid
    }
    for (let k = lo; k < order.length; k++) {
      const i = order[k]
      const off = this.tableAt[i] - start
      if (off + this.tableBytes > buf.length) break
      if (this.tables.has(i)) continue
      const words = new Uint32Array(this.tableBytes / 4)
      for (let w = 0; w < words.length; w++) words[w] = buf.readUInt32LE(off + w * 4)
      this.tables.set(i, words)
      this.cachedBytes += this.tableBytes
    }
    return this.tables.get(t) ?? null
  }

  /** Decodes entry `k` of a loaded table. */
  private grainOf(words: Uint32Array, k: number, g: number): Grain {
    let at: number
    if (this.g.format === 'sesparse') {
      const lo = words[2 * k]
      const hi = words[2 * k + 1]
      const state = hi >>> 28
      if (state === 0) {
        if (hi !== 0 || lo !== 0) throw this.fail(`grain ${g}: invalid unallocated entry`)
        return 'absent'
      }
      if (state === 1 || state === 2) return 'zero'
      if (state !== 3) throw this.fail(`grain ${g}: invalid grain table entry state ${state}`)
      const cluster = ((hi >>> 16) & 0xfff) + ((hi & 0xffff) * 2 ** 32 + lo) * 4096
      at = this.g.grainsOffset + cluster * this.g.grainBytes
    } else {
      const e = words[k]
      if (e === 0) return 'absent'
      if (e === 1 && this.g.zeroGrain) return 'zero'
      at = e * SECTOR
    }
    if (!Number.isSafeInteger(at) || at + this.g.grainBytes > this.file.size) throw this.fail(`grain ${g} at byte ${at} lies outside the file (truncated?)`)
    return at
  }

  /**
   * Runs of `[from, to)` (extent-relative bytes, within the capacity), merged: allocated grains
   * contiguous in the file form one `data` run.
   */
  async *runs(from: number, to: number, base: number): AsyncIterable<Run> {
    let cur: Run | null = null
    const push = (r: Run): Run | null => {
      if (
        cur &&
        cur.kind === r.kind &&
        cur.offset + cur.length === r.offset &&
        (r.kind !== 'data' || (cur.kind === 'data' && cur.fileOffset + cur.length === r.fileOffset))
      ) {
        cur.length += r.length
        return null
      }
      const done = cur
      cur = r
      return done
    }
    const span = this.span
    for (let t = Math.floor(from / span); t * span < to; t++) {
      const s = Math.max(from, t * span)
      const e = Math.min(to, (t + 1) * span)
      const words = t < this.g.gdEntries ? await this.table(t) : null
      if (!words) {
        const done = push({ offset: base + s, length: e - s, kind: 'absent' })
        if (done) yield done
        continue
      }
      for (let o = s; o < e; ) {
        const gi = Math.floor(o / this.g.grainBytes)
        const inGrain = o - gi * this.g.grainBytes
        const n = Math.min(this.g.grainBytes - inGrain, e - o)
        const grain = this.grainOf(words, gi - t * this.g.gtEntries, gi)
        const run: Run =
          typeof grain === 'number'
            ? { offset: base + o, length: n, kind: 'data', file: this.file, fileOffset: grain + inGrain }
            : { offset: base + o, length: n, kind: grain }
        const done = push(run)
        if (done) yield done
        o += n
      }
    }
    if (cur) yield cur
  }
}

/** One extent of a layer: `[start, start + length)` bytes of the virtual disk. */
type Piece =
  | { kind: 'zero'; start: number; length: number }
  | { kind: 'flat'; start: number; length: number; file: RemoteFile; fileOffset: number }
  | { kind: 'sparse'; start: number; length: number; sparse: SparseExtent }

/** One VMDK of a chain. */
interface Layer {
  name: string
  size: number
  pieces: Piece[]
  cid: string | null
  parentCid: string | null
  parentHint: string | null
  parent: Layer | null
}

const EXTENT_LINE = /^(RW|RDONLY|NOACCESS)\s+(\d+)\s+(FLAT|SPARSE|ZERO|VMFS|VMFSSPARSE|VMFSRDM|VMFSRAW|SESPARSE)(?:\s+"([^"]*)"(?:\s+(\d+))?)?\s*$/

/** `key=value` or `key="value"` of a descriptor's header, or null. */
function descriptorValue(text: string, key: string): string | null {
  const m = new RegExp(`^\\s*${key}\\s*=\\s*"?([^"\\r\\n]*)"?\\s*$`, 'm').exec(text)
  return m ? m[1].trim() : null
}

/** The parent CID of a descriptor, or null when it has none (`ffffffff`). */
function parentCidOf(text: string): string | null {
  const v = descriptorValue(text, 'parentCID')?.toLowerCase() ?? null
  return v && v !== 'ffffffff' ? v : null
}

/** Opens one VMDK (descriptor or hosted sparse file) as a layer, its parent not yet attached. */
async function openLayer(file: RemoteFile, openSibling: (name: string) => Promise<RemoteFile>, label: string): Promise<Layer> {
  const pieces: Piece[] = []
  const head = await file.read(0, Math.min(file.size, 4))
  let text: string
  if (head.toString('latin1') === 'KDMV') {
    const { extent, descriptor } = await SparseExtent.open(file)
    pieces.push({ kind: 'sparse', start: 0, length: extent.g.capacityBytes, sparse: extent })
    text = descriptor ?? ''
  } else {
    if (file.size > 64 * 1024) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: neither a sparse extent nor a descriptor of at most 64 KiB`)
    text = (await file.read(0, file.size)).toString('latin1')
    if (!/^#\s*Disk DescriptorFile/m.test(text)) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: not a VMDK descriptor`)
    let start = 0
    for (const raw of text.split(/\r?\n/)) {
      const line = raw.trim()
      if (!/^(RW|RDONLY|NOACCESS)\s/.test(line)) continue
      const m = EXTENT_LINE.exec(line)
      if (!m) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: unreadable extent line ${JSON.stringify(line.slice(0, 120))}`)
      const type = m[3]
      const length = Number(m[2]) * SECTOR
      if (!Number.isSafeInteger(length) || length <= 0) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: implausible extent size ${m[2]} sectors`)
      if (pieces.length >= 1024) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: more than 1024 extents`)
      if (type === 'ZERO') pieces.push({ kind: 'zero', start, length })
      else {
        const name = m[4]
        if (!name || name.includes('/') || name.includes('\\') || name === '.' || name === '..')
          throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: extent file ${JSON.stringify(name)} is not a file of the disk's directory`)
        if (type === 'FLAT' || type === 'VMFS') {
          const ext = await openSibling(name)
          const fileOffset = m[5] ? Number(m[5]) * SECTOR : 0
          if (fileOffset + length > ext.size)
            throw new MigError(
              'E_MIG_DISK_READ_FAILED',
              `${label}: flat extent ${name} holds ${ext.size} bytes, fewer than the ${fileOffset + length} the descriptor says (truncated?)`,
            )
          pieces.push({ kind: 'flat', start, length, file: ext, fileOffset })
        } else if (type === 'SPARSE' || type === 'VMFSSPARSE' || type === 'SESPARSE') {
          const { extent } = await SparseExtent.open(await openSibling(name))
          if (extent.g.capacityBytes < length)
            throw new MigError(
              'E_MIG_DISK_READ_FAILED',
              `${label}: ${type} extent ${name} holds ${extent.g.capacityBytes} bytes, fewer than the ${length} the descriptor says`,
            )
          pieces.push({ kind: 'sparse', start, length, sparse: extent })
        } else {
          throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: ${type} extents (raw device mappings) are not read over the datastore interface`)
        }
      }
      start += length
    }
    if (pieces.length === 0) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: the descriptor lists no extents`)
  }
  const parentCid = parentCidOf(text)
  const parentHint = descriptorValue(text, 'parentFileNameHint') || null
  if (parentCid && !parentHint) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: a delta disk (parentCID ${parentCid}) without a parentFileNameHint`)
  return {
    name: file.name,
    size: pieces.reduce((s, p) => s + p.length, 0),
    pieces,
    cid: descriptorValue(text, 'CID')?.toLowerCase() ?? null,
    parentCid,
    parentHint,
    parent: null,
  }
}

/** Runs of one layer over `[from, to)` (within its size), in order, without gaps. */
async function* layerRuns(layer: Layer, from: number, to: number): AsyncIterable<Run> {
  for (const p of layer.pieces) {
    const s = Math.max(from, p.start)
    const e = Math.min(to, p.start + p.length)
    if (e <= s) continue
    if (p.kind === 'zero') yield { offset: s, length: e - s, kind: 'zero' }
    else if (p.kind === 'flat') yield { offset: s, length: e - s, kind: 'data', file: p.file, fileOffset: p.fileOffset + (s - p.start) }
    else yield* p.sparse.runs(s - p.start, e - p.start, p.start)
  }
}

/** Data and zero runs of the chain from `layer` down over `[from, to)`: absent grains resolved through the parents. */
async function* chainRuns(layer: Layer, from: number, to: number): AsyncIterable<Run> {
  const end = Math.min(to, layer.size)
  if (end > from) {
    for await (const r of layerRuns(layer, from, end)) {
      if (r.kind !== 'absent') yield r
      else if (layer.parent) yield* chainRuns(layer.parent, r.offset, r.offset + r.length)
      else yield { offset: r.offset, length: r.length, kind: 'zero' }
    }
  }
  // beyond a (smaller) parent's end the disk reads as zeros
  if (to > Math.max(from, end)) yield { offset: Math.max(from, end), length: to - Math.max(from, end), kind: 'zero' }
}

/** Bytes of one file wanted at `at` of a read's output. */
interface Wanted {
  fileOffset: number
  length: number
  at: number
}

/** Unwanted bytes read rather than starting another request (a delta's grains interleave with its parent's data). */
const COALESCE_GAP = 256 * 1024

/**
 * Reads `list` from `file` into `out`, merging pieces less than {@link COALESCE_GAP} apart in the
 * file into one request of at most {@link MAX_RANGE} bytes: over the datastore interface every
 * request costs a round trip through vCenter.
 */
async function fetchCoalesced(file: RemoteFile, list: Wanted[], out: Buffer): Promise<void> {
  list.sort((a, b) => a.fileOffset - b.fileOffset)
  for (let i = 0; i < list.length; ) {
    const start = list[i].fileOffset
    let end = start + list[i].length
    let j = i + 1
    while (j < list.length && list[j].fileOffset - end <= COALESCE_GAP && Math.max(end, list[j].fileOffset + list[j].length) - start <= MAX_RANGE) {
      end = Math.max(end, list[j].fileOffset + list[j].length)
      j++
    }
    if (end - start > MAX_RANGE) {
      // one piece larger than a request (never for reads within the DiskReader's 32 MiB limit)
      const w = list[i]
      for (let o = 0; o < w.length; o += MAX_RANGE) (await file.read(w.fileOffset + o, Math.min(MAX_RANGE, w.length - o))).copy(out, w.at + o)
    } else {
      const span = await file.read(start, end - start)
      for (let k = i; k < j; k++) span.copy(out, list[k].at, list[k].fileOffset - start, list[k].fileOffset - start + list[k].length)
    }
    i = j
  }
}

/**
 * Opens the VMDK `file` (descriptor or monolithicSparse) and its chain of parents as one
 * {@link DiskReader} of the disk's contents as the top layer shows them.
 * - `openSibling(name)` opens an extent file of the descriptor's directory;
 * - `openParent(hint, depth)` opens the parent of the layer at `depth` (0 = `file`) given its
 *   `parentFileNameHint`, together with its own sibling opener.
 * The reader's size is the top layer's; more than `capacity` bytes is `E_MIG_DISK_READ_FAILED`.
 * Errors: see the module comment.
 */
export async function openVmdkChain(
  file: RemoteFile,
  openSibling: (name: string) => Promise<RemoteFile>,
  openParent: (hint: string, depth: number) => Promise<{ file: RemoteFile; openSibling: (name: string) => Promise<RemoteFile> }>,
  opts: { label: string; capacity: number },
): Promise<DiskReader> {
  const label = `${opts.label} (${file.name})`
  const top = await openLayer(file, openSibling, label)
  const seen = new Set([file.name])
  for (let layer = top, depth = 0; layer.parentHint; depth++) {
    if (depth >= MAX_DEPTH) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: the snapshot chain is deeper than ${MAX_DEPTH} disks`)
    const p = await openParent(layer.parentHint, depth)
    if (seen.has(p.file.name)) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: the snapshot chain loops back to ${p.file.name}`)
    seen.add(p.file.name)
    const parent = await openLayer(p.file, p.openSibling, `${opts.label} (${p.file.name})`)
    if (layer.parentCid && parent.cid && layer.parentCid !== parent.cid) {
      throw new MigError(
        'E_MIG_DISK_READ_FAILED',
        `${label}: ${layer.name} expects parent CID ${layer.parentCid} but ${parent.name} has CID ${parent.cid} (the chain changed after the snapshot)`,
      )
    }
    layer.parent = parent
    layer = parent
  }
  const size = top.size
  if (opts.capacity > 0 && size > opts.capacity)
    throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: the extents hold ${size} bytes, more than the disk's capacity of ${opts.capacity}`)
  let closed = false
  const DATA_PIECE = 1024 * 1024 * 1024

  return {
    size,
    async *extents(from: number): AsyncIterable<DiskExtent> {
      let cur: DiskExtent | null = null
      for await (const r of chainRuns(top, from, size)) {
        const zero = r.kind === 'zero'
        if (cur && cur.zero === zero && cur.offset + cur.length === r.offset && (zero || cur.length + r.length <= DATA_PIECE)) cur.length += r.length
        else {
          if (cur) yield cur
          cur = { offset: r.offset, length: r.length, zero }
        }
        while (cur && !cur.zero && cur.length > DATA_PIECE) {
          yield { offset: cur.offset, length: DATA_PIECE, zero: false }
          cur = { offset: cur.offset + DATA_PIECE, length: cur.length - DATA_PIECE, zero: false }
        }
      }
      if (cur) yield cur
    },
    async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
      if (closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read after close`)
      if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > size) {
        throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read of ${length} bytes at ${offset} is outside the disk (${size} bytes)`)
      }
      const out = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
      const wanted = new Map<RemoteFile, Wanted[]>()
      for await (const r of chainRuns(top, offset, offset + length)) {
        const at = r.offset - offset
        if (r.kind !== 'data') out.fill(0, at, at + r.length)
        else {
          const list = wanted.get(r.file) ?? []
          if (list.length === 0) wanted.set(r.file, list)
          list.push({ fileOffset: r.fileOffset, length: r.length, at })
        }
      }
      for (const [file, list] of wanted) await fetchCoalesced(file, list, out)
      return out
    },
    async close(): Promise<void> {
      closed = true
    },
  }
}
