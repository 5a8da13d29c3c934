/**
 * What the sinks share (DESIGN.md section 6): {@link HandleVolume}, the positioned-write volume
 * over an open regular file or block device (the file sink's images, the zvol sink's devices,
 * virt-v2v's output volumes), and the job-id check that makes a job id a safe path segment and
 * dataset name.
 */
import { constants as C } from 'node:fs'
import { open, readFile, realpath, type FileHandle } from 'node:fs/promises'
import { basename } from 'node:path'
import { MigError } from '../errors.ts'
import type { SinkVolume, WriteSegment } from './types.ts'
import { WriterThread, type WriteOutcome } from './writer-thread.ts'

/** Zero runs shorter than this are written as zeros instead of discarded (a discard spawns a process), bytes. */
export const DISCARD_MIN_BYTES = 1024 * 1024

/** A job id usable as a path segment and dataset name: `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`. */
export function checkJobId(jobId: string): string {
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(jobId)) throw new MigError('E_MIG_INTERNAL', `sink: invalid job id ${JSON.stringify(jobId)}`)
  return jobId
}

/** `E_MIG_DISK_WRITE_FAILED` for a failed volume operation, naming the volume, the offset and the errno. */
export function writeFailed(path: string, what: string, offset: number, e: unknown): MigError {
  const code = (e as NodeJS.ErrnoException)?.code
  return new MigError('E_MIG_DISK_WRITE_FAILED', `${path}: ${what} at offset ${offset} failed: ${(e as Error)?.message ?? String(e)}`, {
    cause: e,
    details: { volume: path, offset, ...(code ? { errno: code } : {}) },
  })
}

/** Offset, length and memory alignment of the writes a volume sends through its O_DIRECT handle, bytes. */
export const DIRECT_ALIGN = 4096

/**
 * Data bytes a volume writes through the page cache before its writes go `O_DIRECT` (1 GiB):
 * a small disk fits the kernel's dirty-page budget, where page-cache writes merge and are
 * faster; past it, writes bypass the cache, so one import never leaves more than this in it.
 */
export const PAGE_CACHE_BYTES = 1024 ** 3

/**
 * Opens a second, write-only handle with `O_DIRECT` on the file or block device `fh` has open,
 * through `/proc/self/fd/<fd>` (the same open file, never its name again), so a volume's bulk
 * writes bypass the host's page cache (open(2) `O_DIRECT`; what oVirt does with
 * `qemu-img convert -t none`): an import of a fleet does not evict the running guests' cache,
 * and on this project's machines it costs far less kernel CPU (`dd` of 4 GiB: 0.5-0.7 s direct,
 * 10-14 s through the page cache).
 * Resolves null where the file system refuses `O_DIRECT` (open answers EINVAL: tmpfs before
 * Linux 6.6, some FUSE file systems) or the reopen fails: the volume then writes through the page
 * cache only. Never throws.
 */
export async function openDirect(fh: FileHandle): Promise<FileHandle | null> {
  return open(`/proc/self/fd/${fh.fd}`, C.O_WRONLY | C.O_DIRECT).catch(() => null)
}

/** How a {@link HandleVolume} discards a range: resolves true when done, false to fall back to zero-fill. */
export type Discarder = (offset: number, length: number) => Promise<boolean>

/**
 * A {@link SinkVolume} over an open handle (regular file or block device). Bytes.
 * `fresh`: the volume was just created and reads as zeros everywhere, so zero runs beyond
 * everything written through this object need no I/O. `discard`: punches/discards a range
 * (runs of at least {@link DISCARD_MIN_BYTES}, aligned to `discardAlign`); when it answers
 * false or is absent, the range is overwritten with zeros. `qemuDriver`: how qemu opens `path`
 * (`file` or `host_device`), which enables {@link SinkVolume.qemuTarget}. `direct`: an
 * {@link openDirect} handle of the same file: once `pageCacheBytes` (default
 * {@link PAGE_CACHE_BYTES}) of data went through the page cache, writes whose offset and length
 * are multiples of {@link DIRECT_ALIGN} go through it, the first one after an fsync of what the
 * cache holds (and qemu-img writes with `-t none`); the
 * rest, and any the kernel refuses with EINVAL (a buffer not aligned in memory), through the page
 * cache. `writeback`: `always` (default) or `while-cached` (a block device: only while its writes
 * go through the page cache), see {@link SinkVolume.writeback}. Writes and zero-fills are done in
 * the order they were called, on the volume's {@link WriterThread}. `flush()` waits for them and
 * fsyncs the file, which covers both handles.
 */
export class HandleVolume implements SinkVolume {
  private writtenEnd = 0
  private closed = false
  /** Data bytes written through the page cache so far (see `pageCacheBytes`). */
  private cachedBytes = 0
  /**
   * The fsync before the first `O_DIRECT` write: the page cache's writes get their blocks first
   * (ext4 allocates them at writeback), so the file's blocks are allocated in the order of the
   * copy; a direct write allocating past page-cache data not yet written back left ext4's extent
   * tree one block larger than `qemu-img convert`'s (32 GiB `sparse`, 4 KiB over).
   * Once it is set, every write, zero-fill, flush and close waits for it before it reaches the
   * writer thread, so they still reach it in the order they were called (before it is set they
   * are queued at once).
   */
  private directGate: Promise<void> | null = null
  /**
   * The first fsync failure, thrown by every later flush: Linux reports a failed writeback to one
   * fsync of the file only (of two at once, to one of them), and the pages it could not write are
   * marked clean, so a later fsync that succeeds says nothing of them. A checkpoint beside the
   * copy's writeback flushes must not move a watermark over lost data; so fsyncs also run one at
   * a time (`lastSync`).
   */
  private syncFailure: MigError | null = null
  private lastSync: Promise<void> = Promise.resolve()
  private readonly writer = new WriterThread()

  constructor(
    private readonly fh: FileHandle,
    readonly path: string,
    readonly capacity: number,
    readonly blockSize: number,
    private readonly opts: {
      fresh: boolean
      discard?: Discarder
      discardAlign?: number
      qemuDriver?: 'file' | 'host_device'
      direct?: FileHandle | null
      pageCacheBytes?: number
      writeback?: 'always' | 'while-cached'
    },
  ) {
    if (opts.qemuDriver) {
      this.qemuTarget = {
        // No image locks: the qemu-img engine runs several qemu-img on disjoint ranges of the
        // volume at once, and qemu's locks refuse a second writer ("Failed to get "resize" lock").
        // The volume is the job's own; nothing else opens it while the copy runs.
        node: { driver: opts.qemuDriver, filename: path, locking: 'off' },
        inOrder: opts.qemuDriver === 'file',
        takeDirect: (length: number) => {
          if (this.cacheLeft() > 0 || !this.opts.direct) {
            this.cachedBytes += length
            return false
          }
          return true
        },
        isZero: (offset: number) => this.opts.fresh && offset >= this.writtenEnd,
        noteWritten: (end: number) => {
          if (end > this.writtenEnd) this.writtenEnd = end
        },
      }
    }
  }

  /** See {@link SinkVolume.writeback}: `while-cached`, until the writes go `O_DIRECT`. */
  get writeback(): boolean {
    return this.opts.writeback !== 'while-cached' || !this.opts.direct || this.cacheLeft() > 0
  }

  /** See {@link SinkVolume.qemuTarget}: set when `opts.qemuDriver` names the qemu driver of `path`. */
  readonly qemuTarget?: SinkVolume['qemuTarget']

  /** Bytes the page cache may still take before aligned writes go `O_DIRECT`. */
  private cacheLeft(): number {
    return (this.opts.pageCacheBytes ?? PAGE_CACHE_BYTES) - this.cachedBytes
  }

  private check(what: string, offset: number, length: number): void {
    if (this.closed) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${this.path}: ${what} at offset ${offset} after close`)
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > this.capacity) {
      throw new MigError(
        'E_MIG_DISK_WRITE_FAILED',
        `${this.path}: ${what} of ${length} bytes at offset ${offset} is outside the volume (${this.capacity} bytes)`,
        {
          details: { volume: this.path, offset },
        },
      )
    }
  }

  /**
   * Writes all of `buf` at `offset` (bytes): through the O_DIRECT handle when it is aligned (see
   * the class), else through the page cache; after the writes called before it. Resolves when
   * written. `E_MIG_DISK_WRITE_FAILED` (ENOSPC, EIO, out of range), naming the volume and the
   * offset where the write stopped.
   */
  async write(offset: number, buf: Buffer): Promise<void> {
    await this.writeSegments(buf, [{ offset, start: 0, length: buf.length }])
  }

  /**
   * See {@link SinkVolume.writeSegments}: each segment as {@link write} would write it (page
   * cache or O_DIRECT), as one call of the writer thread; the segments are checked before any is
   * written. Where the writes turn `O_DIRECT` during the list, the segments routed before that go
   * at once and the rest after the fsync before the first direct write (which must follow the
   * page-cache writes before it): two calls. `E_MIG_DISK_WRITE_FAILED` naming the volume and the
   * offset where a write stopped; `E_MIG_INTERNAL` for a segment outside `buf`.
   */
  async writeSegments(buf: Buffer, segments: readonly WriteSegment[]): Promise<void> {
    for (const s of segments) {
      this.check('write', s.offset, s.length)
      if (!Number.isSafeInteger(s.start) || s.start < 0 || s.start + s.length > buf.length)
        throw new MigError('E_MIG_INTERNAL', `${this.path}: write segment [${s.start}, +${s.length}) is outside its ${buf.length}-byte buffer`)
    }
    // Flat quadruples (see WriterThread.write): routed while no fsync gate stood, and after it.
    const ungated: number[] = []
    const gated: number[] = []
    for (const s of segments) {
      const fd = this.route(s.offset, s.length)
      const list = this.directGate ? gated : ungated
      list.push(fd, s.offset, s.start, s.length)
    }
    // The ungated list becomes the writer thread's last call here, synchronously (ScriptThread.call
    // queues it for the next batch); a gate created in the loop above drains the writer from a later
    // microtask (syncFile), so that drain waits for these writes and its fsync follows them.
    const sends: Promise<void>[] = []
    if (ungated.length > 0) sends.push(this.send(buf, ungated))
    const gate = this.directGate
    if (gate && gated.length > 0) sends.push(gate.then(() => this.send(buf, gated)))
    await Promise.all(sends)
  }

  /**
   * The descriptor a write of `length` bytes at `offset` goes through: the O_DIRECT handle when
   * the page cache's budget is spent and the write is aligned (the first one sets the fsync gate
   * before it), else the page-cache handle (counted against the budget).
   */
  private route(offset: number, length: number): number {
    const direct = this.opts.direct
    if (direct && this.cacheLeft() <= 0 && offset % DIRECT_ALIGN === 0 && length % DIRECT_ALIGN === 0) {
      this.directGate ??= this.syncFile()
      return direct.fd
    }
    this.cachedBytes += length
    return this.fh.fd
  }

  /**
   * Writes the segments `segs` of `buf` (flat quadruples, see {@link WriterThread.write}) on the
   * writer thread and notes how far the volume was written; `E_MIG_DISK_WRITE_FAILED` at the
   * offset where a write stopped.
   */
  private async send(buf: Buffer, segs: number[]): Promise<void> {
    const o = await this.writer.write(this.fh.fd, buf, segs)
    this.cachedBytes += o.fellBack
    if (o.error) throw this.failed(`write of ${segs[o.error.seg * 4 + 3]} bytes`, o.error)
    for (let i = 0; i < segs.length; i += 4) {
      const end = segs[i + 1]! + segs[i + 3]!
      if (end > this.writtenEnd) this.writtenEnd = end
    }
  }

  /** `E_MIG_DISK_WRITE_FAILED` for the writer thread's failed `what`, at the offset it reached. */
  private failed(what: string, error: NonNullable<WriteOutcome['error']>): MigError {
    return writeFailed(this.path, what, error.at, Object.assign(new Error(error.message), { code: error.code }))
  }

  private async fill(offset: number, length: number): Promise<void> {
    if (length <= 0) return
    if (this.directGate) await this.directGate
    const o = await this.writer.zeros(this.fh.fd, offset, length)
    if (o.error) throw this.failed(`zero-fill of ${length} bytes`, o.error)
  }

  /**
   * Makes `[offset, offset+length)` read as zeros: nothing on a fresh volume past what was
   * written; otherwise a discard of the aligned middle of runs of at least 1 MiB and zero-fill
   * of the rest. `E_MIG_DISK_WRITE_FAILED`.
   */
  async zero(offset: number, length: number): Promise<void> {
    this.check('zero', offset, length)
    let end = offset + length
    if (this.opts.fresh) end = Math.min(end, this.writtenEnd)
    if (end <= offset) return
    const len = end - offset
    const align = this.opts.discardAlign ?? 1
    if (this.opts.discard && len >= DISCARD_MIN_BYTES) {
      const a = Math.ceil(offset / align) * align
      const b = Math.floor(end / align) * align
      if (b > a && (await this.opts.discard(a, b - a))) {
        await this.fill(offset, a - offset)
        await this.fill(b, end - b)
        return
      }
    }
    await this.fill(offset, len)
  }

  /**
   * fsync: everything written or zeroed before is durable afterwards. `E_MIG_DISK_WRITE_FAILED`;
   * once an fsync failed, every later flush fails with that error.
   */
  async flush(): Promise<void> {
    if (this.closed) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${this.path}: flush after close`)
    if (this.directGate) await this.directGate
    await this.syncFile()
  }

  /**
   * After the fsync in flight (if any), waits for the writes queued on the writer thread, then
   * fsyncs the file. `E_MIG_DISK_WRITE_FAILED`, and the first failure again ever after.
   */
  private syncFile(): Promise<void> {
    const run = async (): Promise<void> => {
      await this.writer.drain()
      if (this.syncFailure) throw this.syncFailure
      try {
        await this.fh.sync()
      } catch (e) {
        this.syncFailure ??= writeFailed(this.path, 'flush (fsync)', this.writtenEnd, e)
        throw this.syncFailure
      }
    }
    const p = this.lastSync.then(run)
    this.lastSync = p.catch(() => {})
    return p
  }

  /** Waits for the writes called before, ends the writer thread and closes the handles; never throws. */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    if (this.directGate) await this.directGate.catch(() => {})
    await this.writer.close()
    await this.opts.direct?.close().catch(() => {})
    await this.fh.close().catch(() => {})
  }
}

/** Size of a block device in bytes, from `/sys/class/block/<dev>/size` (512-byte sectors), or null when unknown. */
export async function blockDeviceSize(dev: string): Promise<number | null> {
  try {
    const real = await realpath(dev)
    const sectors = Number((await readFile(`/sys/class/block/${basename(real)}/size`, 'utf8')).trim())
    return Number.isSafeInteger(sectors) ? sectors * 512 : null
  } catch {
    return null
  }
}
