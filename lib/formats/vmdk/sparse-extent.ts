/**
 * The grain table reader of a sparse VMDK extent, for the three sparse formats alike: hosted
 * sparse (`hosted-sparse.ts`), vmfsSparse (`cowd.ts`) and seSparse (`sesparse.ts`). Each format
 * module gives a {@link SparseCodec} (geometry and how to decode its directory and table
 * entries); {@link openSparseExtent} reads the header of a {@link VmdkFile}, picks the codec and
 * returns a {@link SparseExtent}: the grain directory in memory, grain tables loaded on demand
 * (neighbouring tables in one read, a bounded cache), and the runs of the extent as data (a file
 * range), zero, or absent (the parent's data).
 *
 * Faults: see `faults.ts` (`E_MIG_MALFORMED_ARCHIVE` for structure, `E_MIG_UNSUPPORTED_FORMAT`
 * for what is not read); a failed read is whatever the {@link VmdkFile} throws.
 */
import { BufferPool } from '../../buffer-pool.ts'
import { cowdCodec, COWD_HEADER_BYTES, COWD_MAGIC, parseCowdHeader } from './cowd.ts'
import { malformed } from './faults.ts'
import { hostedSparseCodec, parseKdmvHeader, parseStreamFooter, streamOptimizedCodec, VMDK_SPARSE_MAGIC } from './hosted-sparse.ts'
import { GRAIN_MARKER_BYTES, MAX_GD_ENTRIES, SECTOR } from './limits.ts'
import type { Grain, SparseCodec } from './sparse-codec.ts'
import { checkSeSparseVolatile, isSeSparse, parseSeSparseHeader, seSparseCodec } from './sesparse.ts'

/** Random access to the bytes of one file (a local file, a datastore file over HTTP). Offsets and lengths in bytes. */
export interface VmdkFile {
  /** For messages. */
  name: string
  size: number
  /**
   * Exactly `length` bytes at `offset` (at most {@link MAX_RANGE}); throws otherwise. With `into`
   * (at least `length` bytes) the bytes are written into it and the result is
   * `into.subarray(0, length)`, so many reads allocate nothing per read; a file that ignores
   * `into` returns its own buffer, and callers copy from it.
   */
  read(offset: number, length: number, into?: Buffer): Promise<Buffer>
}

/** Largest single read of a {@link VmdkFile}, bytes. */
export const MAX_RANGE = 32 * 1024 * 1024

/**
 * Grain table bytes kept per sparse extent; past it the tables loaded first are dropped first. A
 * copy walks the disk in order, its reads at most the chain reader's `DATA_PIECE` (64 MiB) and
 * the copy's read-ahead behind its extent walk: a few dozen tables (a vmfsSparse table of
 * 512-byte grains, 16 KiB, maps 2 MiB; a seSparse one, 32 KiB, maps 16 MiB), where 4 MiB holds
 * 256 vmfsSparse tables.
 */
const TABLE_CACHE_BYTES = 4 * 1024 * 1024
/** Bytes read at once when a grain table is needed (neighbouring tables come along). */
const TABLE_WINDOW = 256 * 1024

/** A run of an extent or a layer over `[offset, offset + length)` of the virtual disk. */
export type Run =
  | { offset: number; length: number; kind: 'zero' | 'absent' }
  | { offset: number; length: number; kind: 'data'; file: VmdkFile; fileOffset: number }

/** A sparse extent: grain directory in memory, grain tables on demand. */
export class SparseExtent {
  private readonly tableBytes: number
  /** File byte offset of each grain table, or -1 when the directory entry is unallocated. */
  private readonly tableAt: Float64Array
  /** Directory indexes sorted by table offset, for loading neighbouring tables in one read. */
  private byOffset: Int32Array | null = null
  /** Loaded tables in the order they were loaded (the first dropped first). */
  private readonly tables = new Map<number, Uint32Array>()
  /** The buffer table windows are read into, reused from load to load. */
  private readonly windows = new BufferPool({ kept: 1, maxKept: TABLE_WINDOW, minBytes: TABLE_WINDOW })

  constructor(
    readonly file: VmdkFile,
    readonly g: SparseCodec,
    gd: Buffer,
  ) {
    this.tableBytes = g.gtEntries * g.entryBytes
    this.tableAt = new Float64Array(g.gdEntries)
    for (let i = 0; i < g.gdEntries; i++) {
      const at = g.tableAt(gd, i)
      if (at !== -1 && at + this.tableBytes > file.size) throw malformed(file.name, `grain table ${i} at byte ${at} lies outside the file (truncated?)`)
      this.tableAt[i] = at
    }
  }

  /** Virtual bytes one grain table covers. */
  get span(): number {
    return this.g.grainBytes * this.g.gtEntries
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
    // binary search for the first table at or after `start` in file order
    const order = this.byOffset
    let lo = 0
    let hi = order.length
    while (lo < hi) {
      const mid = (lo + hi) >> 1
      if (this.tableAt[order[mid]] < start) lo = mid + 1
      else hi = mid
    }
    // The window reaches over the tables that follow this one closely (a hosted sparse or
    // vmfsSparse extent keeps them side by side), up to TABLE_WINDOW; tables far apart (a
    // stream-optimized extent writes one after every 512 grains) are read one at a time.
    let end = start + this.tableBytes
    for (let k = lo + 1; k < order.length; k++) {
      const at = this.tableAt[order[k]]
      if (at > end + this.tableBytes || at + this.tableBytes > start + TABLE_WINDOW) break
      end = Math.max(end, at + this.tableBytes)
    }
    end = Math.min(this.file.size, end)
    const window = this.windows.take(end - start)
    try {
      const buf = await this.file.read(start, end - start, window)
      // every table lying wholly inside the window
      for (let k = lo; k < order.length; k++) {
        const i = order[k]
        const off = this.tableAt[i] - start
        if (off + this.tableBytes > buf.length) break
        if (this.tables.has(i)) continue
        const words = new Uint32Array(this.tableBytes / 4)
        for (let w = 0; w < words.length; w++) words[w] = buf.readUInt32LE(off + w * 4)
        this.tables.set(i, words)
      }
    } finally {
      this.windows.give(window)
    }
    for (const oldest of this.tables.keys()) {
      if (this.tables.size * this.tableBytes <= TABLE_CACHE_BYTES || oldest === t) break
      this.tables.delete(oldest)
    }
    return this.tables.get(t) ?? null
  }

  /** Decodes entry `k` of a loaded table, bounds-checked against the file. */
  private grainOf(words: Uint32Array, k: number, g: number): Grain {
    const at = this.g.grainOf(words, k, g)
    if (typeof at !== 'number') return at
    if (!Number.isSafeInteger(at) || at + (this.g.compressed ? GRAIN_MARKER_BYTES : this.g.grainBytes) > this.file.size)
      throw malformed(this.file.name, `grain ${g} at byte ${at} lies outside the file (truncated?)`)
    return at
  }

  /**
   * The grains of grain table `t` (entry `k` is grain `t * gtEntries + k`), decoded and checked
   * against the file as {@link runs} does; null when the table is unallocated (every grain
   * absent). For a compressed codec a number is the file offset of the grain's marker.
   * `E_MIG_MALFORMED_ARCHIVE` for an entry outside the file.
   */
  async tableGrains(t: number): Promise<Grain[] | null> {
    const words = t < this.g.gdEntries ? await this.table(t) : null
    if (!words) return null
    const out: Grain[] = new Array(this.g.gtEntries)
    for (let k = 0; k < this.g.gtEntries; k++) out[k] = this.grainOf(words, k, t * this.g.gtEntries + k)
    return out
  }

  /**
   * Runs of `[from, to)` (extent-relative bytes, within the capacity), merged: allocated grains
   * contiguous in the file form one `data` run.
   */
  async *runs(from: number, to: number, base: number): AsyncIterable<Run> {
    let cur: Run | null = null
    /** Extends the current run by `[offset, offset + length)` or starts a new one, returning the run finished (no object per grain). */
    const push = (offset: number, length: number, kind: Run['kind'], fileOffset: number): Run | null => {
      if (
        cur &&
        cur.kind === kind &&
        cur.offset + cur.length === offset &&
        (kind !== 'data' || (cur.kind === 'data' && cur.fileOffset + cur.length === fileOffset))
      ) {
        cur.length += length
        return null
      }
      const done = cur
      cur = kind === 'data' ? { offset, length, kind, file: this.file, fileOffset } : { offset, length, kind }
      return done
    }
    const span = this.span
    for (let t = Math.floor(from / span); t * span < to; t++) {
      const s = Math.max(from, t * span)
      const e = Math.min(to, (t + 1) * span)
      const words = t < this.g.gdEntries ? await this.table(t) : null
      if (!words) {
        const done = push(base + s, e - s, 'absent', 0)
        if (done) yield done
        continue
      }
      for (let o = s; o < e; ) {
        const gi = Math.floor(o / this.g.grainBytes)
        const inGrain = o - gi * this.g.grainBytes
        const n = Math.min(this.g.grainBytes - inGrain, e - o)
        const grain = this.grainOf(words, gi - t * this.g.gtEntries, gi)
        const done = typeof grain === 'number' ? push(base + o, n, 'data', grain + inGrain) : push(base + o, n, grain, 0)
        if (done) yield done
        o += n
      }
    }
    if (cur) yield cur
  }
}

/**
 * Opens the sparse extent in `file` (any of the three magics) with its grain directory read in
 * whole; `maxGdEntries` bounds the directory (default {@link MAX_GD_ENTRIES}). Returns the extent
 * and, for a hosted sparse file, its embedded descriptor bytes (NUL padding removed; null when
 * none). Throws `E_MIG_MALFORMED_ARCHIVE` (bad header, directory or tables outside the file,
 * directory too large), `E_MIG_UNSUPPORTED_FORMAT` (compressed grains, seSparse journal to
 * replay, other versions).
 */
export async function openSparseExtent(file: VmdkFile, maxGdEntries = MAX_GD_ENTRIES): Promise<{ extent: SparseExtent; descriptor: Buffer | null }> {
  const label = file.name
  if (file.size < SECTOR) throw malformed(label, 'too small for a sparse extent header')
  const h = await file.read(0, Math.min(file.size, COWD_HEADER_BYTES))
  const magic = h.toString('latin1', 0, 4)
  let g: SparseCodec
  let descriptor: Buffer | null = null
  if (magic === VMDK_SPARSE_MAGIC) {
    const header = parseKdmvHeader(h.subarray(0, SECTOR), label)
    g = hostedSparseCodec(header, label)
    if (header.descriptorOffset > 0 && header.descriptorSize > 0) {
      const len = header.descriptorSize * SECTOR
      if (header.descriptorOffset * SECTOR + len > file.size) throw malformed(label, 'embedded descriptor lies outside the file')
      const raw = await file.read(header.descriptorOffset * SECTOR, len)
      const nul = raw.indexOf(0)
      descriptor = nul >= 0 ? raw.subarray(0, nul) : raw
    }
  } else if (magic === COWD_MAGIC) {
    g = cowdCodec(parseCowdHeader(h, label, file.size), label)
  } else if (isSeSparse(h)) {
    const header = parseSeSparseHeader(h, label)
    if ((header.volatileOffset + 1) * SECTOR > file.size) throw malformed(label, 'seSparse volatile header lies outside the file')
    checkSeSparseVolatile(await file.read(header.volatileOffset * SECTOR, SECTOR), label)
    g = seSparseCodec(header, label)
  } else {
    throw malformed(label, 'not a sparse extent (no KDMV, COWD or seSparse magic)')
  }
  return { extent: await loadDirectory(file, g, maxGdEntries), descriptor }
}

/**
 * Opens the stream-optimized extent in `file` (VMDK 5.0 "Stream-Optimized Compressed Sparse
 * Extents"): its header, the footer (the extent's last three sectors, as qemu reads it) when the
 * header's grain directory is `GD_AT_END`, and the grain directory read in whole. Resolves null
 * for any other file (not `KDMV`, or a hosted sparse extent whose grains are not
 * deflate-compressed with markers). Throws `E_MIG_MALFORMED_ARCHIVE` (bad header, no footer,
 * directory or tables outside the file, directory larger than `maxGdEntries`).
 */
export async function openStreamOptimizedExtent(file: VmdkFile, maxGdEntries = MAX_GD_ENTRIES): Promise<SparseExtent | null> {
  const label = file.name
  if (file.size < SECTOR) return null
  const head = await file.read(0, SECTOR)
  if (head.toString('latin1', 0, 4) !== VMDK_SPARSE_MAGIC) return null
  let header = parseKdmvHeader(head, label)
  if (!header.compressedGrains || !header.markers || header.compressAlgorithm !== 1) return null
  if (header.gdAtEnd) {
    const footer = file.size >= 4 * SECTOR ? parseStreamFooter(await file.read(file.size - 3 * SECTOR, 3 * SECTOR), label) : null
    if (!footer) throw malformed(label, 'stream-optimized extent has no footer and end-of-stream marker (truncated?)')
    header = footer
  }
  return loadDirectory(file, streamOptimizedCodec(header, label), maxGdEntries)
}

/** Reads the grain directory of codec `g` from `file` (at most `maxGdEntries` entries) and makes the extent. */
async function loadDirectory(file: VmdkFile, g: SparseCodec, maxGdEntries: number): Promise<SparseExtent> {
  const label = file.name
  // a directory longer than the capacity needs is only read as far as it is used
  g.gdEntries = Math.min(g.gdEntries, Math.ceil(g.capacityBytes / (g.grainBytes * g.gtEntries)))
  if (g.gdEntries > maxGdEntries) throw malformed(label, `grain directory of ${g.gdEntries} entries is too large (at most ${maxGdEntries})`)
  const gdBytes = g.gdEntries * g.entryBytes
  if (g.gdOffset <= 0 || g.gdOffset + gdBytes > file.size) throw malformed(label, `grain directory at byte ${g.gdOffset} lies outside the file`)
  const gd = Buffer.alloc(gdBytes)
  for (let o = 0; o < gdBytes; o += MAX_RANGE) (await file.read(g.gdOffset + o, Math.min(MAX_RANGE, gdBytes - o))).copy(gd, o)
  return new SparseExtent(file, g, gd)
}
