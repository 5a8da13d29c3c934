/**
 * Reading a VMDK on a vSphere datastore through the datastore HTTP interface
 * (`GET https://<vcenter>/folder/<path>?dcPath=<datacenter>&dsName=<datastore>` with `Range`,
 * authenticated by the SOAP session cookie; vSphere Web Services SDK Programming Guide,
 * "Datastore file access over HTTP"), decoded in TypeScript into a {@link DiskReader}:
 *
 * - a descriptor file (`# Disk DescriptorFile`) naming its extents: `FLAT`/`VMFS` extents are raw
 *   byte ranges (read with `Range`), `ZERO` extents read as zeros, `SPARSE` extents are hosted
 *   sparse files;
 * - a monolithicSparse file (magic `KDMV`): one hosted sparse extent;
 * - hosted sparse extents (VMware "Virtual Disk Format 5.0", hosted sparse extent header, grain
 *   directory and grain tables): unallocated and zeroed grains are reported as zero extents and
 *   never fetched; allocated grains contiguous in the file are fetched with one range request.
 *
 * Refused: delta disks (a `parentFileNameHint` or a parent CID other than `ffffffff`), VMFSSPARSE
 * and SESPARSE deltas, raw device mappings, compressed or stream-optimized grains
 * (`E_MIG_UNSUPPORTED_FORMAT`); malformed or hostile headers, extent names leaving the disk's
 * directory, short or failed reads (`E_MIG_DISK_READ_FAILED`).
 */
import { request } from 'undici/index.js'
import { MigError } from '../../errors.ts'
import type { DiskExtent, DiskReader } from '../../pipeline/readers/types.ts'
import { x, type VimClient } from './soap.ts'

/** Random access to the bytes of one file. Offsets and lengths in bytes. */
export interface RemoteFile {
  /** For messages. */
  name: string
  size: number
  /** Exactly `length` bytes at `offset`; `E_MIG_DISK_READ_FAILED` otherwise. */
  read(offset: number, length: number): Promise<Buffer>
}

/** A datastore path `[datastore] dir/file.vmdk` split into its parts. */
export interface DatastorePath {
  datastore: string
  path: string
}

/** Parses `[ds] dir/file`; `E_MIG_DISK_READ_FAILED` when it is not one. */
export function parseDatastorePath(s: string): DatastorePath {
  const m = /^\[([^\]]+)\]\s*(.*)$/.exec(s.trim())
  if (!m || m[2] === '' || m[2].split('/').some((p) => p === '..')) throw new MigError('E_MIG_DISK_READ_FAILED', `${JSON.stringify(s)} is not a datastore file path`)
  return { datastore: m[1], path: m[2] }
}

/** Largest single range request, bytes. */
const MAX_RANGE = 32 * 1024 * 1024

/**
 * Files of one datacenter's datastores over `/folder`, through the client's connection pool and
 * session cookie. `dcPath` is the datacenter's inventory path (e.g. `DC0` or `Folder/DC1`).
 */
export class DatastoreHttp {
  constructor(
    private readonly client: VimClient,
    private readonly dcPath: string,
    private readonly timeoutMs = 120_000,
  ) {}

  /** The `/folder` URL of a datastore file. */
  url(f: DatastorePath): string {
    const origin = new URL(this.client.sdkUrl).origin
    const p = f.path.split('/').map(encodeURIComponent).join('/')
    return `${origin}/folder/${p}?dcPath=${encodeURIComponent(this.dcPath)}&dsName=${encodeURIComponent(f.datastore)}`
  }

  private async get(f: DatastorePath, range: string, max: number): Promise<{ status: number; contentRange: string | null; body: Buffer }> {
    for (let attempt = 0; ; attempt++) {
      const headers: Record<string, string> = { range }
      const cookie = this.client.sessionCookie
      if (cookie) headers.cookie = cookie
      let res
      try {
        res = await request(this.url(f), { method: 'GET', headers, dispatcher: this.client.dispatcher, signal: AbortSignal.timeout(this.timeoutMs) })
      } catch (e) {
        if (attempt < 2) {
          await new Promise((r) => setTimeout(r, 250 * 2 ** attempt))
          continue
        }
        throw new MigError('E_MIG_DISK_READ_FAILED', `[${f.datastore}] ${f.path}: ${(e as Error).message}`, { cause: e })
      }
      if ((res.statusCode === 401 || res.statusCode === 403) && attempt === 0) {
        await res.body.dump().catch(() => {})
        // The session may have expired: any SOAP call logs in again on NotAuthenticated.
        await this.client.call('CurrentTime', x.ref('_this', { type: 'ServiceInstance', value: 'ServiceInstance' })).catch(() => {})
        continue
      }
      if (res.statusCode === 503 && attempt < 2) {
        await res.body.dump().catch(() => {})
        await new Promise((r) => setTimeout(r, 250 * 2 ** attempt))
        continue
      }
      const chunks: Buffer[] = []
      let total = 0
      for await (const c of res.body) {
        total += (c as Buffer).length
        if (total > max) {
          res.body.destroy()
          throw new MigError('E_MIG_DISK_READ_FAILED', `[${f.datastore}] ${f.path}: the server sent more than the ${max} bytes asked for (HTTP ${res.statusCode})`)
        }
        chunks.push(c as Buffer)
      }
      const cr = res.headers['content-range']
      return { status: res.statusCode, contentRange: typeof cr === 'string' ? cr : null, body: Buffer.concat(chunks) }
    }
  }

  /**
   * Opens a datastore file for range reads; its size comes from the `Content-Range` of a one-byte
   * read. `E_MIG_DISK_READ_FAILED` (missing file: HTTP 404, no range support, errors).
   */
  async open(f: DatastorePath): Promise<RemoteFile> {
    const name = `[${f.datastore}] ${f.path}`
    const probe = await this.get(f, 'bytes=0-0', 1)
    if (probe.status === 416) return { name, size: 0, read: async (o, l) => (l === 0 ? Buffer.alloc(0) : Promise.reject(new MigError('E_MIG_DISK_READ_FAILED', `${name}: read of ${l} bytes at ${o} beyond the end (0 bytes)`))) }
    if (probe.status === 404) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: not found on the datastore (HTTP 404)`)
    const m = probe.contentRange ? /^bytes\s+0-0\/(\d+)$/.exec(probe.contentRange.trim()) : null
    if (probe.status !== 206 || !m) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: the datastore did not answer a range request (HTTP ${probe.status})`)
    const size = Number(m[1])
    if (!Number.isSafeInteger(size)) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: implausible size ${m[1]}`)
    return {
      name,
      size,
      read: async (offset: number, length: number) => {
        if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > size || length > MAX_RANGE) {
          throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: read of ${length} bytes at ${offset} is outside the file (${size} bytes) or too large`)
        }
        if (length === 0) return Buffer.alloc(0)
        const r = await this.get(f, `bytes=${offset}-${offset + length - 1}`, length)
        const ok = r.status === 206 && r.contentRange !== null && r.contentRange.trim().startsWith(`bytes ${offset}-${offset + length - 1}/`)
        const whole = r.status === 200 && offset === 0 && length === size
        if (!(ok || whole) || r.body.length !== length) {
          throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: range read of ${length} bytes at ${offset} answered HTTP ${r.status} with ${r.body.length} bytes`)
        }
        return r.body
      },
    }
  }
}

const SECTOR = 512

/** One extent of the virtual disk: `[start, start + length)` bytes of the disk. */
type Piece =
  | { kind: 'zero'; start: number; length: number }
  | { kind: 'flat'; start: number; length: number; file: RemoteFile; fileOffset: number }
  | { kind: 'sparse'; start: number; length: number; sparse: SparseExtent }

/** A hosted sparse extent: header, grain directory, grain tables fetched on demand. */
class SparseExtent {
  readonly grainBytes: number
  readonly gtEntries: number
  readonly capacityBytes: number
  private readonly gd: Uint32Array
  private readonly gts = new Map<number, Uint32Array>()
  private readonly zeroGrainFlag: boolean

  private constructor(
    readonly file: RemoteFile,
    h: { capacity: number; grainSize: number; numGTEs: number; flags: number },
    gd: Uint32Array,
  ) {
    this.grainBytes = h.grainSize * SECTOR
    this.gtEntries = h.numGTEs
    this.capacityBytes = h.capacity * SECTOR
    this.gd = gd
    this.zeroGrainFlag = (h.flags & 4) !== 0
  }

  /** Reads and validates the header of `file` (at `base`, 0). Returns the extent and its embedded descriptor text (monolithicSparse). */
  static async open(file: RemoteFile): Promise<{ extent: SparseExtent; descriptor: string | null }> {
    const fail = (why: string) => new MigError('E_MIG_DISK_READ_FAILED', `${file.name}: ${why}`)
    if (file.size < SECTOR) throw fail('too small for a sparse extent header')
    const h = await file.read(0, SECTOR)
    if (h.toString('latin1', 0, 4) !== 'KDMV') throw fail('not a hosted sparse extent (no KDMV magic)')
    const u64 = (o: number) => {
      const v = h.readBigUInt64LE(o)
      return v > BigInt(Number.MAX_SAFE_INTEGER) ? -1 : Number(v)
    }
    const version = h.readUInt32LE(4)
    const flags = h.readUInt32LE(8)
    const capacity = u64(12)
    const grainSize = u64(20)
    const descriptorOffset = u64(28)
    const descriptorSize = u64(36)
    const numGTEs = h.readUInt32LE(44)
    const gdOffset = u64(56)
    const compress = h.readUInt16LE(77)
    if (version < 1 || version > 3) throw fail(`unsupported sparse version ${version}`)
    if (gdOffset === -1 || (flags & 0x30000) !== 0 || compress !== 0) {
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${file.name}: compressed or stream-optimized grains are not read over the datastore interface`)
    }
    if (capacity < 0 || capacity > 2 ** 40) throw fail(`implausible capacity ${capacity} sectors`)
    if (grainSize < 1 || grainSize > 2048 || (grainSize & (grainSize - 1)) !== 0) throw fail(`invalid grain size ${grainSize} sectors`)
    if (numGTEs < 1 || numGTEs > 4096) throw fail(`invalid grain table size ${numGTEs}`)
    const gdEntries = Math.ceil(capacity / grainSize / numGTEs)
    if (gdEntries * 4 > 16 * 1024 * 1024) throw fail(`grain directory of ${gdEntries} entries is too large`)
    if (gdOffset <= 0 || (gdOffset * SECTOR) + gdEntries * 4 > file.size) throw fail(`grain directory at sector ${gdOffset} lies outside the file`)
    const gdBuf = Buffer.alloc(gdEntries * 4)
    for (let o = 0; o < gdBuf.length; o += MAX_RANGE) {
      const n = Math.min(MAX_RANGE, gdBuf.length - o)
      ;(await file.read(gdOffset * SECTOR + o, n)).copy(gdBuf, o)
    }
    const gd = new Uint32Array(gdEntries)
    for (let i = 0; i < gdEntries; i++) gd[i] = gdBuf.readUInt32LE(i * 4)
    let descriptor: string | null = null
    if (descriptorOffset > 0 && descriptorSize > 0) {
      const len = Math.min(descriptorSize * SECTOR, 64 * 1024)
      if (descriptorOffset * SECTOR + len > file.size) throw fail('embedded descriptor lies outside the file')
      descriptor = (await file.read(descriptorOffset * SECTOR, len)).toString('latin1').replace(/\0.*$/s, '')
    }
    return { extent: new SparseExtent(file, { capacity, grainSize, numGTEs, flags }, gd), descriptor }
  }

  /** Loads grain table `t` (and the other tables in the same 256 KiB window of the file). */
  private async table(t: number): Promise<Uint32Array | null> {
    const sector = this.gd[t]
    if (sector === 0) return null
    const cached = this.gts.get(t)
    if (cached) return cached
    const tableBytes = this.gtEntries * 4
    const start = sector * SECTOR
    if (start + tableBytes > this.file.size) throw new MigError('E_MIG_DISK_READ_FAILED', `${this.file.name}: grain table ${t} at sector ${sector} lies outside the file`)
    const windowEnd = Math.min(this.file.size, Math.max(start + tableBytes, start + 256 * 1024))
    const buf = await this.file.read(start, windowEnd - start)
    if (this.gts.size > 4096) this.gts.clear()
    for (let i = 0; i < this.gd.length; i++) {
      const off = this.gd[i] * SECTOR - start
      if (this.gd[i] !== 0 && off >= 0 && off + tableBytes <= buf.length && !this.gts.has(i)) {
        const gt = new Uint32Array(this.gtEntries)
        for (let k = 0; k < this.gtEntries; k++) gt[k] = buf.readUInt32LE(off + k * 4)
        this.gts.set(i, gt)
      }
    }
    return this.gts.get(t)!
  }

  /** The file byte offset of grain `g`, or null when it reads as zeros. */
  async grain(g: number): Promise<number | null> {
    const gt = await this.table(Math.floor(g / this.gtEntries))
    if (!gt) return null
    const e = gt[g % this.gtEntries]
    if (e === 0 || (e === 1 && this.zeroGrainFlag)) return null
    const off = e * SECTOR
    if (off >= this.file.size) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${this.file.name}: grain ${g} at sector ${e} lies outside the file (truncated?)`)
    }
    return off
  }

  /** Data/zero extents of `[from, to)` of this extent (extent-relative bytes), merged. */
  async *extents(from: number, to: number): AsyncIterable<DiskExtent> {
    let cur: DiskExtent | null = null
    const span = this.grainBytes * this.gtEntries
    for (let o = Math.floor(from / this.grainBytes) * this.grainBytes; o < to; ) {
      const t = Math.floor(o / span)
      let zero: boolean
      let next: number
      if (t >= this.gd.length || this.gd[t] === 0) {
        zero = true
        next = (t + 1) * span
      } else {
        zero = (await this.grain(o / this.grainBytes)) === null
        next = o + this.grainBytes
      }
      const s = Math.max(o, from)
      const e = Math.min(next, to)
      if (cur && cur.zero === zero && cur.offset + cur.length === s) cur.length += e - s
      else {
        if (cur) yield cur
        cur = { offset: s, length: e - s, zero }
      }
      o = next
    }
    if (cur) yield cur
  }

  /** Reads `[offset, offset + length)` (extent-relative) into `out` at `at`. */
  async readInto(offset: number, length: number, out: Buffer, at: number): Promise<void> {
    let run: { fileOff: number; outAt: number; len: number } | null = null
    const flush = async () => {
      if (!run) return
      const b = await this.file.read(run.fileOff, run.len)
      b.copy(out, run.outAt)
      run = null
    }
    for (let o = offset; o < offset + length; ) {
      const g = Math.floor(o / this.grainBytes)
      const inGrain = o - g * this.grainBytes
      const n = Math.min(this.grainBytes - inGrain, offset + length - o)
      const base = await this.grain(g)
      const dst = at + (o - offset)
      if (base === null) {
        await flush()
        out.fill(0, dst, dst + n)
      } else {
        const fileOff = base + inGrain
        if (fileOff + n > this.file.size) throw new MigError('E_MIG_DISK_READ_FAILED', `${this.file.name}: grain ${g} extends beyond the end of the file (truncated?)`)
        const r = run as { fileOff: number; outAt: number; len: number } | null
        if (r && r.fileOff + r.len === fileOff && r.outAt + r.len === dst) r.len += n
        else {
          await flush()
          run = { fileOff, outAt: dst, len: n }
        }
      }
      o += n
    }
    await flush()
  }
}

const EXTENT_LINE = /^(RW|RDONLY|NOACCESS)\s+(\d+)\s+(FLAT|SPARSE|ZERO|VMFS|VMFSSPARSE|VMFSRDM|VMFSRAW|SESPARSE)(?:\s+"([^"]*)"(?:\s+(\d+))?)?\s*$/

function refuseDelta(name: string, descriptor: string): void {
  const parent = /^\s*parentCID\s*=\s*([0-9a-fA-F]+)/m.exec(descriptor)?.[1]
  if ((parent && parent.toLowerCase() !== 'ffffffff') || /^\s*parentFileNameHint\s*=/m.test(descriptor)) {
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${name}: a delta disk (it has a parent); only base disks of a snapshot are read over the datastore interface`)
  }
}

/**
 * Opens the VMDK `file` (descriptor or monolithicSparse) of a datastore as a {@link DiskReader}.
 * `open` resolves an extent file name relative to the descriptor's directory. The reader's size
 * is the sum of the extents; more than `capacity` bytes is `E_MIG_DISK_READ_FAILED`.
 */
export async function openVmdk(file: RemoteFile, openSibling: (name: string) => Promise<RemoteFile>, opts: { label: string; capacity: number }): Promise<DiskReader> {
  const label = `${opts.label} (${file.name})`
  const pieces: Piece[] = []
  const head = await file.read(0, Math.min(file.size, 4))
  if (head.toString('latin1') === 'KDMV') {
    const { extent, descriptor } = await SparseExtent.open(file)
    if (descriptor) refuseDelta(label, descriptor)
    pieces.push({ kind: 'sparse', start: 0, length: extent.capacityBytes, sparse: extent })
  } else {
    if (file.size > 64 * 1024) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: neither a sparse extent nor a descriptor of at most 64 KiB`)
    const text = (await file.read(0, file.size)).toString('latin1')
    if (!/^#\s*Disk DescriptorFile/m.test(text)) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: not a VMDK descriptor`)
    refuseDelta(label, text)
    let start = 0
    for (const raw of text.split(/\r?\n/)) {
      const line = raw.trim()
      if (!/^(RW|RDONLY|NOACCESS)\s/.test(line)) continue
      const m = EXTENT_LINE.exec(line)
      if (!m) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: unreadable extent line ${JSON.stringify(line.slice(0, 120))}`)
      const sectors = Number(m[2])
      const type = m[3]
      const length = sectors * SECTOR
      if (!Number.isSafeInteger(length) || length <= 0) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: implausible extent size ${m[2]} sectors`)
      if (pieces.length >= 1024) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: more than 1024 extents`)
      if (type === 'ZERO') {
        pieces.push({ kind: 'zero', start, length })
      } else {
        const name = m[4]
        if (!name || name.includes('/') || name.includes('\\') || name === '.' || name === '..') throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: extent file ${JSON.stringify(name)} is not a file of the disk's directory`)
        if (type === 'FLAT' || type === 'VMFS') {
          const ext = await openSibling(name)
          const fileOffset = m[5] ? Number(m[5]) * SECTOR : 0
          if (fileOffset + length > ext.size) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: flat extent ${name} holds ${ext.size} bytes, fewer than the ${fileOffset + length} the descriptor says (truncated?)`)
          pieces.push({ kind: 'flat', start, length, file: ext, fileOffset })
        } else if (type === 'SPARSE') {
          const { extent } = await SparseExtent.open(await openSibling(name))
          if (extent.capacityBytes < length) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: sparse extent ${name} is smaller than the descriptor says`)
          pieces.push({ kind: 'sparse', start, length, sparse: extent })
        } else {
          throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: ${type} extents (ESXi deltas, raw device mappings) are not read over the datastore interface`)
        }
      }
      start += length
    }
    if (pieces.length === 0) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: the descriptor lists no extents`)
  }
  const size = pieces.reduce((s, p) => s + p.length, 0)
  if (opts.capacity > 0 && size > opts.capacity) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: the extents hold ${size} bytes, more than the disk's capacity of ${opts.capacity}`)
  let closed = false

  return {
    size,
    async *extents(from: number): AsyncIterable<DiskExtent> {
      for (const p of pieces) {
        const end = p.start + p.length
        if (end <= from) continue
        const s = Math.max(from, p.start)
        if (p.kind === 'zero') yield { offset: s, length: end - s, zero: true }
        else if (p.kind === 'flat') {
          for (let o = s; o < end; o += 1024 * 1024 * 1024) yield { offset: o, length: Math.min(1024 * 1024 * 1024, end - o), zero: false }
        } else {
          for await (const e of p.sparse.extents(s - p.start, p.length)) yield { offset: e.offset + p.start, length: e.length, zero: e.zero }
        }
      }
    },
    async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
      if (closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read after close`)
      if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > size) {
        throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read of ${length} bytes at ${offset} is outside the disk (${size} bytes)`)
      }
      const out = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
      for (const p of pieces) {
        const s = Math.max(offset, p.start)
        const e = Math.min(offset + length, p.start + p.length)
        if (e <= s) continue
        const at = s - offset
        if (p.kind === 'zero') out.fill(0, at, at + e - s)
        else if (p.kind === 'flat') (await p.file.read(p.fileOffset + (s - p.start), e - s)).copy(out, at)
        else await p.sparse.readInto(s - p.start, e - s, out, at)
      }
      return out
    },
    async close(): Promise<void> {
      closed = true
    },
  }
}

/** Opens `[ds] dir/disk.vmdk` of the datacenter `http` serves as a {@link DiskReader} (see {@link openVmdk}). */
export async function openDatastoreVmdk(http: DatastoreHttp, fileName: string, opts: { label: string; capacity: number }): Promise<DiskReader> {
  const f = parseDatastorePath(fileName)
  const dir = f.path.includes('/') ? f.path.slice(0, f.path.lastIndexOf('/') + 1) : ''
  const top = await http.open(f)
  return openVmdk(top, (name) => http.open({ datastore: f.datastore, path: dir + name }), opts)
}
