/**
 * Staging of OVF files stored in a way no reader can seek in (DSP0243 7.1 and 5.3): a file with
 * `ovf:compression="gzip"` and/or one cut into `ovf:chunkSize` chunks (`<href>.000000000`,
 * `<href>.000000001`, ... as tar members of an OVA or files beside the descriptor). The stored
 * bytes are streamed in order, inflated when gzip, and written as one plain file in a staging
 * directory, sparse (all-zero 64 KiB blocks are not written), which the usual readers then open.
 *
 * Memory stays flat (1 MiB write buffer, streams with 1 MiB high-water marks); disk use is the
 * file's inflated size less its zero blocks. A gzip stream inflating past `maxBytes` (a gzip
 * bomb, or a wrong capacity) and an invalid gzip stream are `E_MIG_MALFORMED_ARCHIVE`; chunks
 * missing or changed since inspection are `E_MIG_MALFORMED_ARCHIVE`; unreadable input is
 * `E_MIG_DISK_READ_FAILED`; a failed write to the staging directory (ENOSPC...) is
 * `E_MIG_DISK_WRITE_FAILED`. The staged file is removed on failure.
 */
import { randomUUID } from 'node:crypto'
import { createReadStream, existsSync } from 'node:fs'
import { mkdir, open, rm, stat, type FileHandle } from 'node:fs/promises'
import { pinnedPath } from '../../hostpath.ts'
import * as path from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { createGunzip } from 'node:zlib'
import { MigError, isMigError } from '../../errors.ts'
import { listTarMembers } from '../../formats/tar.ts'
import { memberKey } from '../../importers/ova-archive.ts'
import type { DiskSource } from '../../manifest.ts'
import { isAllZero } from '../chunker.ts'

/** A byte range of a file, bytes. */
interface StoredRange {
  path: string
  offset: number
  length: number
}

const IO_BYTES = 1024 * 1024
const ZERO_BLOCK = 64 * 1024

/** Where the stored bytes of `src` lie, in order: one range, or one per chunk. */
async function storedRanges(src: DiskSource, label: string): Promise<StoredRange[]> {
  if (src.layout !== 'ovf_chunks') {
    if (src.offset !== undefined && src.length !== undefined) return [{ path: src.path, offset: src.offset, length: src.length }]
    const st = await stat(pinnedPath(src.path)).catch((e: Error) => {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: ${e.message}`)
    })
    return [{ path: src.path, offset: 0, length: st.size }]
  }
  const total = src.length
  if (total === undefined || !src.member) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: a chunked file needs its member name and length`)
  const name = (i: number) => String(i).padStart(9, '0')
  const ranges: StoredRange[] = []
  let sum = 0
  if (existsSync(`${src.path}.${name(0)}`)) {
    // an OVF folder: chunk files beside the descriptor
    for (let i = 0; sum < total; i++) {
      const p = `${src.path}.${name(i)}`
      const st = await Promise.resolve()
        .then(() => stat(pinnedPath(p)))
        .catch(() => null)
      if (!st?.isFile() || st.size === 0)
        throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: chunk ${path.basename(p)} is missing or empty (the package changed since inspection)`)
      ranges.push({ path: p, offset: 0, length: st.size })
      sum += st.size
    }
  } else {
    // an OVA: chunk members of the archive
    const members = new Map((await listTarMembers(src.path)).filter((m) => m.type === 'file').map((m) => [memberKey(m.name), m]))
    for (let i = 0; sum < total; i++) {
      const m = members.get(`${src.member}.${name(i)}`)
      if (!m || m.size === 0)
        throw new MigError(
          'E_MIG_MALFORMED_ARCHIVE',
          `${label}: chunk member ${src.member}.${name(i)} is missing or empty (the archive changed since inspection)`,
        )
      ranges.push({ path: src.path, offset: m.offset, length: m.size })
      sum += m.size
    }
  }
  if (sum !== total) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: the chunks hold ${sum} bytes, ${total} at inspection`)
  return ranges
}

/** The stored bytes of `ranges`, in order; a range shorter than expected is `E_MIG_DISK_READ_FAILED`. */
async function* storedBytes(ranges: StoredRange[], label: string): AsyncIterable<Buffer> {
  for (const r of ranges) {
    if (r.length === 0) continue
    let got = 0
    for await (const c of createReadStream(pinnedPath(r.path), { start: r.offset, end: r.offset + r.length - 1, highWaterMark: IO_BYTES })) {
      got += (c as Buffer).length
      yield c as Buffer
    }
    if (got !== r.length) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: ${path.basename(r.path)} ended after ${got} of ${r.length} bytes`)
  }
}

/** Writes a stream into a file, leaving all-zero 64 KiB blocks as holes. */
class SparseWriter {
  private readonly buf = Buffer.allocUnsafe(IO_BYTES)
  private fill = 0
  /** Bytes of the file so far. */
  size = 0

  constructor(
    private readonly fh: FileHandle,
    private readonly maxBytes: number,
    private readonly label: string,
  ) {}

  async write(chunk: Buffer): Promise<void> {
    if (this.size + this.fill + chunk.length > this.maxBytes) {
      throw new MigError(
        'E_MIG_MALFORMED_ARCHIVE',
        `${this.label}: the file inflates to more than ${this.maxBytes} bytes (the disk's capacity with room for metadata); refusing it`,
      )
    }
    for (let o = 0; o < chunk.length; ) {
      const n = Math.min(chunk.length - o, this.buf.length - this.fill)
      chunk.copy(this.buf, this.fill, o, o + n)
      this.fill += n
      o += n
      if (this.fill === this.buf.length) await this.flush()
    }
  }

  private async flush(): Promise<void> {
    for (let o = 0; o < this.fill; o += ZERO_BLOCK) {
      const block = this.buf.subarray(o, Math.min(this.fill, o + ZERO_BLOCK))
      if (!isAllZero(block)) await this.fh.write(block, 0, block.length, this.size + o)
    }
    this.size += this.fill
    this.fill = 0
  }

  async end(): Promise<void> {
    await this.flush()
    await this.fh.truncate(this.size)
  }
}

/**
 * Stages the OVF file of `src` (gzip-compressed and/or chunked) as a plain file in `dir` and
 * returns its path. `maxBytes`: the most the inflated file may hold. Errors: see the module
 * comment; aborting `signal` stops the copy (`E_MIG_CANCELLED`).
 */
export async function stageOvfFile(src: DiskSource, opts: { dir: string; label: string; maxBytes: number; signal?: AbortSignal }): Promise<string> {
  const { label } = opts
  const ranges = await storedRanges(src, label)
  await mkdir(opts.dir, { recursive: true, mode: 0o700 })
  const staged = path.join(opts.dir, `${randomUUID()}.staged`)
  let fh: FileHandle | null = null
  try {
    fh = await open(staged, 'wx', 0o600)
    const writer = new SparseWriter(fh, opts.maxBytes, label)
    const sink = async (source: AsyncIterable<Buffer>) => {
      for await (const c of source) await writer.write(c)
    }
    const input = Readable.from(storedBytes(ranges, label), { objectMode: false, highWaterMark: IO_BYTES })
    if (src.compression === 'gzip') await pipeline(input, createGunzip({ chunkSize: 256 * 1024 }), sink, { signal: opts.signal })
    else await pipeline(input, sink, { signal: opts.signal })
    await writer.end()
    await fh.close()
    fh = null
    return staged
  } catch (e) {
    await fh?.close().catch(() => {})
    await rm(staged, { force: true })
    if (isMigError(e)) throw e
    const err = e as NodeJS.ErrnoException
    if (err.name === 'AbortError' || opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', `${label}: staging cancelled`)
    if (typeof err.code === 'string' && err.code.startsWith('Z_'))
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: not a valid gzip stream (${err.message})`, { cause: e })
    if (err.code === 'ENOSPC' || err.code === 'EDQUOT' || err.code === 'EROFS' || err.code === 'EACCES') {
      throw new MigError('E_MIG_DISK_WRITE_FAILED', `${label}: staging the file in ${opts.dir} failed: ${err.message}`, { cause: e })
    }
    throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: ${err.message}`, { cause: e })
  }
}
