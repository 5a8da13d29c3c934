/**
 * Checks at the start of a job, before any destination volume exists, so a host that cannot
 * hold or run the VM refuses the job at once instead of after the whole copy:
 *
 * - room for the disks: file sink, free space on the volumes' file system against the disks'
 *   capacity (the images are sparse, but the guest may fill them, and a full file system under a
 *   running guest pauses it); zvol sink, the pool's available space against the data to write
 *   (each disk's `allocated_bytes` when the source tells, else its capacity; zvols are sparse,
 *   `-s`). What a resumed job already holds on the destination is subtracted. What the other
 *   queued and running jobs of this host that reserved space on the same file system or pool
 *   still have to write is counted too (their reservation less what they hold already), checked
 *   and reserved in one store transaction, so jobs started together cannot each pass alone.
 *   `E_MIG_DISK_WRITE_FAILED`.
 * - the qemu user can reach the file sink's volumes (see qemu-access.ts) and libvirt gives it the
 *   images (`dynamic_ownership`). `E_MIG_DOMAIN_DEFINE_FAILED`.
 * - every bridge the domain will use exists (`plan.networks`, and `MIGRATOR_DEFAULT_BRIDGE` when a
 *   NIC is left to it). `E_MIG_DOMAIN_DEFINE_FAILED`.
 *
 * Every message names the fix.
 */
import { existsSync, readdirSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { run } from './doctor.ts'
import { freeBytesOn, mountPointOf } from './fs-space.ts'
import { qemuCanReach, reachFix, type QemuUser } from './qemu-access.ts'

/** A disk to be written (bytes). */
export interface PreCopyDisk {
  label: string
  capacity_bytes: number
  allocated_bytes?: number
}

/** What the checks look at. */
export interface PreCopyInput {
  disks: PreCopyDisk[]
  /** File sink: the volumes directory (`<data dir>/volumes`) and this job's directory below it. */
  file?: { volumesDir: string; jobDir: string }
  /** Zvol sink: the pool, this job's dataset, and the `zfs` binary (default from PATH). */
  zvol?: { pool: string; jobDataset: string; zfsBinary?: string }
  /** The identity qemu runs as (readQemuUser). */
  qemu: QemuUser
  /** Bridges the domain will use, each with where it comes from (`plan.networks[0].bridge`, `MIGRATOR_DEFAULT_BRIDGE`). */
  bridges: Array<{ name: string; from: string }>
  /** Where network interfaces are listed (default `/sys/class/net`). */
  netDir?: string
  /**
   * Reserves the space this job counts on against the other jobs of this host (the store's
   * `JobsRepo.reserveSpace` bound to the job): `key` names the file system or pool, `bytes` the
   * job's whole need; `check` gets the other jobs reserving on `key` with what each still has to
   * write, and throws to refuse. Absent: the job is checked alone.
   */
  reserve?: (key: string, bytes: number, check: (others: Array<{ id: string; remaining: number }>) => void) => Promise<void>
}

/** `, and N still to be written by K other job(s) here (ids)`, or '' when no other job counts. */
function othersNote(others: Array<{ id: string; remaining: number }>): string {
  const pending = others.reduce((s, o) => s + o.remaining, 0)
  if (pending === 0) return ''
  return ` and ${gib(pending)} still to be written by ${others.length} other job(s) on it (${others.map((o) => o.id).join(', ')})`
}

/** Runs `check` through the reservation when there is one, else alone. */
async function reserveOrCheck(
  input: PreCopyInput,
  key: string,
  bytes: number,
  check: (others: Array<{ id: string; remaining: number }>) => void,
): Promise<void> {
  if (input.reserve) await input.reserve(key, bytes, check)
  else check([])
}

const GiB = 1024 ** 3
const gib = (n: number) => `${(n / GiB).toFixed(2)} GiB`

/** Bytes the regular files below `dir` occupy (st_blocks), 0 when it does not exist. */
export function allocatedBelow(dir: string): number {
  if (!existsSync(dir)) return 0
  let sum = 0
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name)
    if (e.isDirectory()) sum += allocatedBelow(p)
    else if (e.isFile()) sum += statSync(p).blocks * 512
  }
  return sum
}

/** Bridges that do not exist, as an `E_MIG_DOMAIN_DEFINE_FAILED` (null when all exist). */
export function missingBridges(bridges: PreCopyInput['bridges'], netDir = '/sys/class/net'): MigError | null {
  const missing = bridges.filter((b) => !existsSync(path.join(netDir, b.name)))
  if (missing.length === 0) return null
  const list = missing.map((b) => `${b.name} (${b.from})`).join(', ')
  return new MigError(
    'E_MIG_DOMAIN_DEFINE_FAILED',
    `no such bridge on this host: ${list}; create it (ip link add <name> type bridge) or map the network to an existing bridge in plan.networks`,
    {
      details: { bridges: missing.map((b) => b.name) },
    },
  )
}

/**
 * Runs the checks; resolves when the job may write its volumes. Throws
 * `E_MIG_DISK_WRITE_FAILED` (no room) or `E_MIG_DOMAIN_DEFINE_FAILED` (qemu cannot reach the
 * volumes, a bridge is missing), each naming the fix.
 */
export async function checkBeforeCopy(input: PreCopyInput): Promise<void> {
  const bridges = missingBridges(input.bridges, input.netDir)
  if (bridges) throw bridges
  if (input.file) {
    const { volumesDir, jobDir } = input.file
    if (input.qemu.uid !== 0) {
      const reach = await qemuCanReach(volumesDir, input.qemu)
      if (!reach.ok) {
        throw new MigError(
          'E_MIG_DOMAIN_DEFINE_FAILED',
          `qemu (user ${input.qemu.user}) cannot search ${reach.blockedAt}, so the domain could not open its disks under ${volumesDir}; ${reachFix(reach.blockedAt!, input.qemu)}`,
          {
            details: { blocked_at: reach.blockedAt, volumes: volumesDir },
          },
        )
      }
      if (!input.qemu.dynamicOwnership) {
        throw new MigError(
          'E_MIG_DOMAIN_DEFINE_FAILED',
          `libvirt's dynamic_ownership is off (${input.qemu.source}): qemu (user ${input.qemu.user}) could not open the images; set dynamic_ownership = 1 and restart libvirtd`,
        )
      }
    }
    const total = input.disks.reduce((s, d) => s + d.capacity_bytes, 0)
    const need = total - allocatedBelow(jobDir)
    const free = freeBytesOn(volumesDir)
    await reserveOrCheck(input, `fs:${mountPointOf(volumesDir)}`, total, (others) => {
      const pending = others.reduce((s, o) => s + o.remaining, 0)
      if (need + pending <= free) return
      throw new MigError(
        'E_MIG_DISK_WRITE_FAILED',
        `not enough space for the disks under ${volumesDir}: ${gib(free)} free on ${mountPointOf(volumesDir)}, ${gib(need)} needed by this job (the capacity of ${input.disks.length} disk(s); sparse images can fill up to it)${othersNote(others)}; free space on that file system, wait for those jobs to end, or set MIGRATOR_DATA_DIR to a larger one`,
        { details: { free_bytes: free, needed_bytes: need, reserved_by_others_bytes: pending, volumes: volumesDir, others: others.map((o) => o.id) } },
      )
    })
  }
  if (input.zvol) {
    const { pool, jobDataset, zfsBinary = 'zfs' } = input.zvol
    const avail = await run(zfsBinary, ['list', '-H', '-p', '-o', 'avail', pool])
    if (avail.code !== 0 || !/^\d+$/.test(avail.stdout.trim())) {
      throw new MigError(
        'E_MIG_DISK_WRITE_FAILED',
        `pool ${pool} is not usable: ${avail.stderr.trim().split('\n').pop() || `zfs exited ${avail.code}`}; import or create the pool, or choose another (MIGRATOR_ZFS_POOL, plan destination.pool)`,
      )
    }
    const held = await run(zfsBinary, ['list', '-H', '-p', '-o', 'used', jobDataset])
    const already = held.code === 0 && /^\d+$/.test(held.stdout.trim()) ? Number(held.stdout.trim()) : 0
    const total = input.disks.reduce((s, d) => s + (d.allocated_bytes ?? d.capacity_bytes), 0)
    const need = total - already
    const free = Number(avail.stdout.trim())
    await reserveOrCheck(input, `pool:${pool}`, total, (others) => {
      const pending = others.reduce((s, o) => s + o.remaining, 0)
      if (need + pending <= free) return
      throw new MigError(
        'E_MIG_DISK_WRITE_FAILED',
        `not enough space in pool ${pool}: ${gib(free)} available, ${gib(need)} of data to write for this job${othersNote(others)}; free space in the pool, wait for those jobs to end, or choose another pool (MIGRATOR_ZFS_POOL, plan destination.pool)`,
        { details: { free_bytes: free, needed_bytes: need, reserved_by_others_bytes: pending, pool, others: others.map((o) => o.id) } },
      )
    })
  }
}
