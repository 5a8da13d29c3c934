/**
 * Read-only static inspection of a copied guest before its domain is defined (spec 1.2 "Starting",
 * DESIGN.md section 6): what the guest can boot from.
 *
 * Two stages:
 * 1. {@link probeDiskLayout} reads the first sectors of the boot disk on the host (no libguestfs):
 *    partition table (MBR entries, GPT header), a file system superblock at offset 0, and whether
 *    the MBR carries BIOS boot code. A disk with neither partitions nor a file system (a bare boot
 *    sector) has nothing libguestfs could tell, and a bare file system without boot code cannot
 *    be booted by any firmware: the costly stage is skipped for both.
 * 2. {@link inspectGuest} launches libguestfs read-only (`guestfish --ro --listen`, driven with
 *    `--remote`; `LIBGUESTFS_BACKEND=direct`, plus `LIBGUESTFS_BACKEND_SETTINGS=force_tcg` where the
 *    host runs guests under TCG) over every disk and reads: the operating system (`inspect-os`),
 *    every file system's UUID and label, `/etc/fstab`, GRUB's `grub.cfg` default entry (kernel
 *    version and command line: `root=`, `console=`), the initramfs of that kernel (listed on the
 *    host with `lsinitramfs`), the kernel's `modules.builtin` and `modules.dep` (drivers built in /
 *    installed), and the UEFI loaders of every FAT file system (`/EFI/<dir>/<name>.efi`, {@link EspInfo}).
 *    Under TCG one launch costs seconds (see docs/boot-check.md), paid once per job.
 *
 * Nothing is written to the guest. Failures of the inspection itself are not job failures: the
 * result says `inspected: false` with the reason, and the caller falls back to the family defaults.
 */
import { mkdtemp, open, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { exec } from '../exec.ts'
import { catFile, fishEnv, fishFormatOf, mountFilesystems, startFish, type Fish, type GuestMount } from './guestfish.ts'
import {
  ifupdownIncludes,
  parseIfcfg,
  parseIfupdown,
  parseLinkFiles,
  parseNetplan,
  parseNetworkd,
  parseNmKeyfiles,
  parseUdevNetRules,
  type GuestText,
} from './net-config.ts'
import type { GuestNetwork } from './net-identity.ts'
import { DEVICE_NAME_FILE_MAX, DEVICE_NAME_FILES, parseBlkid, type BlockId, type BootFile } from './device-names.ts'

/** What the first sectors of a disk show (see {@link probeDiskLayout}). */
export interface DiskLayout {
  /** An MBR with at least one partition entry, or a GPT header at LBA 1. */
  partitioned: boolean
  /** A known file system / volume signature at the start of the disk (ext, XFS, NTFS, LVM, btrfs). */
  filesystem: boolean
  /** The MBR's boot code area (bytes 0..439) is not all zero and the 0x55AA signature is present. */
  biosBootCode: boolean
}

/** One file system of the guest: appliance device name (`/dev/sda3`), type, UUID and label ('' when none). */
export interface GuestFilesystem {
  device: string
  type: string
  uuid: string
  label: string
}

/**
 * Result of {@link inspectGuest}.
 * - `inspected`: libguestfs ran; when false, `skipped` says why and the other fields are empty.
 * - `os`: `inspect-os` found an operating system: type (`linux`, `windows`), distro, product name.
 * - `kernelVersion`, `kernelCmdline`: of GRUB's default entry (null when not found).
 * - `rootSpec`: the kernel's `root=` (else fstab's `/` entry), e.g. `UUID=…`, `/dev/sda3`.
 * - `fstab`: entries (spec, mount point, type), comments dropped.
 * - `initramfs`: the initramfs file of that kernel (guest path) or null; `initramfsModules`: the
 *   kernel module names it holds (`-` spelled `_`); `builtinModules`: the kernel's built-ins;
 *   `installedModules`: every module in `modules.dep`.
 * - `esp`: a FAT file system is present (an EFI system partition candidate).
 * - `esps`: each FAT file system's loaders and where it lies on its disk ({@link EspInfo}).
 * - `network`: the interfaces the guest's network configuration names and the naming rules it
 *   carries (Linux guests; null otherwise; see {@link readGuestNetwork}).
 * - `mounts`: the file systems of the operating system found and where they mount, shortest
 *   mount point first (`inspect-get-mountpoints`), for a later read-write session on the same
 *   disks ({@link import('./guest-files.ts').writeGuestFiles}); empty when no OS was found.
 * - `seconds`: wall time of the libguestfs stage.
 */
export interface GuestInspection {
  inspected: boolean
  skipped: string | null
  layout: DiskLayout | null
  os: { type: string; distro: string; product: string } | null
  filesystems: GuestFilesystem[]
  fstab: Array<{ spec: string; mountpoint: string; type: string }>
  kernelVersion: string | null
  kernelCmdline: string | null
  rootSpec: string | null
  initramfs: string | null
  initramfsModules: string[]
  builtinModules: string[]
  installedModules: string[]
  esp: boolean
  esps: EspInfo[]
  network: GuestNetwork | null
  mounts: GuestMount[]
  /**
   * Every partition and file system of the guest's disks with its file system UUID, partition UUID
   * and type (swap and LUKS included; `blkid`), for the device name rewrite (lib/domain/device-names.ts).
   */
  blockIds?: BlockId[]
  /** The files whose device names the boot depends on ({@link DEVICE_NAME_FILES}), as read (Linux guests). */
  bootFiles?: BootFile[]
  seconds: number
}

/**
 * A FAT file system (EFI system partition candidate) of the guest:
 * - `device`: appliance name (`/dev/sda2`); `disk`: index of its disk in the inspected list;
 *   `partition`: its partition number (null for a whole-disk FAT); `offsetBytes`: where it starts
 *   on that disk (0 for a whole-disk FAT).
 * - `loaders`: every `.efi` file one or two levels under `/EFI` (`/EFI/debian/shimx64.efi`,
 *   `/EFI/BOOT/BOOTX64.EFI`, `/EFI/Microsoft/Boot/bootmgfw.efi`), spelled as stored (FAT is
 *   case-insensitive: compare without case).
 */
export interface EspInfo {
  device: string
  disk: number
  partition: number | null
  offsetBytes: number
  loaders: string[]
}

/**
 * Options of {@link inspectGuest}: `tcg` forces libguestfs' appliance onto TCG; `timeoutMs` bounds
 * each guestfish call (default 900 s: the appliance launch under TCG on a loaded 2-core host was
 * seen above 180 s).
 */
export interface InspectOptions {
  tcg: boolean
  timeoutMs?: number
  signal?: AbortSignal
}

function empty(skipped: string, layout: DiskLayout | null): GuestInspection {
  return {
    inspected: false,
    skipped,
    layout,
    os: null,
    filesystems: [],
    fstab: [],
    kernelVersion: null,
    kernelCmdline: null,
    rootSpec: null,
    initramfs: null,
    initramfsModules: [],
    builtinModules: [],
    installedModules: [],
    esp: false,
    esps: [],
    network: null,
    mounts: [],
    blockIds: [],
    bootFiles: [],
    seconds: 0,
  }
}

/**
 * Reads the first 68 KiB of `file` (raw disk image or block device; the migrator's `*.qcow2`
 * overlay through `qemu-img dd`) and reports its layout. Never
 * throws: an unreadable disk reads as empty (and then is not inspected).
 */
export async function probeDiskLayout(file: string): Promise<DiskLayout> {
  const buf = Buffer.alloc(68 * 1024)
  let n = 0
  if (fishFormatOf(file) === 'qcow2') return layoutOf(await qcow2Head(file, buf.length))
  try {
    const fh = await open(file, 'r')
    try {
      n = (await fh.read(buf, 0, buf.length, 0)).bytesRead
    } finally {
      await fh.close()
    }
  } catch {
    return { partitioned: false, filesystem: false, biosBootCode: false }
  }
  return layoutOf(buf.subarray(0, n))
}

/** The first `length` bytes of the guest disk in qcow2 image `file` (`qemu-img dd`); empty when unreadable. */
async function qcow2Head(file: string, length: number): Promise<Buffer> {
  const work = await mkdtemp(path.join(tmpdir(), 'mig-head-'))
  try {
    const out = path.join(work, 'head.raw')
    const r = await exec('qemu-img', ['dd', '-U', '-f', 'qcow2', '-O', 'raw', `bs=${length}`, 'count=1', `if=${file}`, `of=${out}`], { timeoutMs: 120_000 })
    if (r.code !== 0) return Buffer.alloc(0)
    const fh = await open(out, 'r')
    try {
      const buf = Buffer.alloc(length)
      return buf.subarray(0, (await fh.read(buf, 0, length, 0)).bytesRead)
    } finally {
      await fh.close()
    }
  } catch {
    return Buffer.alloc(0)
  } finally {
    await rm(work, { recursive: true, force: true })
  }
}

/** The layout the first bytes `b` of a disk show (see {@link probeDiskLayout}). */
function layoutOf(b: Buffer): DiskLayout {
  const n = b.length
  const sig = n >= 512 && b[510] === 0x55 && b[511] === 0xaa
  let mbrEntries = false
  if (sig) for (let i = 0; i < 4; i++) if (b[446 + i * 16 + 4] !== 0) mbrEntries = true
  const gpt = n >= 520 && b.toString('latin1', 512, 520) === 'EFI PART'
  const at = (off: number, s: string) => n >= off + s.length && b.toString('latin1', off, off + s.length) === s
  const ext = n >= 1082 && b.readUInt16LE(1080) === 0xef53
  const filesystem = ext || at(0, 'XFSB') || at(3, 'NTFS    ') || at(512, 'LABELONE') || at(65536 + 64, '_BHRfS_M')
  let code = false
  for (let i = 0; i < 440 && i < n; i++) if (b[i] !== 0) code = true
  return { partitioned: mbrEntries || gpt, filesystem, biosBootCode: sig && code }
}

/** Module names of a list of paths (`…/vmw_pvscsi.ko.xz` -> `vmw_pvscsi`), `-` spelled `_`. */
export function moduleNames(paths: Iterable<string>): string[] {
  const out = new Set<string>()
  for (const p of paths) {
    const m = /([^/\s:]+)\.ko(?:\.(?:xz|zst|gz))?(?::|$)/.exec(p.trim())
    if (m) out.add(m[1]!.replace(/-/g, '_'))
  }
  return [...out].sort()
}

/**
 * GRUB's default entry of a `grub.cfg`: the first `linux` line (kernel path, version from
 * `vmlinuz-<version>`, command line) and its `initrd` path. Null when there is none.
 */
export function grubDefaultEntry(cfg: string): { kernel: string; version: string | null; cmdline: string; initrd: string | null } | null {
  const lines = cfg.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const m = /^\s*linux(?:efi|16)?\s+(\S+)\s*(.*)$/.exec(lines[i]!)
    if (!m) continue
    const version = /vmlinuz-(\S+)$/.exec(m[1]!)?.[1] ?? null
    let initrd: string | null = null
    for (let j = i + 1; j < Math.min(lines.length, i + 6); j++) {
      const r = /^\s*initrd(?:efi|16)?\s+(\S+)/.exec(lines[j]!)
      if (r) {
        initrd = r[1]!
        break
      }
    }
    return { kernel: m[1]!, version, cmdline: m[2]!.trim(), initrd }
  }
  return null
}

/** `root=` of a kernel command line, or null. */
export function rootOfCmdline(cmdline: string): string | null {
  return /(?:^|\s)root=(\S+)/.exec(cmdline)?.[1] ?? null
}

/** Parses `/etc/fstab` text into entries. */
export function parseFstab(text: string): GuestInspection['fstab'] {
  const out: GuestInspection['fstab'] = []
  for (const line of text.split('\n')) {
    const t = line.trim()
    if (!t || t.startsWith('#')) continue
    const f = t.split(/\s+/)
    if (f.length >= 3) out.push({ spec: f[0]!, mountpoint: f[1]!, type: f[2]! })
  }
  return out
}

/** Where FAT file system `device` lies and which `.efi` loaders it holds (null when it cannot be mounted). */
async function readEsp(fish: Fish, device: string): Promise<EspInfo | null> {
  let disk = 0
  let partition: number | null = null
  let offsetBytes = 0
  const whole = ((await fish.tryRun(['part-to-dev', device])) ?? '').trim()
  if (whole) {
    partition = Number(((await fish.tryRun(['part-to-partnum', device])) ?? '').trim()) || null
    const letters = /^\/dev\/(?:sd|vd|hd)([a-z]+)$/.exec(whole)?.[1] ?? 'a'
    disk = [...letters].reduce((n, c) => n * 26 + (c.charCodeAt(0) - 96), 0) - 1
    const parts = (await fish.tryRun(['part-list', whole])) ?? ''
    // part-list prints records: `[0] = { part_num: 2 part_start: 2097152 part_end: … part_size: … }`.
    for (const rec of parts.split(/\[\d+\] = /)) {
      const num = /part_num: (\d+)/.exec(rec)?.[1]
      const start = /part_start: (\d+)/.exec(rec)?.[1]
      if (num && start && Number(num) === partition) offsetBytes = Number(start)
    }
  }
  if ((await fish.tryRun(['mount-ro', device, '/'])) === null) return null
  try {
    const found = ((await fish.tryRun(['find', '/'])) ?? '')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => /^efi\/[^/]+\/(?:[^/]+\/)?[^/]+\.efi$/i.test(l))
      .map((l) => `/${l}`)
      .sort()
    return { device, disk, partition, offsetBytes, loaders: found }
  } finally {
    await fish.tryRun(['umount', '/'])
  }
}

/** Largest network configuration file read (bytes), and most files read per pattern. */
const NET_FILE_MAX = 256 * 1024
const NET_FILES_PER_PATTERN = 64

/**
 * The guest's network configuration, read through `fish` (the guest mounted read-only):
 * `/etc/network/interfaces` and what it sources, `/etc/netplan/*.yaml`,
 * `/etc/NetworkManager/system-connections/*`, `/etc/sysconfig/network-scripts/ifcfg-*`,
 * `/etc/systemd/network/*.network` and `*.link`, `/etc/udev/rules.d/*.rules` (naming rules).
 * Files above 256 KiB, and patterns matching more than 64 files, are noted and not read whole.
 */
async function readGuestNetwork(fish: Fish): Promise<GuestNetwork> {
  const notes: string[] = []
  const read = async (p: string): Promise<GuestText | null> => {
    if ((await fish.tryRun(['is-file', p, 'followsymlinks:true']))?.trim() !== 'true') return null
    const size = Number((await fish.tryRun(['filesize', p])) ?? 'NaN')
    if (!(size <= NET_FILE_MAX)) {
      notes.push(`${p}: ${Number.isFinite(size) ? `${size} bytes, above ${NET_FILE_MAX}` : 'size unknown'}: not read`)
      return null
    }
    const text = await catFile(fish, p).catch(() => null)
    return text === null ? null : { path: p, text }
  }
  const glob = async (pattern: string): Promise<GuestText[]> => {
    const paths = ((await fish.tryRun(['glob-expand', pattern])) ?? '')
      .split('\n')
      .map((s) => s.trim())
      .filter(Boolean)
      .sort()
    if (paths.length > NET_FILES_PER_PATTERN) notes.push(`${pattern}: ${paths.length} files, only the first ${NET_FILES_PER_PATTERN} read`)
    const out: GuestText[] = []
    for (const p of paths.slice(0, NET_FILES_PER_PATTERN)) {
      const f = await read(p)
      if (f) out.push(f)
    }
    return out
  }
  const ifupdown: GuestText[] = []
  const main = await read('/etc/network/interfaces')
  if (main) {
    ifupdown.push(main)
    // One level of `source`: Debian's default sources /etc/network/interfaces.d/*.
    for (const inc of ifupdownIncludes(main.text)) {
      for (const f of await glob(inc.kind === 'glob' ? inc.path : `${inc.path.replace(/\/$/, '')}/*`)) {
        if (inc.kind === 'dir' && !/^[A-Za-z0-9_-]+$/.test(path.posix.basename(f.path))) continue
        if (!ifupdown.some((x) => x.path === f.path)) ifupdown.push(f)
      }
    }
  }
  const interfaces = [
    ...parseIfupdown(ifupdown),
    ...parseNetplan(await glob('/etc/netplan/*.yaml')),
    ...parseNmKeyfiles(await glob('/etc/NetworkManager/system-connections/*')),
    ...parseIfcfg(await glob('/etc/sysconfig/network-scripts/ifcfg-*')),
    ...parseNetworkd(await glob('/etc/systemd/network/*.network')),
  ]
  const rules = [...parseLinkFiles(await glob('/etc/systemd/network/*.link')), ...parseUdevNetRules(await glob('/etc/udev/rules.d/*.rules'))]
  return { interfaces, rules, notes }
}

/** Failures of libguestfs within this many seconds are tried once more (its appliance did not come up). */
const QUICK_FAILURE_SECONDS = 120

/**
 * Inspects the guest on `disks` (raw images or block devices, boot disk first) read-only. Skips
 * libguestfs (result `inspected: false`) when the boot disk has neither partitions nor a file
 * system, or is a bare file system without boot code. Never throws for the guest's content; a libguestfs failure yields `inspected: false`
 * with the error in `skipped`. A libguestfs failure within {@link QUICK_FAILURE_SECONDS} (its
 * appliance or guestfish server gone before the first answer, seen with two inspections starting
 * at once) is tried once more: without the inspection the hardware choice falls back to defaults
 * the guest may not boot on.
 */
export async function inspectGuest(disks: string[], opts: InspectOptions): Promise<GuestInspection> {
  const first = await inspectOnce(disks, opts)
  const quickFailure = !first.inspected && first.skipped?.startsWith('libguestfs inspection failed') && first.seconds < QUICK_FAILURE_SECONDS
  if (!quickFailure || opts.signal?.aborted) return first
  const second = await inspectOnce(disks, opts)
  return second.inspected ? second : first
}

/** One inspection of the guest on `disks`, as {@link inspectGuest} describes. */
async function inspectOnce(disks: string[], opts: InspectOptions): Promise<GuestInspection> {
  const layout = await probeDiskLayout(disks[0]!)
  if (!layout.partitioned && !layout.filesystem)
    return empty('the boot disk has no partition table nor file system (nothing for libguestfs to inspect)', layout)
  // A bare file system without boot code in its first sector: no firmware boots it (SeaBIOS finds
  // no 0x55AA boot sector, UEFI no EFI system partition), whatever libguestfs would find inside.
  if (!layout.partitioned && !layout.biosBootCode)
    return empty('the boot disk is a bare file system without boot code (no partition table, no boot sector): no firmware boots it', layout)
  const t0 = Date.now()
  const env = fishEnv(opts.tcg)
  const timeoutMs = opts.timeoutMs ?? 900_000
  let fish: Fish | null = null
  const work = await mkdtemp(path.join(tmpdir(), 'mig-inspect-'))
  const onAbort = () => fish && process.kill(Number(fish.pid), 'SIGKILL')
  opts.signal?.addEventListener('abort', onAbort, { once: true })
  try {
    fish = await startFish(disks, env, timeoutMs)
    await fish.run(['run'])
    const result = empty('', layout)
    result.inspected = true
    result.skipped = null
    const fsList = (await fish.run(['list-filesystems']))
      .split('\n')
      .map((l) => /^(\S+):\s*(\S+)/.exec(l))
      .filter((m): m is RegExpExecArray => !!m)
    for (const [, device, type] of fsList) {
      if (type === 'unknown' || type === 'swap') continue
      const uuid = ((await fish.tryRun(['vfs-uuid', device!])) ?? '').trim()
      const label = ((await fish.tryRun(['vfs-label', device!])) ?? '').trim()
      result.filesystems.push({ device: device!, type: type!, uuid, label })
      if (type === 'vfat') result.esp = true
    }
    // Identities of every partition and file system (swap and LUKS too), for names by device.
    const blockDevices = new Set<string>(fsList.filter((m) => m[2] !== 'unknown').map((m) => m[1]!))
    for (const p of ((await fish.tryRun(['list-partitions'])) ?? '').split('\n')) if (p.trim()) blockDevices.add(p.trim())
    for (const d of [...blockDevices].filter((d) => /^\/dev\/sd[a-z]+\d*$/.test(d)).sort()) {
      const text = await fish.tryRun(['blkid', d])
      if (text !== null) result.blockIds!.push(parseBlkid(d, text))
    }
    for (const fs of result.filesystems.filter((f) => f.type === 'vfat')) {
      const info = await readEsp(fish, fs.device)
      if (info) result.esps.push(info)
    }
    const roots = (await fish.run(['inspect-os']))
      .split('\n')
      .map((s) => s.trim())
      .filter(Boolean)
    if (roots.length === 0) {
      result.seconds = (Date.now() - t0) / 1000
      return result
    }
    const root = roots[0]!
    const get = async (cmd: string) => ((await fish!.tryRun([cmd, root])) ?? '').trim()
    result.os = { type: await get('inspect-get-type'), distro: await get('inspect-get-distro'), product: await get('inspect-get-product-name') }
    result.mounts = await mountFilesystems(fish, root)
    if (result.os.type !== 'linux') {
      result.seconds = (Date.now() - t0) / 1000
      return result
    }
    const cat = async (p: string) => ((await fish!.tryRun(['is-file', p]))?.trim() === 'true' ? await catFile(fish!, p).catch(() => '') : null)
    result.fstab = parseFstab((await cat('/etc/fstab')) ?? '')
    result.network = await readGuestNetwork(fish)
    for (const p of DEVICE_NAME_FILES) {
      if ((await fish.tryRun(['is-file', p]))?.trim() !== 'true') continue
      if (!(Number((await fish.tryRun(['filesize', p])) ?? 'NaN') <= DEVICE_NAME_FILE_MAX)) continue
      const text = await catFile(fish, p).catch(() => null)
      if (text !== null) result.bootFiles!.push({ path: p, text })
    }
    let entry: ReturnType<typeof grubDefaultEntry> = null
    for (const p of ['/boot/grub/grub.cfg', '/boot/grub2/grub.cfg']) {
      const cfg = await cat(p)
      if (cfg && (entry = grubDefaultEntry(cfg))) break
    }
    const boot = ((await fish.tryRun(['ls', '/boot'])) ?? '')
      .split('\n')
      .map((s) => s.trim())
      .filter(Boolean)
    result.kernelVersion =
      entry?.version ??
      boot
        .filter((f) => f.startsWith('vmlinuz-'))
        .map((f) => f.slice(8))
        .sort()
        .pop() ??
      null
    result.kernelCmdline = entry?.cmdline ?? null
    result.rootSpec = (entry && rootOfCmdline(entry.cmdline)) ?? result.fstab.find((f) => f.mountpoint === '/')?.spec ?? null
    const ver = result.kernelVersion
    if (ver) {
      const initrdName = entry?.initrd ? path.posix.basename(entry.initrd) : null
      const candidates = [initrdName, `initrd.img-${ver}`, `initramfs-${ver}.img`].filter((s): s is string => !!s)
      const initrd = candidates.find((c) => boot.includes(c))
      if (initrd) {
        result.initramfs = `/boot/${initrd}`
        const local = path.join(work, 'initrd')
        await fish.run(['download', result.initramfs, local])
        const ls = await exec('lsinitramfs', [local], { env, timeoutMs: 120_000, maxStdout: 64 << 20 })
        result.initramfsModules = moduleNames(ls.stdout.split('\n'))
        await rm(local, { force: true })
      }
      const builtin = await cat(`/lib/modules/${ver}/modules.builtin`)
      result.builtinModules = moduleNames((builtin ?? '').split('\n'))
      const dep = await cat(`/lib/modules/${ver}/modules.dep`)
      result.installedModules = moduleNames((dep ?? '').split('\n').map((l) => l.split(':')[0]!))
    }
    result.seconds = (Date.now() - t0) / 1000
    return result
  } catch (e) {
    const r = empty(`libguestfs inspection failed: ${(e as Error).message}`, layout)
    r.seconds = (Date.now() - t0) / 1000
    return r
  } finally {
    opts.signal?.removeEventListener('abort', onAbort)
    await fish?.stop()
    await rm(work, { recursive: true, force: true })
  }
}
