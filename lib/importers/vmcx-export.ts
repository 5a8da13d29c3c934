/**
 * `vmcx_export` importer (spec 1.1 `VmcxExport`, a passthrough: the data copy is one
 * `run_full_import` by `virt-v2v` with its Hyper-V input, spec 1.2 step 3 and 1.5).
 *
 * Input: a Hyper-V export folder (`Export-VM` / Hyper-V Manager "Export") laid out as
 * `<VM>/Virtual Machines/<GUID>.vmcx` (+ `.vmrs`, `.vmgs`), `<VM>/Virtual Hard Disks/*.vhdx|
 * *.avhdx|*.vhd|*.avhd` and optionally `<VM>/Snapshots/`; or the `.vmcx` file itself. The VMCX is
 * parsed with {@link parseVmcx}; its disk paths (Windows paths on the source host) are mapped onto
 * the export's `Virtual Hard Disks` folder by file name; when none of them is there, every disk
 * of that folder that is not the parent of another is taken, with a warning. Capacities come from
 * the VHDX ([MS-VHDX]) and VHD footer headers; a differencing `.avhdx`/`.avhd` gets its
 * `backing_chain` through its parent locator (`relative_path`, `absolute_win32_path`,
 * `volume_path` for VHDX; the VHD parent locators and unicode name), parents being looked up by
 * file name in the same folder.
 */
import { readdir, stat } from 'node:fs/promises'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { resolveInRoot } from '../hostpath.ts'
import { guestFamilyOf, sanitizeLabel, type DiskFormat, type ManifestDisk, type ManifestNic, type VmManifest } from '../manifest.ts'
import { MAX_VMCX_BYTES, parseVmcx } from '../formats/vmcx-container.ts'
import { vmcxVmInfo, type VmcxDisk } from '../formats/vmcx.ts'
import { readVhdxInfo } from '../formats/vhdx.ts'
import { readVhdInfo } from '../formats/vhd.ts'
import type { Importer, InspectContext } from './types.ts'
import { openRead, statPath } from '../formats/io.ts'

const MAX_DIR_ENTRIES = 10000
const MAX_CHAIN = 64
const MiB = 1024 * 1024
const VM_DIR = 'Virtual Machines'
const VHD_DIR = 'Virtual Hard Disks'
const DISK_RE = /\.(vhdx|avhdx|vhd|avhd)$/i

async function listDir(dir: string): Promise<string[]> {
  let names: string[]
  try {
    names = await readdir(dir)
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code
    if (code === 'ENOENT' || code === 'ENOTDIR') return []
    throw new MigError('E_MIG_DISK_READ_FAILED', `${dir}: cannot list: ${(e as Error).message}`)
  }
  if (names.length > MAX_DIR_ENTRIES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${dir}: more than ${MAX_DIR_ENTRIES} entries`)
  return names.sort()
}

/** Case-insensitive lookup of a child directory (exports made on Windows are case-insensitive). */
async function childDir(parent: string, want: string): Promise<string | null> {
  for (const n of await listDir(parent)) {
    if (n.toLowerCase() !== want.toLowerCase()) continue
    const s = await stat(path.join(parent, n)).catch(() => null)
    if (s?.isDirectory()) return path.join(parent, n)
  }
  return null
}

/**
 * Locates the export: returns the `.vmcx` and the export folder (the parent of `Virtual
 * Machines`). The input may be the export folder, its `Virtual Machines` folder, a folder holding
 * the `.vmcx` directly, or the `.vmcx` file. Throws `E_MIG_MALFORMED_ARCHIVE` (no `.vmcx`, several),
 * `E_MIG_UNSUPPORTED_FORMAT` (a file that is not a `.vmcx`), `E_MIG_DISK_READ_FAILED`.
 */
export async function findVmcx(inputPath: string): Promise<{ vmcx: string; exportDir: string }> {
  const st = await statPath(inputPath)
  if (st.isFile()) {
    if (!/\.vmcx$/i.test(inputPath)) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: not a .vmcx file`)
    const dir = path.dirname(inputPath)
    return { vmcx: inputPath, exportDir: path.basename(dir).toLowerCase() === VM_DIR.toLowerCase() ? path.dirname(dir) : dir }
  }
  if (!st.isDirectory()) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: neither a folder nor a .vmcx file`)
  // The export folder (holding `Virtual Machines`), or a folder holding the .vmcx itself.
  const sub = await childDir(inputPath, VM_DIR)
  const vmDir = sub ?? inputPath
  const exportDir = sub ? inputPath : path.basename(inputPath).toLowerCase() === VM_DIR.toLowerCase() ? path.dirname(inputPath) : inputPath
  const found: string[] = []
  for (const n of await listDir(vmDir)) {
    if (!/\.vmcx$/i.test(n)) continue
    const s = await stat(path.join(vmDir, n)).catch(() => null)
    if (s?.isFile()) found.push(n)
  }
  if (found.length === 0)
    throw new MigError(
      'E_MIG_MALFORMED_ARCHIVE',
      sub ? `${vmDir}: no .vmcx file` : `${inputPath}: not a Hyper-V export (no "${VM_DIR}" folder and no .vmcx file)`,
    )
  if (found.length > 1) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${vmDir}: several .vmcx files: ${found.join(', ')}`, { details: { vmcx_files: found } })
  return { vmcx: path.join(vmDir, found[0]!), exportDir }
}

/** Reads at most `cap + 1` bytes of `file` (so an oversized file is detected without reading it all). */
async function readCapped(file: string, cap: number): Promise<Buffer> {
  const fh = await openRead(file)
  try {
    const buf = Buffer.alloc(cap + 1)
    let got = 0
    while (got < buf.length) {
      const { bytesRead } = await fh.read(buf, got, buf.length - got, got)
      if (bytesRead === 0) break
      got += bytesRead
    }
    if (got > cap) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${file}: configuration file larger than ${cap} bytes`)
    return buf.subarray(0, got)
  } catch (e) {
    if (e instanceof MigError) throw e
    throw new MigError('E_MIG_DISK_READ_FAILED', `${file}: cannot read: ${(e as Error).message}`)
  } finally {
    await fh.close()
  }
}

/** Last component of a Windows or POSIX path. */
function baseNameAny(p: string): string {
  const parts = p.split(/[\\/]/)
  return parts[parts.length - 1] ?? ''
}

interface DiskHeader {
  format: DiskFormat
  virtualSize: number
  parentHints: string[]
}

async function readDiskHeader(file: string): Promise<DiskHeader> {
  if (/\.a?vhdx$/i.test(file)) {
    const h = await readVhdxInfo(file)
    const hints: string[] = []
    if (h.has_parent) {
      const pl = h.parent_locator ?? {}
      for (const k of ['relative_path', 'absolute_win32_path', 'volume_path']) if (pl[k]) hints.push(pl[k]!)
      if (hints.length === 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${file}: differencing VHDX without a parent path in its parent locator`)
    }
    return { format: 'vhdx', virtualSize: h.virtual_size, parentHints: hints }
  }
  const h = await readVhdInfo(file)
  const hints: string[] = []
  if (h.disk_type === 'differencing') {
    for (const l of h.parent_locators) if (l.path) hints.push(l.path)
    if (h.parent_name) hints.push(h.parent_name)
    if (hints.length === 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${file}: differencing VHD without a parent locator or name`)
  }
  return { format: 'vpc', virtualSize: h.virtual_size, parentHints: hints }
}

/**
 * Inspects a Hyper-V export folder or `.vmcx`.
 *
 * Throws `E_MIG_MALFORMED_ARCHIVE` (bad VMCX, a VMCX disk missing from `Virtual Hard Disks`
 * while others are present, a parent disk missing, a differencing loop or chain over 64),
 * `E_MIG_UNSUPPORTED_FORMAT` (not a VMCX, an unknown format version, a disk that is not VHD/VHDX),
 * `E_MIG_HOST_PATH_REJECTED` (a disk that is a symlink out of the root), `E_MIG_DISK_READ_FAILED`.
 */
async function inspect(inputPath: string, ctx: InspectContext): Promise<VmManifest> {
  const { vmcx, exportDir } = await findVmcx(resolveInRoot(ctx.importRoot, inputPath, { allowUploads: ctx.allowUploads }))
  const cfg = parseVmcx(await readCapped(vmcx, MAX_VMCX_BYTES), path.basename(vmcx))
  const info = vmcxVmInfo(cfg)
  const warnings = [...cfg.warnings, ...info.warnings]
  warnings.push('Hyper-V export: the data copy and guest conversion are done by virt-v2v (passthrough import)')

  // Disks of the export folder, by lower-cased file name.
  const vhdDir = await childDir(exportDir, VHD_DIR)
  const available = new Map<string, string>()
  if (vhdDir) {
    for (const n of await listDir(vhdDir)) {
      if (!DISK_RE.test(n)) continue
      const s = await stat(path.join(vhdDir, n)).catch(() => null)
      if (s?.isFile()) available.set(n.toLowerCase(), n)
    }
  }
  const fileOf = (name: string): string => resolveInRoot(ctx.importRoot, path.join(vhdDir!, name), { allowUploads: ctx.allowUploads })

  const headers = new Map<string, DiskHeader>()
  const header = async (name: string): Promise<DiskHeader> => {
    let h = headers.get(name)
    if (!h) headers.set(name, (h = await readDiskHeader(fileOf(name))))
    return h
  }
  /** Chain of file names below `name` (parents, nearest first). */
  const parentsOf = async (name: string): Promise<string[]> => {
    const chain: string[] = []
    const seen = new Set([name.toLowerCase()])
    let cur = name
    for (;;) {
      const h = await header(cur)
      if (h.parentHints.length === 0) return chain
      const hit = h.parentHints.map((p) => available.get(baseNameAny(p).toLowerCase())).find((x) => x !== undefined)
      if (!hit) {
        throw new MigError(
          'E_MIG_MALFORMED_ARCHIVE',
          `${cur}: parent disk ${JSON.stringify(baseNameAny(h.parentHints[0]!))} is not in the export's "${VHD_DIR}" folder`,
          { details: { disk: cur, parent: h.parentHints[0] } },
        )
      }
      if (seen.has(hit.toLowerCase())) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${name}: differencing chain loops back to ${hit}`)
      seen.add(hit.toLowerCase())
      chain.push(hit)
      if (chain.length > MAX_CHAIN) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${name}: differencing chain deeper than ${MAX_CHAIN}`)
      cur = hit
    }
  }

  type Pick = { name: string; bus: ManifestDisk['controller']; address: string }
  let picks: Pick[] = []
  const mapped = info.disks.map((d: VmcxDisk) => ({ d, name: available.get(baseNameAny(d.pathname).toLowerCase()) ?? null }))
  const missing = mapped.filter((m) => m.name === null)
  if (mapped.length > 0 && missing.length === 0) {
    picks = mapped.map((m) => ({ name: m.name!, bus: m.d.bus, address: m.d.address }))
  } else if (mapped.length > 0 && missing.length < mapped.length) {
    const names = missing.map((m) => baseNameAny(m.d.pathname))
    throw new MigError(
      'E_MIG_MALFORMED_ARCHIVE',
      `${path.basename(vmcx)}: disk(s) ${names.map((n) => JSON.stringify(n)).join(', ')} named by the VMCX are not in the export's "${VHD_DIR}" folder`,
      { details: { missing: names } },
    )
  } else if (available.size > 0) {
    // None of the VMCX paths is in the folder (or the VMCX names none): take the folder's top disks.
    const parents = new Set<string>()
    for (const n of available.values()) for (const p of await parentsOf(n)) parents.add(p)
    const tops = [...available.values()].filter((n) => !parents.has(n))
    picks = tops.map((n, i) => ({ name: n, bus: 'unknown', address: `0:${i}` }))
    warnings.push(
      mapped.length === 0
        ? `the VMCX attaches no hard disk: every disk of "${VHD_DIR}" is imported (${tops.join(', ')})`
        : `no disk path of the VMCX (${mapped.map((m) => JSON.stringify(baseNameAny(m.d.pathname))).join(', ')}) is in "${VHD_DIR}": every disk of that folder is imported (${tops.join(', ')})`,
    )
  } else if (mapped.length > 0) {
    throw new MigError(
      'E_MIG_MALFORMED_ARCHIVE',
      `${exportDir}: the export has no "${VHD_DIR}" disks, but the VMCX attaches ${mapped.map((m) => JSON.stringify(baseNameAny(m.d.pathname))).join(', ')}`,
    )
  }

  const disks: ManifestDisk[] = []
  const labels = new Set<string>()
  for (const p of picks) {
    const top = await header(p.name)
    const parents = await parentsOf(p.name)
    let allocated = 0
    for (const n of [p.name, ...parents]) allocated += (await statPath(fileOf(n))).size
    const stem = sanitizeLabel(p.name.replace(DISK_RE, ''))
    let label = stem
    for (let k = 2; labels.has(label); k++) label = `${stem}_${k}`
    labels.add(label)
    if (parents.length > 0) warnings.push(`${label}: ${p.name} is a differencing disk over ${parents.join(' <- ')}; the chain is flattened on import`)
    disks.push({
      label,
      capacity_bytes: top.virtualSize,
      allocated_bytes: allocated,
      disk_format: top.format,
      source: { path: fileOf(p.name) },
      controller: p.bus,
      address: p.address,
      ...(parents.length > 0 ? { backing_chain: parents.map(fileOf) } : {}),
    })
  }
  if (disks.length === 0) warnings.push('the export holds no hard disk')

  const nics: ManifestNic[] = info.nics.map((n, i) => ({ label: `nic${i}`, mac: n.mac, model: n.legacy ? 'e1000' : 'virtio', network: n.switchName }))
  if (info.guestOs === null) warnings.push('the VMCX does not record the guest OS: guest family unknown (set plan.guest_os)')
  let cpu = info.cpuCount ?? 1
  if (cpu < 1 || cpu > 4096) {
    warnings.push(`processor count ${cpu} is out of range: 1 used`)
    cpu = 1
  }
  let memMiB = info.memoryMiB ?? 1024
  if (info.memoryMiB === null) warnings.push('memory size not recorded: 1024 MiB used')
  if (memMiB < 1 || memMiB > 16 * 1024 * 1024) {
    warnings.push(`memory size ${memMiB} MB is out of range: 1024 MiB used`)
    memMiB = 1024
  }
  if (info.dynamicMemory) warnings.push(`dynamic memory is enabled on the source: the startup size (${memMiB} MiB) is used`)
  return {
    name: info.name?.trim() || path.basename(vmcx).replace(/\.vmcx$/i, ''),
    source_format: 'vmcx_export',
    guest_os: { family: guestFamilyOf(info.guestOs), id: info.guestOs },
    firmware: info.firmware,
    secure_boot: info.secureBoot,
    cpu: { count: cpu, cores_per_socket: 1 },
    memory_bytes: memMiB * MiB,
    disks,
    nics,
    cbt_available: false,
    warnings,
  }
}

/** The `vmcx_export` importer (a passthrough kind: `PASSTHROUGH_IMPORTERS` in `kinds.ts`). */
export const importer: Importer = { kind: 'vmcx_export', inspect }
