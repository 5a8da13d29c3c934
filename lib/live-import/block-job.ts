/**
 * The block copy of a live import through libvirt (virsh(1) `blockcopy`, `blockjob`,
 * `domblklist`): qemu's mirror job copies a running guest's disk (the overlay and its backing
 * export, flattened) into the destination volume with synchronous writes (qemu `copy-mode:
 * write-blocking`: a guest write returns once the destination has it too, so the copy converges
 * however much the guest writes), and pivots the guest onto it when the two are in step.
 *
 * The job is transient (`--transient-job`: libvirt does not keep it across a restart of the
 * guest) and reuses the volume the sink made (`--reuse-external`, raw). All failures are
 * `MigError('E_MIG_DISK_WRITE_FAILED')` naming the domain, disk and libvirt's message.
 */
import { MigError } from '../errors.ts'
import { libvirtMessage, type Virsh } from '../domain/virsh.ts'

/** One disk of a domain as `virsh domblklist --details` lists it. */
export interface DomainDisk {
  type: string
  device: string
  target: string
  source: string
}

/** The disks of domain `name` (live definition). */
export async function domainDisks(virsh: Virsh, name: string): Promise<DomainDisk[]> {
  const r = await virsh.run(['domblklist', '--details', '--domain', name])
  if (r.code !== 0) throw new MigError('E_MIG_DISK_WRITE_FAILED', `domain ${name}: listing its disks failed: ${libvirtMessage(r)}`)
  const out: DomainDisk[] = []
  for (const line of r.stdout.split('\n').slice(2)) {
    const m = /^\s*(\S+)\s+(\S+)\s+(\S+)\s+(.+?)\s*$/.exec(line)
    if (m) out.push({ type: m[1]!, device: m[2]!, target: m[3]!, source: m[4]! })
  }
  return out
}

/** Progress of a block job, bytes of qemu's work counter (`end` grows when the guest dirties copied areas). */
export interface BlockJobInfo {
  type: string
  cur: number
  end: number
}

/** The block job on disk `target` of domain `name`, or null when it has none. */
export async function blockJobInfo(virsh: Virsh, name: string, target: string): Promise<BlockJobInfo | null> {
  const r = await virsh.run(['blockjob', '--domain', name, '--path', target, '--info', '--raw'])
  if (r.code !== 0) throw new MigError('E_MIG_DISK_WRITE_FAILED', `domain ${name} disk ${target}: reading its block job failed: ${libvirtMessage(r)}`)
  const fields = new Map<string, string>()
  for (const line of r.stdout.split('\n')) {
    const m = /^\s*([a-z_]+)=(.*)$/.exec(line)
    if (m) fields.set(m[1]!, m[2]!.trim())
  }
  if (!fields.has('cur') || !fields.has('end')) return null
  return { type: fields.get('type') ?? '', cur: Number(fields.get('cur')), end: Number(fields.get('end')) }
}

/** Options of {@link startBlockCopy}. */
export interface BlockCopyOptions {
  /** The destination is a block device (a zvol), not a file. */
  block: boolean
  /** Bandwidth cap, bytes per second (absent or 0: none). */
  bytesPerSecond?: number | null
}

/** Starts the mirror of disk `target` of domain `name` into `dest` (an existing raw volume). */
export async function startBlockCopy(virsh: Virsh, name: string, target: string, dest: string, opts: BlockCopyOptions): Promise<void> {
  const args = [
    'blockcopy',
    '--domain',
    name,
    '--path',
    target,
    '--dest',
    dest,
    '--format',
    'raw',
    '--reuse-external',
    '--transient-job',
    '--synchronous-writes',
  ]
  if (opts.block) args.push('--blockdev')
  if (opts.bytesPerSecond && opts.bytesPerSecond > 0) args.push('--bandwidth', String(Math.max(1, Math.floor(opts.bytesPerSecond))), '--bytes')
  const r = await virsh.run(args, 60_000)
  if (r.code !== 0)
    throw new MigError('E_MIG_DISK_WRITE_FAILED', `domain ${name} disk ${target}: starting the block copy to ${dest} failed: ${libvirtMessage(r)}`)
}

/**
 * Pivots disk `target` of domain `name` onto its block copy's destination. Resolves false when the
 * job is not ready yet (qemu still copying: try again), true once pivoted.
 */
export async function pivotBlockCopy(virsh: Virsh, name: string, target: string): Promise<boolean> {
  const r = await virsh.run(['blockjob', '--domain', name, '--path', target, '--pivot'], 60_000)
  if (r.code === 0) return true
  const msg = libvirtMessage(r)
  if (/not ready|not yet ready|still active/i.test(msg)) return false
  throw new MigError('E_MIG_DISK_WRITE_FAILED', `domain ${name} disk ${target}: pivoting onto the copy failed: ${msg}`)
}

/** Cancels the block job of disk `target` (the guest stays on its current disk); never throws. */
export async function abortBlockCopy(virsh: Virsh, name: string, target: string): Promise<void> {
  await virsh.run(['blockjob', '--domain', name, '--path', target, '--abort'], 60_000).catch(() => undefined)
}
