/**
 * Device names in the files a Linux guest's boot depends on (docs/boot-check.md "Device names"):
 * `/etc/fstab` (every entry, swap included), the kernel line's `root=` and `resume=` in GRUB's
 * `grub.cfg` and in `/etc/default/grub` (`GRUB_CMDLINE_LINUX`, `GRUB_CMDLINE_LINUX_DEFAULT`),
 * `/etc/crypttab` (the source device) and the initramfs's resume setting
 * (`/etc/initramfs-tools/conf.d/resume`, `RESUME=`). A name by device (`/dev/sdb1`, `/dev/hda2`,
 * `/dev/vdc`) is only valid while the disk keeps its letter on a bus of the same family: on
 * virtio-blk the kernel names disks `/dev/vdX`, on SCSI/SATA buses `/dev/sdX` in probe order.
 * When the destination breaks such a name, it is rewritten to the file system's `UUID=` (for
 * `root=` of a kernel booted without an initramfs, the partition's `PARTUUID=`, which the kernel
 * resolves itself), as virt-v2v does when it changes the bus.
 *
 * Pure: the texts, the block devices' identities and the destination's bus come in, the new texts
 * and what changed (with why) go out. The writes go through lib/domain/guest-files.ts on the
 * destination volumes (never the source), with its undo.
 *
 * Mapping a guest's name to a disk: the guest's `/dev/sdX`, `/dev/hdX`, `/dev/vdX` with letter(s) X
 * are the X-th disk of the VM in the source's order (`a` the first), which is how the libguestfs
 * appliance names the same disks (`/dev/sdX`); a name whose disk or partition has no known
 * identity is left as it is and reported.
 */
import type { DeviceNameChange, DeviceNamesRecord } from '../job.ts'

export type { DeviceNameChange, DeviceNamesRecord }

/** A block device of the guest as the inspection saw it: appliance name (`/dev/sdb1`), file system UUID, partition UUID, type (`ext4`, `swap`, `crypto_LUKS`). */
export interface BlockId {
  device: string
  uuid: string
  partuuid: string
  type: string
}

/** A guest file read for the rewrite: path, text (null when absent). */
export interface BootFile {
  path: string
  text: string
}

/** The plan: the files to write (path and new text, and the text they must still hold), the changes, and names left as they are. */
export interface DeviceNamePlan {
  writes: Array<{ path: string; content: string; expect: string }>
  rewritten: DeviceNameChange[]
  kept: DeviceNameChange[]
}

/** The destination disk bus in the terms that decide names: virtio-blk names `vdX`, every other bus here `sdX` in probe order. */
export interface NameContext {
  /** `vd` on virtio-blk, `sd` on virtio-scsi, PVSCSI, LSI, SATA, IDE (libata). */
  family: 'vd' | 'sd'
  /** Disks of the VM (names by letter are only kept in order on an `sd` bus with one disk). */
  disks: number
  /** The guest boots with an initramfs (which resolves `UUID=`); without one the kernel needs `PARTUUID=` for `root=`. */
  initramfs: boolean
}

/** The files read (guest paths), in the order they are rewritten. */
export const DEVICE_NAME_FILES = [
  '/etc/fstab',
  '/etc/crypttab',
  '/etc/default/grub',
  '/etc/initramfs-tools/conf.d/resume',
  '/boot/grub/grub.cfg',
  '/boot/grub2/grub.cfg',
] as const

/** Largest file rewritten (bytes): a longer one is left as it is and reported. */
export const DEVICE_NAME_FILE_MAX = 1024 * 1024

const DEVICE_RE = /^\/dev\/(sd|hd|vd)([a-z]{1,3})(\d{0,3})$/

/** The appliance name (`/dev/sdb1`) of a guest device name (`/dev/vdb1`, `/dev/hdb1`), or null when it is none of these. */
export function applianceName(spec: string): string | null {
  const m = DEVICE_RE.exec(spec)
  return m ? `/dev/sd${m[2]}${m[3]}` : null
}

/**
 * Why a device name `spec` would not name the same disk on the destination (null: it stays valid):
 * another family than the bus gives, or an `sd` name on a bus with several disks (probe order).
 */
export function whyRewrite(spec: string, ctx: NameContext): string | null {
  const m = DEVICE_RE.exec(spec)
  if (!m) return null
  const fam = m[1]!
  if (fam === 'hd') return `the destination has no /dev/hdX disks (libata names IDE disks /dev/sdX, virtio-blk /dev/vdX)`
  if (fam !== ctx.family)
    return `the destination's disks are on ${ctx.family === 'vd' ? 'virtio-blk, where the kernel names them /dev/vdX' : 'a SCSI/SATA bus, where the kernel names them /dev/sdX'}: ${spec} would not exist`
  if (fam === 'sd' && ctx.disks > 1) return `the kernel names the ${ctx.disks} disks /dev/sdX in the order it probes them, which need not be the source's`
  return null
}

function resolve(spec: string, ids: BlockId[], want: 'uuid' | 'partuuid'): { to: string; id: BlockId } | { to: null; why: string } {
  const dev = applianceName(spec)
  const id = dev ? ids.find((b) => b.device === dev) : undefined
  if (!id) return { to: null, why: `no disk or partition of the guest is ${spec} (disks counted in the source's order)` }
  if (want === 'partuuid') {
    if (id.partuuid) return { to: `PARTUUID=${id.partuuid}`, id }
    return { to: null, why: `${spec} has no partition UUID (a whole disk, or a partition table without one) and the guest has no initramfs to resolve UUID=` }
  }
  if (id.uuid) return { to: `UUID=${id.uuid}`, id }
  return { to: null, why: `${spec} holds no file system or swap with a UUID` }
}

interface Ctx extends NameContext {
  ids: BlockId[]
  file: string
  rewritten: DeviceNameChange[]
  kept: DeviceNameChange[]
}

/** The new spec of `spec` (or `spec` itself when it stays valid or cannot be resolved; recorded either way). */
function rename(spec: string, what: string, line: number, c: Ctx, want: 'uuid' | 'partuuid' = 'uuid'): string {
  const why = whyRewrite(spec, c)
  if (!why) return spec
  const r = resolve(spec, c.ids, want)
  if (r.to === null) {
    c.kept.push({ file: c.file, line, what, from: spec, to: null, why: `${why}; not rewritten: ${r.why}` })
    return spec
  }
  c.rewritten.push({ file: c.file, line, what, from: spec, to: r.to, why })
  return r.to
}

/** Rewrites the first field of each fstab(5) entry (or crypttab(5)'s second field, `field: 1`); comments and layout kept. */
function rewriteTable(text: string, c: Ctx, field: 0 | 1, what: (fields: string[]) => string): string {
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!
    if (/^\s*(#|$)/.test(line)) continue
    // Fields are separated by blanks; keep the separators as they are.
    const parts = line.split(/(\s+)/)
    const lead = parts[0] === '' ? 2 : 0
    const fields = parts.filter((_, k) => k >= lead && (k - lead) % 2 === 0)
    const at = lead + field * 2
    const spec = parts[at]
    if (!spec) continue
    const next = rename(spec, what(fields), i + 1, c)
    if (next !== spec) {
      parts[at] = next
      lines[i] = parts.join('')
    }
  }
  return lines.join('\n')
}

/** Rewrites `root=` and `resume=` values naming devices in a kernel command line fragment. */
function rewriteCmdline(cmdline: string, line: number, c: Ctx): string {
  return cmdline.replace(/(^|[\s"'])(root|resume)=(\/dev\/[A-Za-z0-9/_-]+)(?=$|[\s"'])/g, (all, pre: string, key: string, spec: string) => {
    const next = rename(spec, `kernel ${key}=`, line, c, key === 'root' && !c.initramfs ? 'partuuid' : 'uuid')
    return next === spec ? all : `${pre}${key}=${next}`
  })
}

function rewriteFile(path: string, text: string, c: Ctx): string {
  if (path === '/etc/fstab') return rewriteTable(text, c, 0, (f) => `fstab ${f[1] ?? '?'} (${f[2] ?? '?'})`)
  if (path === '/etc/crypttab') return rewriteTable(text, c, 1, (f) => `crypttab ${f[0] ?? '?'}`)
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!
    if (/^\s*#/.test(line)) continue
    if (path === '/etc/default/grub') {
      if (/^\s*(export\s+)?GRUB_CMDLINE_LINUX(_DEFAULT)?=/.test(line)) lines[i] = rewriteCmdline(line, i + 1, c)
    } else if (path === '/etc/initramfs-tools/conf.d/resume') {
      const m = /^(\s*RESUME=)(["']?)(\/dev\/\S+?)\2\s*$/.exec(line)
      if (m) {
        const next = rename(m[3]!, 'initramfs RESUME', i + 1, c)
        if (next !== m[3]) lines[i] = `${m[1]}${m[2]}${next}${m[2]}`
      }
    } else if (/^\s*linux(efi|16)?\s/.test(line)) {
      // grub.cfg: the kernel's lines only (GRUB's own `set root='hd0,gpt3'` names no Linux device).
      lines[i] = rewriteCmdline(line, i + 1, c)
    }
  }
  return lines.join('\n')
}

/**
 * Plans the rewrite of the device names in `files` (see the module comment) for disks on the bus
 * family `ctx.family`; `ids` are the guest's block devices (appliance names). Never throws: files
 * above {@link DEVICE_NAME_FILE_MAX} or holding NUL bytes are left as they are (reported in `kept`).
 */
export function planDeviceNames(files: BootFile[], ids: BlockId[], ctx: NameContext): DeviceNamePlan {
  const plan: DeviceNamePlan = { writes: [], rewritten: [], kept: [] }
  for (const f of files) {
    if (!(DEVICE_NAME_FILES as readonly string[]).includes(f.path)) continue
    if (f.text.length > DEVICE_NAME_FILE_MAX || f.text.includes('\0')) {
      plan.kept.push({ file: f.path, line: 0, what: 'file', from: f.path, to: null, why: `not read: above ${DEVICE_NAME_FILE_MAX} bytes or not text` })
      continue
    }
    const c: Ctx = { ...ctx, ids, file: f.path, rewritten: plan.rewritten, kept: plan.kept }
    const next = rewriteFile(f.path, f.text, c)
    if (next !== f.text) plan.writes.push({ path: f.path, content: next, expect: f.text })
  }
  return plan
}

/**
 * The block identities of a `blkid -p -o export`-style listing (guestfish `blkid DEVICE`:
 * `KEY: value` lines) for `device`: `UUID`, `PART_ENTRY_UUID`, `TYPE`.
 */
export function parseBlkid(device: string, text: string): BlockId {
  const get = (k: string) => new RegExp(`^${k}: ?(.*)$`, 'm').exec(text)?.[1]?.trim() ?? ''
  return { device, uuid: get('UUID'), partuuid: get('PART_ENTRY_UUID'), type: get('TYPE') }
}

/**
 * The device name plan of an inspected Linux guest whose disks (`disks` of them) are attached on
 * libvirt bus `bus` (`virtio`: virtio-blk, `vdX`; any other: `sdX`), and the job's record of it
 * (`written` false until the caller wrote the files). Null when the guest was not inspected, is
 * not Linux, or none of its files names a device the destination breaks.
 */
export function planGuestDeviceNames(
  inspection: { inspected: boolean; os: { type: string } | null; initramfs: string | null; bootFiles?: BootFile[]; blockIds?: BlockId[] } | null,
  bus: string,
  disks: number,
): { plan: DeviceNamePlan; record: DeviceNamesRecord } | null {
  if (!inspection?.inspected || inspection.os?.type !== 'linux') return null
  const family = bus === 'virtio' ? 'vd' : 'sd'
  const plan = planDeviceNames(inspection.bootFiles ?? [], inspection.blockIds ?? [], { family, disks, initramfs: !!inspection.initramfs })
  if (plan.rewritten.length === 0 && plan.kept.length === 0) return null
  return { plan, record: { family, rewritten: plan.rewritten, kept: plan.kept, written: false, error: null } }
}
