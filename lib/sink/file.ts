/**
 * The `file` sink (DESIGN.md section 6, the embedded default): one sparse raw image per disk at
 * `<dataDir>/volumes/migrations/<job-id>/<sanitizeLabel(label)>.img`, sized with `ftruncate`,
 * written with positioned writes. A fresh image is all holes, so zero runs over never-written
 * ranges cost nothing; zero runs over data written before (a resumed job, a delta pass) are
 * punched with `fallocate --punch-hole --keep-size` (large runs) or overwritten with zeros.
 *
 * Also exports {@link HandleVolume}, the positioned-write volume over an open file or block
 * device that the zvol sink reuses.
 */
import { spawn } from 'node:child_process'
import { constants as C } from 'node:fs'
import { mkdir, open, readdir, rename, rm, type FileHandle } from 'node:fs/promises'
import { join } from 'node:path'
import { MigError } from '../errors.ts'
import { sanitizeLabel } from '../manifest.ts'
import { ZERO_BUFFER } from '../pipeline/chunker.ts'
import type { Sink, SinkVolume, VolumeSnapshot } from './types.ts'

/** Zero runs shorter than this are written as zeros instead of discarded (a discard spawns a process), bytes. */
export const DISCARD_MIN_BYTES = 1024 * 1024

/** A job id usable as a path segment and dataset name: `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`. */
export function checkJobId(jobId: string): string {
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(jobId)) throw new MigError('E_MIG_INTERNAL', `sink: invalid job id ${JSON.stringify(jobId)}`)
  return jobId
}

/** Runs `cmd args` without a shell; resolves with its exit code (-1 when it cannot start) and output (capped at 64 KiB). */
export function runCommand(cmd: string, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    let stdout = ''
    let stderr = ''
    let child
    try {
      child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] })
    } catch (e) {
      return resolve({ code: -1, stdout, stderr: (e as Error).message })
    }
    child.stdout!.setEncoding('utf8').on('data', (s: string) => (stdout = (stdout + s).slice(0, 65536)))
    child.stderr!.setEncoding('utf8').on('data', (s: string) => (stderr = (stderr + s).slice(0, 65536)))
    child.once('error', (e) => resolve({ code: -1, stdout, stderr: stderr + e.message }))
    child.once('close', (code) => resolve({ code: code ?? -1, stdout, stderr }))
  })
}

function writeFailed(path: string, what: string, offset: number, e: unknown): MigError {
  const code = (e as NodeJS.ErrnoException)?.code
  return new MigError('E_MIG_DISK_WRITE_FAILED', `${path}: ${what} at offset ${offset} failed: ${(e as Error)?.message ?? String(e)}`, {
    cause: e,
    details: { volume: path, offset, ...(code ? { errno: code } : {}) },
  })
}

/** How a {@link HandleVolume} discards a range: resolves true when done, false to fall back to zero-fill. */
export type Discarder = (offset: number, length: number) => Promise<boolean>

/**
 * A {@link SinkVolume} over an open handle (regular file or block device). Bytes.
 * `fresh`: the volume was just created and reads as zeros everywhere, so zero runs beyond
 * everything written through this object need no I/O. `discard`: punches/discards a range
 * (runs of at least {@link DISCARD_MIN_BYTES}, aligned to `discardAlign`); when it answers
 * false or is absent, the range is overwritten with zeros. `qemuDriver`: how qemu opens `path`
 * (`file` or `host_device`), which enables {@link SinkVolume.qemuTarget}.
 */
export class HandleVolume implements SinkVolume {
  private writtenEnd = 0
  private closed = false

  constructor(
    private readonly fh: FileHandle,
    readonly path: string,
    readonly capacity: number,
    readonly blockSize: number,
    private readonly opts: { fresh: boolean; discard?: Discarder; discardAlign?: number; qemuDriver?: 'file' | 'host_device' },
  ) {
    if (opts.qemuDriver) {
      this.qemuTarget = {
        node: { driver: opts.qemuDriver, filename: path },
        isZero: (offset: number) => this.opts.fresh && offset >= this.writtenEnd,
        noteWritten: (end: number) => {
          if (end > this.writtenEnd) this.writtenEnd = end
        },
      }
    }
  }

  /** See {@link SinkVolume.qemuTarget}: set when `opts.qemuDriver` names the qemu driver of `path`. */
  readonly qemuTarget?: SinkVolume['qemuTarget']

  private check(what: string, offset: number, length: number): void {
    if (this.closed) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${this.path}: ${what} at offset ${offset} after close`)
    if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > this.capacity) {
      throw new MigError('E_MIG_DISK_WRITE_FAILED', `${this.path}: ${what} of ${length} bytes at offset ${offset} is outside the volume (${this.capacity} bytes)`, {
        details: { volume: this.path, offset },
      })
    }
  }

  /** Writes all of `buf` at `offset`. `E_MIG_DISK_WRITE_FAILED` (ENOSPC, EIO, out of range). */
  async write(offset: number, buf: Buffer): Promise<void> {
    this.check('write', offset, buf.length)
    let done = 0
    try {
      while (done < buf.length) {
        const { bytesWritten } = await this.fh.write(buf, done, buf.length - done, offset + done)
        if (bytesWritten === 0) throw Object.assign(new Error('no progress (ENOSPC?)'), { code: 'ENOSPC' })
        done += bytesWritten
      }
    } catch (e) {
      throw writeFailed(this.path, `write of ${buf.length} bytes`, offset + done, e)
    }
    if (offset + buf.length > this.writtenEnd) this.writtenEnd = offset + buf.length
  }

  private async fill(offset: number, length: number): Promise<void> {
    for (let o = offset; o < offset + length; ) {
      const n = Math.min(ZERO_BUFFER.length, offset + length - o)
      let done = 0
      try {
        while (done < n) {
          const { bytesWritten } = await this.fh.write(ZERO_BUFFER, done, n - done, o + done)
          if (bytesWritten === 0) throw Object.assign(new Error('no progress (ENOSPC?)'), { code: 'ENOSPC' })
          done += bytesWritten
        }
      } catch (e) {
        throw writeFailed(this.path, `zero-fill of ${length} bytes`, o + done, e)
      }
      o += n
    }
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

  /** fsync: everything written or zeroed before is durable afterwards. `E_MIG_DISK_WRITE_FAILED`. */
  async flush(): Promise<void> {
    if (this.closed) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${this.path}: flush after close`)
    try {
      await this.fh.sync()
    } catch (e) {
      throw writeFailed(this.path, 'flush (fsync)', this.writtenEnd, e)
    }
  }

  /** Closes the handle; never throws. */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    await this.fh.close().catch(() => {})
  }
}

/** Options of {@link FileSink}. */
export interface FileSinkOptions {
  /** The data directory; volumes go to `<dataDir>/volumes/migrations/<job-id>/`. */
  dataDir: string
  /** `fallocate` binary for hole punching (default from PATH). */
  fallocatePath?: string
}

/** The sparse-file sink. */
export class FileSink implements Sink {
  private punchBroken = false

  constructor(private readonly opts: FileSinkOptions) {}

  /** Directory of a job's volumes. */
  jobDir(jobId: string): string {
    return join(this.opts.dataDir, 'volumes', 'migrations', checkJobId(jobId))
  }

  /** Path of a volume: `<jobDir>/<sanitizeLabel(label)>.img`. */
  volumePath(jobId: string, label: string): string {
    return join(this.jobDir(jobId), `${sanitizeLabel(label)}.img`)
  }

  /**
   * Creates (or, when it exists, reopens: a resumed job) the sparse image of `label`, sized to
   * `capacityBytes` with `ftruncate`; the file and its directory are fsynced.
   * `E_MIG_DISK_WRITE_FAILED` (cannot create, not a regular file, ENOSPC).
   */
  async create(jobId: string, label: string, capacityBytes: number): Promise<SinkVolume> {
    const path = this.volumePath(jobId, label)
    const dir = this.jobDir(jobId)
    if (!Number.isSafeInteger(capacityBytes) || capacityBytes < 0) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${path}: invalid capacity ${capacityBytes}`)
    let fh: FileHandle
    let fresh = true
    try {
      // 0711: qemu, running as libvirt's unprivileged user, must traverse to the image (libvirt
      // gives it the image itself); nobody else may list the job's volumes.
      await mkdir(dir, { recursive: true, mode: 0o711 })
      try {
        fh = await open(path, C.O_RDWR | C.O_CREAT | C.O_EXCL | C.O_NOFOLLOW, 0o640)
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e
        fh = await open(path, C.O_RDWR | C.O_NOFOLLOW)
        fresh = false
      }
    } catch (e) {
      throw writeFailed(path, 'create', 0, e)
    }
    try {
      const st = await fh.stat()
      if (!st.isFile()) throw new Error('not a regular file')
      if (st.size !== capacityBytes) await fh.truncate(capacityBytes)
      await fh.sync()
      const d = await open(dir, 'r')
      await d.sync().finally(() => d.close())
    } catch (e) {
      await fh.close().catch(() => {})
      throw writeFailed(path, `sizing to ${capacityBytes} bytes`, 0, e)
    }
    const discard: Discarder = async (offset, length) => {
      if (this.punchBroken) return false
      const r = await runCommand(this.opts.fallocatePath ?? 'fallocate', ['--punch-hole', '--keep-size', '--offset', String(offset), '--length', String(length), path])
      if (r.code !== 0) this.punchBroken = true
      return r.code === 0
    }
    return new HandleVolume(fh, path, capacityBytes, 4096, { fresh, discard, qemuDriver: 'file' })
  }

  /**
   * The pre-V2V snapshot of the file sink: every `*.img` of the job copied to
   * `<jobDir>/.pre-v2v/` with `cp --sparse=always --reflink=auto` (a reflink where the file system
   * can, a sparse copy elsewhere); rollback renames the copies back; release removes them.
   * `E_MIG_DISK_WRITE_FAILED` naming the file.
   */
  snapshot(jobId: string): VolumeSnapshot {
    const dir = this.jobDir(jobId)
    const snapDir = join(dir, '.pre-v2v')
    const images = async () => (await readdir(dir)).filter((f) => f.endsWith('.img'))
    return {
      take: async () => {
        await rm(snapDir, { recursive: true, force: true })
        await mkdir(snapDir, { mode: 0o750 })
        for (const f of await images()) {
          const r = await runCommand('cp', ['--sparse=always', '--reflink=auto', join(dir, f), join(snapDir, f)])
          if (r.code !== 0) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${join(dir, f)}: snapshot copy failed: ${r.stderr.trim()}`)
        }
      },
      rollback: async () => {
        for (const f of await readdir(snapDir)) {
          try {
            await rename(join(snapDir, f), join(dir, f))
          } catch (e) {
            throw writeFailed(join(dir, f), 'roll back', 0, e)
          }
        }
      },
      release: async () => {
        await rm(snapDir, { recursive: true, force: true })
      },
    }
  }

  /** Removes the job's directory with every image in it. `E_MIG_DISK_WRITE_FAILED`. */
  async remove(jobId: string): Promise<void> {
    const dir = this.jobDir(jobId)
    try {
      await rm(dir, { recursive: true, force: true })
    } catch (e) {
      throw writeFailed(dir, 'remove', 0, e)
    }
  }
}
