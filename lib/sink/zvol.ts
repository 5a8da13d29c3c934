/**
 * The `zvol` sink (spec 1.3 and 8, DESIGN.md section 6): one sparse ZFS volume per disk,
 *
 *   zfs create -p -s -V <size> -o volblocksize=64K -o compression=lz4 <pool>/<appliance>/migrations/<job-id>/<sanitized-label>
 *
 * with `<size>` the capacity rounded up to a multiple of 64 KiB, written through
 * `/dev/zvol/<dataset>` with positioned writes. Zero runs are discarded with
 * `blkdiscard --offset --length` (64 KiB aligned middle; head and tail zero-filled); when
 * blkdiscard fails the sink falls back to explicit zero-fill and stops trying to discard
 * (lz4 stores all-zero blocks as holes, so the fill costs no space). `remove` runs
 * `zfs destroy -r <pool>/<appliance>/migrations/<job-id>`.
 *
 * The `zfs` and `blkdiscard` binaries and the `/dev/zvol` prefix are options, so tests can use
 * a test double over a loop device.
 */
import { constants as C } from 'node:fs'
import { open, stat, type FileHandle } from 'node:fs/promises'
import { MigError } from '../errors.ts'
import { sleep } from '../retry.ts'
import { sanitizeLabel } from '../manifest.ts'
import { exec } from '../exec.ts'
import { blockDeviceSize, checkJobId, HandleVolume, openDirect, type Discarder } from './volume.ts'
import type { CloneVolume, Sink, SinkVolume, VolumeClone, VolumeSnapshot } from './types.ts'

/** Zvol volblocksize, bytes (64 KiB, spec 8). */
export const ZVOL_BLOCK = 64 * 1024

/** Options of {@link ZvolSink}. */
export interface ZvolSinkOptions {
  /** ZFS pool (or parent dataset) holding the migrator's datasets. */
  pool: string
  /** The product-specific path segment `<appliance>` (spec 1.3). */
  appliance: string
  /** `zfs` binary (default `zfs` from PATH; tests pass a test double). */
  zfsPath?: string
  /** `blkdiscard` binary (default from PATH). */
  blkdiscardPath?: string
  /** Where zvol device links appear (default `/dev/zvol`). */
  devPrefix?: string
  /** How long to wait for the device link after `zfs create`, milliseconds (default 30 000). */
  deviceTimeoutMs?: number
  /** Data bytes each volume writes through the page cache before going `O_DIRECT` (default `PAGE_CACHE_BYTES`, 1 GiB). */
  pageCacheBytes?: number
}

const DATASET_PART = /^[A-Za-z0-9][A-Za-z0-9_.:-]*$/

function checkDatasetPath(what: string, v: string): string {
  if (!v.split('/').every((p) => DATASET_PART.test(p))) throw new MigError('E_MIG_INTERNAL', `zvol sink: invalid ${what} ${JSON.stringify(v)}`)
  return v
}

/** The ZFS volume sink. */
export class ZvolSink implements Sink {
  /** Shared by the sink's volumes: once a blkdiscard failed, none tries again. */
  private readonly discard = { broken: false }

  constructor(private readonly opts: ZvolSinkOptions) {
    checkDatasetPath('pool', opts.pool)
    checkDatasetPath('appliance', opts.appliance)
  }

  /** Whether a blkdiscard failed and zero runs are being zero-filled instead. */
  get discardFailed(): boolean {
    return this.discard.broken
  }

  /** `<pool>/<appliance>/migrations/<job-id>`. */
  jobDataset(jobId: string): string {
    return `${this.opts.pool}/${this.opts.appliance}/migrations/${checkJobId(jobId)}`
  }

  /** `<pool>/<appliance>/migrations/<job-id>/<sanitized-label>`. */
  volumeDataset(jobId: string, label: string): string {
    return `${this.jobDataset(jobId)}/${sanitizeLabel(label)}`
  }

  /** The device path of a dataset: `<devPrefix>/<dataset>`. */
  devicePath(dataset: string): string {
    return `${this.opts.devPrefix ?? '/dev/zvol'}/${dataset}`
  }

  /**
   * Creates the sparse zvol of `label` (or reuses it when it exists: a resumed job), waits for
   * its device and opens it for writing. Size: `capacityBytes` rounded up to 64 KiB (at least
   * 64 KiB). `E_MIG_DISK_WRITE_FAILED` (zfs create fails: its stderr is in the message; the
   * device does not appear; the device is smaller than the capacity).
   */
  async create(jobId: string, label: string, capacityBytes: number): Promise<SinkVolume> {
    const dataset = this.volumeDataset(jobId, label)
    const dev = this.devicePath(dataset)
    if (!Number.isSafeInteger(capacityBytes) || capacityBytes < 0)
      throw new MigError('E_MIG_DISK_WRITE_FAILED', `${dataset}: invalid capacity ${capacityBytes}`)
    const volsize = Math.max(ZVOL_BLOCK, Math.ceil(capacityBytes / ZVOL_BLOCK) * ZVOL_BLOCK)
    let fresh = true
    if (await exists(dev)) fresh = false
    else {
      const r = await exec(this.opts.zfsPath ?? 'zfs', [
        'create',
        '-p',
        '-s',
        '-V',
        String(volsize),
        '-o',
        'volblocksize=64K',
        '-o',
        'compression=lz4',
        dataset,
      ])
      if (r.code !== 0) {
        if (/already exists/i.test(r.stderr)) fresh = false
        else
          throw new MigError('E_MIG_DISK_WRITE_FAILED', `${dataset}: zfs create failed (exit ${r.code}): ${r.stderr.trim()}`, { details: { volume: dataset } })
      }
    }
    const deadline = Date.now() + (this.opts.deviceTimeoutMs ?? 30_000)
    while (!(await exists(dev))) {
      if (Date.now() > deadline) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${dataset}: device ${dev} did not appear`, { details: { volume: dev } })
      await sleep(50)
    }
    return openZvolDevice(dev, {
      capacityBytes,
      volsize,
      fresh,
      discard: this.discard,
      blkdiscardPath: this.opts.blkdiscardPath,
      pageCacheBytes: this.opts.pageCacheBytes,
    })
  }

  /**
   * The pre-V2V snapshot: `zfs snapshot -r <job-dataset>@pre-v2v`; rollback is `zfs rollback -r`
   * of every volume (`zfs list -H -o name -t volume -r <job-dataset>`); release is
   * `zfs destroy -r <job-dataset>@pre-v2v`. `E_MIG_DISK_WRITE_FAILED` with zfs's stderr.
   */
  snapshot(jobId: string): VolumeSnapshot {
    const dataset = this.jobDataset(jobId)
    const zfs = async (args: string[]) => {
      const r = await exec(this.opts.zfsPath ?? 'zfs', args)
      if (r.code !== 0)
        throw new MigError('E_MIG_DISK_WRITE_FAILED', `${dataset}: zfs ${args[0]} failed (exit ${r.code}): ${r.stderr.trim()}`, {
          details: { volume: dataset },
        })
      return r.stdout
    }
    return {
      take: async () => void (await zfs(['snapshot', '-r', `${dataset}@${PRE_V2V_SNAPSHOT}`])),
      rollback: async () => {
        const vols = (await zfs(['list', '-H', '-o', 'name', '-t', 'volume', '-r', dataset])).split('\n').filter(Boolean)
        for (const v of vols) await zfs(['rollback', '-r', `${v}@${PRE_V2V_SNAPSHOT}`])
      },
      release: async () => void (await zfs(['destroy', '-r', `${dataset}@${PRE_V2V_SNAPSHOT}`])),
    }
  }

  /** `<pool>/<appliance>/migrations/<job-id>-testboot`: the parent of a test boot's clones. */
  testBootDataset(jobId: string): string {
    return `${this.jobDataset(jobId)}-testboot`
  }

  /**
   * The test boot's clone: `zfs snapshot -r <job-dataset>@testboot` (every volume at the same
   * instant), then `zfs clone -p <volume>@testboot <job-dataset>-testboot/<label>` per volume, and
   * waits for each clone's device. A point-in-time copy: the job may go on writing its volumes.
   * `remove`: `zfs destroy -r <job-dataset>-testboot`, then `zfs destroy -r <job-dataset>@testboot`
   * (nothing there is fine). `E_MIG_DISK_WRITE_FAILED` with zfs's stderr.
   */
  testBootClone(jobId: string): VolumeClone {
    const dataset = this.jobDataset(jobId)
    const parent = this.testBootDataset(jobId)
    const zfs = async (args: string[], absentOk = false) => {
      const r = await exec(this.opts.zfsPath ?? 'zfs', args)
      if (r.code !== 0 && !(absentOk && /does not exist|could not find any snapshots/i.test(r.stderr)))
        throw new MigError('E_MIG_DISK_WRITE_FAILED', `${dataset}: zfs ${args.join(' ')} failed (exit ${r.code}): ${r.stderr.trim()}`, {
          details: { volume: dataset },
        })
    }
    const remove = async () => {
      await zfs(['destroy', '-r', parent], true)
      await zfs(['destroy', '-r', `${dataset}@${TEST_BOOT_SNAPSHOT}`], true)
    }
    return {
      kind: 'zfs snapshot and clone',
      holdsWrites: false,
      take: async (labels: string[]): Promise<CloneVolume[]> => {
        await remove()
        await zfs(['snapshot', '-r', `${dataset}@${TEST_BOOT_SNAPSHOT}`])
        const out: CloneVolume[] = []
        for (const label of labels) {
          const clone = `${parent}/${sanitizeLabel(label)}`
          await zfs(['clone', '-p', `${this.volumeDataset(jobId, label)}@${TEST_BOOT_SNAPSHOT}`, clone])
          const dev = this.devicePath(clone)
          const deadline = Date.now() + (this.opts.deviceTimeoutMs ?? 30_000)
          while (!(await exists(dev))) {
            if (Date.now() > deadline) throw new MigError('E_MIG_DISK_WRITE_FAILED', `${clone}: device ${dev} did not appear`, { details: { volume: dev } })
            await sleep(50)
          }
          out.push({ label, path: dev, format: 'raw', backing: null })
        }
        return out
      },
      remove,
    }
  }

  /** `zfs destroy -r <pool>/<appliance>/migrations/<job-id>`; a job with no dataset is fine. `E_MIG_DISK_WRITE_FAILED`. */
  async remove(jobId: string): Promise<void> {
    const dataset = this.jobDataset(jobId)
    const r = await exec(this.opts.zfsPath ?? 'zfs', ['destroy', '-r', dataset])
    if (r.code !== 0 && !/does not exist/i.test(r.stderr)) {
      throw new MigError('E_MIG_DISK_WRITE_FAILED', `${dataset}: zfs destroy failed (exit ${r.code}): ${r.stderr.trim()}`, { details: { volume: dataset } })
    }
  }
}

/** Options of {@link openZvolDevice}. Bytes. */
export interface ZvolDeviceOptions {
  /** The disk's size: the device must hold at least this much. */
  capacityBytes: number
  /** The volume's size when the device's cannot be read from sysfs. */
  volsize: number
  /** The device reads as zeros everywhere (just created), so zero runs past what was written need no I/O. */
  fresh: boolean
  /** Set to true by the first failing blkdiscard; zero runs are zero-filled while it is true. */
  discard: { broken: boolean }
  /** `blkdiscard` binary (default from PATH). */
  blkdiscardPath?: string
  /** Data bytes written through the page cache before the writes go `O_DIRECT` (default `PAGE_CACHE_BYTES`, 1 GiB). */
  pageCacheBytes?: number
}

/**
 * Opens the block device `dev` (a zvol's, or another block device written like one: the VMCX
 * import's fallback copy, lib/v2v/full-import.ts) as a volume: `O_RDWR`, its size from sysfs,
 * 64 KiB blocks, zero runs discarded with `blkdiscard` until one fails (then zero-filled), a
 * second `O_DIRECT` handle ({@link openDirect}), qemu's `host_device` driver and writeback while
 * its writes go through the page cache (`file` and always for a regular file: a test double).
 * `E_MIG_DISK_WRITE_FAILED` (the device cannot be opened or holds less than `capacityBytes`).
 */
export async function openZvolDevice(dev: string, opts: ZvolDeviceOptions): Promise<HandleVolume> {
  let fh: FileHandle
  try {
    fh = await open(dev, C.O_RDWR)
  } catch (e) {
    throw new MigError('E_MIG_DISK_WRITE_FAILED', `${dev}: cannot open: ${(e as Error).message}`, { cause: e, details: { volume: dev } })
  }
  const devSize = await blockDeviceSize(dev)
  if (devSize !== null && devSize < opts.capacityBytes) {
    await fh.close().catch(() => {})
    throw new MigError('E_MIG_DISK_WRITE_FAILED', `${dev}: device holds ${devSize} bytes, less than the capacity of ${opts.capacityBytes} bytes`, {
      details: { volume: dev },
    })
  }
  const discard: Discarder = async (offset, length) => {
    if (opts.discard.broken) return false
    const r = await exec(opts.blkdiscardPath ?? 'blkdiscard', ['--offset', String(offset), '--length', String(length), dev])
    if (r.code !== 0) opts.discard.broken = true
    return r.code === 0
  }
  const isBlock = await fh.stat().then(
    (st) => st.isBlockDevice(),
    () => false,
  )
  return new HandleVolume(fh, dev, devSize ?? opts.volsize, ZVOL_BLOCK, {
    fresh: opts.fresh,
    discard,
    discardAlign: ZVOL_BLOCK,
    qemuDriver: isBlock ? 'host_device' : 'file',
    direct: await openDirect(fh),
    pageCacheBytes: opts.pageCacheBytes,
    writeback: isBlock ? 'while-cached' : 'always',
  })
}

/** Name of the snapshot taken before V2V. */
export const PRE_V2V_SNAPSHOT = 'pre-v2v'

/** Name of the snapshot a test boot's clones are made from. */
export const TEST_BOOT_SNAPSHOT = 'testboot'

async function exists(p: string): Promise<boolean> {
  try {
    await stat(p)
    return true
  } catch {
    return false
  }
}
