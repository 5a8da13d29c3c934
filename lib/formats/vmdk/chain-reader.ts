/**
 * The snapshot-chain reader of a VMDK: one disk (a text descriptor naming its extents, or a
 * hosted sparse file with an embedded descriptor) and its parents, composed into one
 * {@link DiskReader} of the disk's contents as the top layer shows them. Extents (VMware "Virtual
 * Disk Format 5.0"): `FLAT`/`VMFS` byte ranges, `ZERO`, and the sparse formats through
 * `sparse-extent.ts` (hosted sparse, vmfsSparse, seSparse). A layer with a parent
 * (`parentFileNameHint`, `parentCID` other than `ffffffff`) is a delta: grains it does not hold
 * read from the parent, recursively down to the base disk, where they read as zeros. Each child's
 * `parentCID` must equal its parent's `CID`.
 *
 * Files come as {@link VmdkFile}s (random access), so the same reader serves a datastore over
 * HTTP (`lib/adapters/vim/datastore.ts`) and files of this machine. The limits are those of
 * `limits.ts`; descriptors are parsed by `descriptor.ts`, as the offline inspection parses them.
 *
 * Faults (`faults.ts`): `E_MIG_MALFORMED_ARCHIVE` for a malformed or hostile disk (bad headers or
 * descriptors, extent names leaving the disk's directory, chains deeper than
 * {@link MAX_CHAIN_DEPTH} or looping, a CID mismatch, a delta without a parent name, grains or
 * tables outside their file, more data than the capacity); `E_MIG_UNSUPPORTED_FORMAT` for raw
 * device mappings, compressed or stream-optimized grains and seSparse journals to replay; failed
 * reads are what the {@link VmdkFile} throws. A caller for whom a bad file means something else
 * maps the code at its boundary (the `vim_api` adapter: `E_MIG_DISK_READ_FAILED`).
 */
import { BufferPool } from '../../buffer-pool.ts'
import { MigError } from '../../errors.ts'
import { landInto, type DiskExtent, type DiskReader } from '../../contracts/disk-reader.ts'
import { looksLikeDescriptor, parentCidOf, parseVmdkDescriptor, type VmdkDescriptor } from './descriptor.ts'
import { malformed, unsupported } from './faults.ts'
import { VMDK_SPARSE_MAGIC } from './hosted-sparse.ts'
import { MAX_CHAIN_DEPTH, MAX_DESCRIPTOR_BYTES, MAX_GD_ENTRIES, MAX_GD_ENTRIES_PER_CHAIN, SECTOR } from './limits.ts'
import { MAX_RANGE, openSparseExtent, type Run, type SparseExtent, type VmdkFile } from './sparse-extent.ts'

export { MAX_RANGE, type VmdkFile } from './sparse-extent.ts'

/** One extent of a layer: `[start, start + length)` bytes of the virtual disk. */
type Piece =
  | { kind: 'zero'; start: number; length: number }
  | { kind: 'flat'; start: number; length: number; file: VmdkFile; fileOffset: number }
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

/** Grain directory entries still allowed to the chain being opened ({@link MAX_GD_ENTRIES_PER_CHAIN}). */
interface Budget {
  gdEntries: number
}

async function openSparse(file: VmdkFile, budget: Budget): Promise<{ extent: SparseExtent; descriptor: Buffer | null }> {
  const opened = await openSparseExtent(file, Math.min(MAX_GD_ENTRIES, budget.gdEntries))
  budget.gdEntries -= opened.extent.g.gdEntries
  return opened
}

/** Opens one VMDK (descriptor or hosted sparse file) as a layer, its parent not yet attached. */
async function openLayer(file: VmdkFile, openSibling: (name: string) => Promise<VmdkFile>, label: string, budget: Budget): Promise<Layer> {
  const pieces: Piece[] = []
  const head = await file.read(0, Math.min(file.size, 4096))
  let d: VmdkDescriptor | null = null
  if (head.toString('latin1', 0, 4) === VMDK_SPARSE_MAGIC) {
    const { extent, descriptor } = await openSparse(file, budget)
    pieces.push({ kind: 'sparse', start: 0, length: extent.g.capacityBytes, sparse: extent })
    if (descriptor && descriptor.length > 0) d = parseVmdkDescriptor(descriptor, `${label} (embedded descriptor)`)
  } else {
    if (file.size > MAX_DESCRIPTOR_BYTES || !looksLikeDescriptor(head))
      throw malformed(label, `neither a sparse extent nor a descriptor of at most ${MAX_DESCRIPTOR_BYTES} bytes`)
    d = parseVmdkDescriptor(await file.read(0, file.size), label)
    let start = 0
    for (const e of d.extents) {
      const length = e.sectors * SECTOR
      if (e.type === 'ZERO') pieces.push({ kind: 'zero', start, length })
      else {
        const name = e.file ?? ''
        if (!name || name.includes('/') || name.includes('\\') || name === '.' || name === '..')
          throw malformed(label, `extent file ${JSON.stringify(name)} is not a file of the disk's directory`)
        if (e.type === 'FLAT' || e.type === 'VMFS') {
          const ext = await openSibling(name)
          const fileOffset = e.offset * SECTOR
          if (fileOffset + length > ext.size)
            throw malformed(label, `flat extent ${name} holds ${ext.size} bytes, fewer than the ${fileOffset + length} the descriptor says (truncated?)`)
          pieces.push({ kind: 'flat', start, length, file: ext, fileOffset })
        } else if (e.type === 'SPARSE' || e.type === 'VMFSSPARSE' || e.type === 'SESPARSE') {
          const { extent } = await openSparse(await openSibling(name), budget)
          if (extent.g.capacityBytes < length)
            throw malformed(label, `${e.type} extent ${name} holds ${extent.g.capacityBytes} bytes, fewer than the ${length} the descriptor says`)
          pieces.push({ kind: 'sparse', start, length, sparse: extent })
        } else {
          throw unsupported(label, `${e.type} extents (raw device mappings) are not read`)
        }
      }
      start += length
    }
  }
  const parentCid = d ? parentCidOf(d) : null
  const parentHint = d?.parentFileNameHint ?? null
  if (parentCid && !parentHint) throw malformed(label, `a delta disk (parentCID ${parentCid}) without a parentFileNameHint`)
  return {
    name: file.name,
    size: pieces.reduce((s, p) => s + p.length, 0),
    pieces,
    cid: d?.CID ?? null,
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
 * Longest data extent the reader yields, bytes. Yielding an extent walks the grain tables under
 * it, so this bounds how far the extent walk runs ahead of the copy's reads, whose tables must
 * still be cached when they come (64 MiB: 32 vmfsSparse or 4 seSparse tables).
 */
const DATA_PIECE = 64 * 1024 * 1024

/**
 * Buffers for requests that span several wanted pieces and the unwanted bytes between them: one
 * per read the copy loop keeps in flight (4 by default), each up to a 4 MiB chunk with its gaps.
 */
const spanPool = () => new BufferPool({ kept: 4, maxKept: 8 * 1024 * 1024, minBytes: 4 * 1024 * 1024 })

/** Reads `dst.length` bytes of `file` at `offset` into `dst`. */
async function readInto(file: VmdkFile, offset: number, dst: Buffer): Promise<void> {
  landInto(await file.read(offset, dst.length, dst), dst)
}

/**
 * Reads `list` from `file` into `out`, merging pieces less than {@link COALESCE_GAP} apart in the
 * file into one request of at most {@link MAX_RANGE} bytes: over the datastore interface every
 * request costs a round trip through vCenter. A request for one piece reads straight into `out`;
 * one spanning several reads into a buffer of `spans`.
 */
async function fetchCoalesced(file: VmdkFile, list: Wanted[], out: Buffer, spans: BufferPool): Promise<void> {
  list.sort((a, b) => a.fileOffset - b.fileOffset)
  for (let i = 0; i < list.length; ) {
    const start = list[i].fileOffset
    let end = start + list[i].length
    let j = i + 1
    while (j < list.length && list[j].fileOffset - end <= COALESCE_GAP && Math.max(end, list[j].fileOffset + list[j].length) - start <= MAX_RANGE) {
      end = Math.max(end, list[j].fileOffset + list[j].length)
      j++
    }
    if (j === i + 1) {
      // one piece: in requests of at most MAX_RANGE (one, for reads within the DiskReader's 32 MiB limit)
      const w = list[i]
      for (let o = 0; o < w.length; o += MAX_RANGE) await readInto(file, w.fileOffset + o, out.subarray(w.at + o, w.at + Math.min(w.length, o + MAX_RANGE)))
    } else {
      const buf = spans.take(end - start)
      try {
        await readInto(file, start, buf.subarray(0, end - start))
        for (let k = i; k < j; k++) buf.copy(out, list[k].at, list[k].fileOffset - start, list[k].fileOffset - start + list[k].length)
      } finally {
        spans.give(buf)
      }
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
 * - `opts.label` names the disk in messages; `opts.capacity` (bytes, 0 = unknown): more data than
 *   that is malformed.
 * The reader's size is the top layer's. Errors: see the module comment.
 */
export async function openVmdkChain(
  file: VmdkFile,
  openSibling: (name: string) => Promise<VmdkFile>,
  openParent: (hint: string, depth: number) => Promise<{ file: VmdkFile; openSibling: (name: string) => Promise<VmdkFile> }>,
  opts: { label: string; capacity: number },
): Promise<DiskReader> {
  const label = `${opts.label} (${file.name})`
  const budget: Budget = { gdEntries: MAX_GD_ENTRIES_PER_CHAIN }
  const top = await openLayer(file, openSibling, label, budget)
  const seen = new Set([file.name])
  for (let layer = top, depth = 0; layer.parentHint; depth++) {
    if (depth >= MAX_CHAIN_DEPTH) throw malformed(label, `the snapshot chain is deeper than ${MAX_CHAIN_DEPTH} disks`)
    const p = await openParent(layer.parentHint, depth)
    if (seen.has(p.file.name)) throw malformed(label, `the snapshot chain loops back to ${p.file.name}`)
    seen.add(p.file.name)
    const parent = await openLayer(p.file, p.openSibling, `${opts.label} (${p.file.name})`, budget)
    if (layer.parentCid && parent.cid && layer.parentCid !== parent.cid) {
      throw malformed(
        label,
        `${layer.name} expects parent CID ${layer.parentCid} but ${parent.name} has CID ${parent.cid} (the chain changed after the snapshot)`,
      )
    }
    layer.parent = parent
    layer = parent
  }
  const size = top.size
  if (opts.capacity > 0 && size > opts.capacity) throw malformed(label, `the extents hold ${size} bytes, more than the disk's capacity of ${opts.capacity}`)
  let closed = false
  const spans = spanPool()

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
      const wanted = new Map<VmdkFile, Wanted[]>()
      for await (const r of chainRuns(top, offset, offset + length)) {
        const at = r.offset - offset
        if (r.kind !== 'data') out.fill(0, at, at + r.length)
        else {
          const list = wanted.get(r.file) ?? []
          if (list.length === 0) wanted.set(r.file, list)
          list.push({ fileOffset: r.fileOffset, length: r.length, at })
        }
      }
      for (const [file, list] of wanted) await fetchCoalesced(file, list, out, spans)
      return out
    },
    async close(): Promise<void> {
      closed = true
    },
  }
}
