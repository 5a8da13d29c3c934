/**
 * The `file` sink (DESIGN.md section 6, the embedded default): one sparse raw image per disk at
 * `<dataDir>/volumes/migrations/<job-id>/<sanitizeLabel(label)>.img`, sized with `ftruncate`,
 * written with positioned writes. A fresh image is all holes, so zero runs over never-written
 * ranges cost nothing; zero runs over data written before (a resumed job, a delta pass) are
 * punched with `fallocate --punch-hole --keep-size` (large runs) or overwritten with zeros.
 */
import { constants as C } from 'node:fs'
import { mkdir, open, readdir, rename, rm, type FileHandle } from 'node:fs/promises'
import { join } from 'node:path'
import { MigError } from '../errors.ts'
import { sanitizeLabel } from '../manifest.ts'
import { exec } from '../exec.ts'
import { checkJobId, HandleVolume, openDirect, writeFailed, type Discarder } from './volume.ts'
import type { CloneVolume, Sink, SinkVolume, VolumeClone, VolumeSnapshot } from './types.ts'

/** Options of {@link FileSink}. */
export interface FileSinkOptions {
  /** The data directory; volumes go to `<dataDir>/volumes/migrations/<job-id>/`. */
  dataDir: string
  /** `fallocate` binary for hole punching (default from PATH). */
  fallocatePath?: string
  /** Data bytes each volume writes through the page cache before going `O_DIRECT` (default `PAGE_CACHE_BYTES`, 1 GiB). */
  pageCacheBytes?: number
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
      const r = await exec(this.opts.fallocatePath ?? 'fallocate', [
        '--punch-hole',
        '--keep-size',
        '--offset',
        String(offset),
        '--length',
        String(length),
        path,
      ])
      if (r.code !== 0) this.punchBroken = true
      return r.code === 0
    }
    return new HandleVolume(fh, path, capacityBytes, 4096, {
      fresh,
      discard,
      qemuDriver: 'file',
      direct: await openDirect(fh),
      pageCacheBytes: this.opts.pageCacheBytes,
    })
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
          const r = await exec('cp', ['--sparse=always', '--reflink=auto', join(dir, f), join(snapDir, f)])
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

  /**
   * The test boot's clone: for each volume a qcow2 overlay backed by the raw image,
   * `qemu-img create -f qcow2 -b <image> -F raw <jobDir>/.testboot/<label>.qcow2`; the booted
   * clone writes only the overlay. The overlay reads its backing live, so it `holdsWrites`: the
   * job must not write the images while it exists. `remove` deletes `.testboot/`.
   * `E_MIG_DISK_WRITE_FAILED` naming the overlay and qemu-img's message.
   */
  testBootClone(jobId: string): VolumeClone {
    const dir = join(this.jobDir(jobId), '.testboot')
    return {
      kind: 'qcow2 overlay over the raw volume',
      holdsWrites: true,
      take: async (labels: string[]): Promise<CloneVolume[]> => {
        await rm(dir, { recursive: true, force: true })
        // 0711: qemu (libvirt's user) traverses to the overlay libvirt gives it
        await mkdir(dir, { mode: 0o711 })
        const out: CloneVolume[] = []
        for (const label of labels) {
          const backing = this.volumePath(jobId, label)
          const overlay = join(dir, `${sanitizeLabel(label)}.qcow2`)
          const r = await exec('qemu-img', ['create', '-q', '-f', 'qcow2', '-b', backing, '-F', 'raw', overlay])
          if (r.code !== 0) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${overlay}: qemu-img create of the test boot overlay failed: ${r.stderr.trim()}`)
          out.push({ label, path: overlay, format: 'qcow2', backing })
        }
        return out
      },
      remove: async () => {
        try {
          await rm(dir, { recursive: true, force: true })
        } catch (e) {
          throw writeFailed(dir, 'remove the test boot overlays', 0, e)
        }
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
