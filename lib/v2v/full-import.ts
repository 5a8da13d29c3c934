/**
 * The VMCX passthrough import, `run_full_import` (spec 1.1 `VmcxExport`, 1.2 step 3, 1.5; DESIGN.md
 * section 6): `virt-v2v` copies and converts a Hyper-V export's disks straight into the job's
 * destination volumes.
 *
 * Debian 12's virt-v2v 2.2 has no Hyper-V input module (`virt-v2v --machine-readable` lists
 * `input:disk|libvirt|libvirtxml|ova|vmx`), so the VM is described to it with `-i libvirtxml`
 * (virt-v2v(1) "Minimal XML for -i libvirtxml option"; parsed by virt-v2v's
 * input/parse_libvirt_xml.ml): `<domain type='hyperv'>`, name, memory in KiB, vCPUs and topology,
 * `<os firmware='bios|efi'>`, NICs with their MACs, and every disk of the manifest in order as a
 * file with its qemu format (`vhdx`, `vpc`), which virt-v2v serves with `qemu-nbd -f <format>`.
 *
 * Output: `-o local -os <run>/out -of raw -oa sparse -on <name>` writes disk `i` to
 * `<run>/out/<name>-sd<drive_name(i)>` (virt-v2v output/output.ml `disk_path`) and the converted
 * guest's libvirt XML to `<run>/out/<name>.xml`. Before the run, each of those disk paths is made a
 * symbolic link to the destination volume (virt-v2v(1) "Writing to block devices"): libguestfs'
 * `disk_create` then opens the volume through the link (a block device is only discarded; a regular
 * file is truncated and sized in place, same inode) and nbdcopy writes the converted data into it.
 * No scratch copy of the disks is made and the data crosses the disk once. virt-v2v 2.2 creates
 * the output disks only after inspection and conversion succeeded (v2v/v2v.ml: `Convert.convert`
 * before `Output_module.setup`), so a guest it cannot convert leaves the volumes untouched.
 * Should a virt-v2v replace a link by a file of its own, that file is moved onto the volume
 * (`rename` on the same file system) or stream-copied into it (`copyDisk`, flat memory).
 *
 * Progress: the "Copying disk N/M" status message selects the disk; the copy's progress lines
 * (`tool.ts`: nbdcopy's bar on stderr, `N/M`, `(NN.NN/100%)`) are turned into bytes of that disk's
 * capacity, monotone per disk, and every disk ends at its capacity on success.
 *
 * The command line, its environment and the `-i libvirtxml` input are built by
 * full-import-command.ts; this file checks the inputs, runs the tool and places its output.
 * Host needs (Debian 12): `virt-v2v`, `nbdkit`, `qemu-utils` and `libnbd-bin` (nbdcopy; the
 * virt-v2v package does not depend on it, and without it the copy step fails).
 */
import { constants as C } from 'node:fs'
import { chmod, chown, lstat, mkdir, mkdtemp, open, readlink, rename, rm, rmdir, stat, symlink, truncate, writeFile } from 'node:fs/promises'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import type { VmManifest } from '../manifest.ts'
import { copyDisk } from '../pipeline/copy-disk.ts'
import { openRawFileReader } from '../pipeline/readers/raw-file.ts'
import { blockDeviceSize, HandleVolume } from '../sink/volume.ts'
import type { SinkVolume } from '../sink/types.ts'
import { openZvolDevice } from '../sink/zvol.ts'
import { DEFAULT_FULL_IMPORT_BINARY, fullImportCommand } from './full-import-command.ts'
import { describeFailure, resolveBinary, runV2vTool, type ToolOutcome } from './tool.ts'
import { DEFAULT_VIRTIO_WIN_ISO } from './preparer.ts'

/** Default time limit of one import, milliseconds (8 h). */
export const DEFAULT_FULL_IMPORT_TIMEOUT_MS = 8 * 3600_000
/** Largest converted-guest libvirt XML read back, bytes. */
const MAX_OUTPUT_XML = 1024 * 1024

/** A destination volume: the disk `label` of the manifest and the raw file or block device `path` it is written to. */
export interface FullImportVolume {
  label: string
  path: string
}

/**
 * Options of {@link runV2vFullImport}.
 * - `manifest`: from the `vmcx_export` importer; `volumes`: one per manifest disk, same order.
 * - `onProgress(label, bytesDone)`: bytes of the disk copied so far (0..capacity), monotone.
 * - `onMessage(text)`: virt-v2v's status messages (optional).
 * - `binary`: the tool, a name looked up on `PATH` or a path (default `virt-v2v`).
 * - `env`: extra environment for the tool.
 * - `workDir`: where the private run directory is made (created when missing; must have 1 GiB
 *   free for virt-v2v's overlays, its own free-space check).
 * - `timeoutMs`: time limit (default 8 h).
 * - `virtioWinIso`: the virtio-win driver ISO for Windows guests (`VIRTIO_WIN`); undefined: the
 *   default ISO when it exists; null: none (virt-v2v then uses emulated devices).
 * - `sourcePath(file)`: the path virt-v2v is given for the source disk `file` (the job passes the
 *   worker's pinned descriptor, `/proc/<pid>/fd/<n>`, so the tool never resolves the name again);
 *   default the file itself. Checks and messages use the manifest's own paths.
 */
export interface FullImportOptions {
  manifest: VmManifest
  volumes: FullImportVolume[]
  signal: AbortSignal
  onProgress(label: string, bytesDone: number): void
  onMessage?(text: string): void
  binary?: string
  env?: Record<string, string>
  workDir: string
  timeoutMs?: number
  virtioWinIso?: string | null
  sourcePath?: (file: string) => string
}

/**
 * What a successful import produced: `libvirtXml` is virt-v2v's description of the converted
 * guest (disk bus, NIC model, firmware it chose; null when it wrote none), `placement[i]` says how
 * disk `i` reached its volume (`in_place` through the link, `renamed`, `copied`), `messages` the
 * last status messages, `warnings` virt-v2v's warnings and ours.
 */
export interface FullImportResult {
  libvirtXml: string | null
  placement: Array<'in_place' | 'renamed' | 'copied'>
  messages: string[]
  warnings: string[]
}

function fail(msg: string, details?: Record<string, unknown>): never {
  throw new MigError('E_MIG_V2V_FAILED', msg, details ? { details } : {})
}

/** Kind and size (bytes) of a destination volume; `E_MIG_V2V_FAILED` when it is missing or neither a file nor a block device. */
async function volumeInfo(v: FullImportVolume): Promise<{ block: boolean; size: number; dev: number; mode: number; uid: number; gid: number }> {
  let st
  try {
    st = await stat(v.path)
  } catch (e) {
    fail(`VMCX import: destination volume ${v.label} (${v.path}) not found: ${(e as Error).message}`, { missing: v.path })
  }
  if (st.isBlockDevice()) return { block: true, size: (await blockDeviceSize(v.path)) ?? st.size, dev: st.dev, mode: st.mode, uid: st.uid, gid: st.gid }
  if (st.isFile()) return { block: false, size: st.size, dev: st.dev, mode: st.mode, uid: st.uid, gid: st.gid }
  fail(`VMCX import: destination volume ${v.label} (${v.path}) is neither a regular file nor a block device`)
}

/** Checks the manifest and volumes before anything runs. */
async function preflight(manifest: VmManifest, volumes: FullImportVolume[]): Promise<void> {
  if (manifest.disks.length === 0) fail(`VMCX import of ${manifest.name}: the export has no disk`)
  if (volumes.length !== manifest.disks.length) {
    throw new MigError('E_MIG_INTERNAL', `VMCX import: ${volumes.length} destination volume(s) for ${manifest.disks.length} disk(s)`)
  }
  for (let i = 0; i < volumes.length; i++) {
    const d = manifest.disks[i]!
    const v = volumes[i]!
    if (v.label !== d.label)
      throw new MigError(
        'E_MIG_INTERNAL',
        `VMCX import: volume ${i} is for disk ${JSON.stringify(v.label)}, the manifest's disk ${i} is ${JSON.stringify(d.label)}`,
      )
    if (!path.isAbsolute(v.path) || /[\x00-\x1f]/.test(v.path)) fail(`VMCX import: volume ${v.label}: ${JSON.stringify(v.path)} is not an absolute path`)
    const src = d.source.path
    if (!path.isAbsolute(src) || /[\x00-\x1f]/.test(src)) fail(`VMCX import: disk ${d.label}: source ${JSON.stringify(src)} is not an absolute path`)
    if (d.source.offset !== undefined || d.source.length !== undefined || d.source.layout || d.source.compression) {
      fail(`VMCX import: disk ${d.label}: a byte range inside an archive cannot be passed to virt-v2v`)
    }
    if (d.backing_chain?.length) {
      // qemu's vhdx driver rejects differencing images (VHDX_TYPE_DIFFERENCING "currently unsupported"), and
      // virt-v2v reads every disk through qemu-nbd.
      fail(
        `VMCX import: disk ${d.label} is a differencing disk (${path.basename(src)} over ${d.backing_chain.map((p) => path.basename(p)).join(' <- ')}), which qemu and so virt-v2v cannot read; merge the checkpoints in Hyper-V and export again`,
        { disk: d.label, backing_chain: d.backing_chain },
      )
    }
    try {
      const st = await stat(src)
      if (!st.isFile()) throw new Error('not a regular file')
    } catch (e) {
      fail(`VMCX import: disk ${d.label}: source ${src} not readable: ${(e as Error).message}`, { missing: src })
    }
    const info = await volumeInfo(v)
    if (info.block && info.size < d.capacity_bytes) {
      fail(`VMCX import: volume ${v.label} (${v.path}) holds ${info.size} bytes, less than the disk's ${d.capacity_bytes}`, { volume: v.path })
    }
  }
}

/**
 * The tool's failure as `E_MIG_V2V_FAILED` (or `E_MIG_CANCELLED`). A helper program the host lacks
 * is named (`details.missing`) with its Debian package: virt-v2v 2.2 says so itself for nbdkit
 * and qemu-nbd, but a missing nbdcopy only shows as "nbdcopy command failed" after the whole
 * conversion (tools_utils `run_command` returns 127 and logs the cause in debug output only).
 */
async function outcomeError(binary: string, o: ToolOutcome, pathEnv: string): Promise<MigError> {
  if (o.kind === 'cancelled') return new MigError('E_MIG_CANCELLED', 'VMCX import (virt-v2v) cancelled')
  const text = [...o.lastLines, ...(o.stderrLines ?? [])].join('\n')
  const pkg: Record<string, string> = { nbdcopy: 'libnbd-bin', nbdkit: 'nbdkit', 'qemu-nbd': 'qemu-utils' }
  let missing: string | null = null
  for (const tool of Object.keys(pkg)) {
    if (new RegExp(`\\b${tool}\\b`).test(text) && (await resolveBinary(tool, pathEnv)) === null) {
      missing = tool
      break
    }
  }
  const hint = missing ? ` (${missing} is missing on this host: install the ${pkg[missing]} package)` : ''
  return new MigError('E_MIG_V2V_FAILED', `${binary} ${describeFailure(o)}${hint}` + (o.lastLines.length ? `:\n${o.lastLines.join('\n')}` : ''), {
    details: { exit_code: o.code, signal: o.signal, last_lines: o.lastLines, ...(missing ? { missing } : {}) },
  })
}

/** Reads at most {@link MAX_OUTPUT_XML} bytes of `file`, or null when it does not exist. */
async function readBounded(file: string): Promise<string | null> {
  let fh
  try {
    fh = await open(file, C.O_RDONLY | C.O_NOFOLLOW)
  } catch {
    return null
  }
  try {
    const buf = Buffer.alloc(MAX_OUTPUT_XML)
    let got = 0
    while (got < buf.length) {
      const { bytesRead } = await fh.read(buf, got, buf.length - got, got)
      if (bytesRead === 0) break
      got += bytesRead
    }
    return buf.subarray(0, got).toString('utf8')
  } finally {
    await fh.close()
  }
}

/**
 * Copies the regular file `from` (exactly `size` bytes) into volume `v` with `copyDisk` (4 MiB
 * chunks, zero runs discarded). A block device is opened as the zvol sink opens its devices
 * ({@link openZvolDevice}; not fresh: it may hold old data); a regular file is emptied and resized
 * first, so it reads as zeros and zero runs cost nothing.
 */
async function copyInto(from: string, v: FullImportVolume, size: number, block: boolean, signal: AbortSignal): Promise<void> {
  if (!block) {
    await truncate(v.path, 0)
    await truncate(v.path, size)
  }
  const reader = await openRawFileReader(from, { label: `${v.label} (virt-v2v output)` })
  let vol: SinkVolume
  try {
    vol = block ? await openZvolDevice(v.path, { capacityBytes: size, volsize: size, fresh: false, discard: { broken: false } }) : await openFile(v.path, size)
  } catch (e) {
    await reader.close()
    throw e
  }
  try {
    await copyDisk(reader, vol, { from: 0, signal, label: v.label, onProgress: () => {}, onWatermark: async () => {} })
  } finally {
    await vol.close()
    await reader.close()
  }
}

/** The emptied regular file `file` of `size` bytes as a fresh volume (4 KiB blocks, written through the page cache). `E_MIG_DISK_WRITE_FAILED`. */
async function openFile(file: string, size: number): Promise<SinkVolume> {
  let fh
  try {
    fh = await open(file, C.O_RDWR | C.O_NOFOLLOW)
  } catch (e) {
    throw new MigError('E_MIG_DISK_WRITE_FAILED', `${file}: cannot open: ${(e as Error).message}`, { details: { volume: file } })
  }
  return new HandleVolume(fh, file, size, 4096, { fresh: true, discardAlign: 64 * 1024, writeback: 'always' })
}

/**
 * Runs the passthrough import of `opts.manifest` into `opts.volumes` (see the module comment) and
 * resolves once every converted disk is in its volume, durable, and the run directory removed.
 *
 * Throws `E_MIG_V2V_FAILED`: the binary is missing (named, `details.missing`), a source disk is
 * missing or a differencing disk, a block volume is smaller than its disk, the tool exits non-zero
 * or times out (`details.last_lines`: its last error lines, `exit_code`, `signal`; a helper program
 * the host lacks is named), a converted disk is missing or has the wrong size; `E_MIG_CANCELLED`
 * when `signal` aborts (the tool's process group is killed: SIGTERM, SIGKILL 5 s later);
 * `E_MIG_DISK_WRITE_FAILED` / `E_MIG_DISK_READ_FAILED` from a fallback copy; `E_MIG_INTERNAL` when
 * the volumes do not match the manifest's disks.
 */
export async function runV2vFullImport(opts: FullImportOptions): Promise<FullImportResult> {
  const { manifest, volumes, signal } = opts
  if (signal.aborted) throw new MigError('E_MIG_CANCELLED', 'VMCX import cancelled before it started')
  await preflight(manifest, volumes)
  const binary = opts.binary ?? DEFAULT_FULL_IMPORT_BINARY

  let iso: string | null = null
  if (opts.virtioWinIso) {
    try {
      await stat(opts.virtioWinIso)
      iso = opts.virtioWinIso
    } catch {
      fail(`VMCX import: virtio-win driver ISO ${opts.virtioWinIso} not found`, { missing: opts.virtioWinIso })
    }
  } else if (opts.virtioWinIso === undefined) {
    iso = await stat(DEFAULT_VIRTIO_WIN_ISO).then(
      () => DEFAULT_VIRTIO_WIN_ISO,
      () => null,
    )
  }

  const probe = fullImportCommand(manifest, '/nonexistent', { binary, env: opts.env, virtioWinIso: iso })
  const bin = await resolveBinary(binary, probe.env.PATH ?? '')
  if (!bin) fail(`VMCX import: ${binary} not found or not executable (PATH=${probe.env.PATH})`, { missing: binary })

  await mkdir(opts.workDir, { recursive: true, mode: 0o700 })
  const runDir = await mkdtemp(path.join(opts.workDir, 'vmcx-import-'))
  try {
    const sourcePath = opts.sourcePath
    const forTool = sourcePath
      ? { ...manifest, disks: manifest.disks.map((d) => ({ ...d, source: { ...d.source, path: sourcePath(d.source.path) } })) }
      : manifest
    const cmd = fullImportCommand(forTool, runDir, { binary, env: opts.env, virtioWinIso: iso })
    await mkdir(cmd.outputDir, { mode: 0o700 })
    await mkdir(cmd.tmpDir, { mode: 0o700 })
    await writeFile(cmd.inputXmlPath, cmd.inputXml, { mode: 0o600 })
    for (let i = 0; i < volumes.length; i++) await symlink(volumes[i]!.path, cmd.outputs[i]!)

    // Progress: "Copying disk N/M" selects the disk, progress lines give its fraction.
    const caps = manifest.disks.map((d) => d.capacity_bytes)
    const done = caps.map(() => 0)
    let current: number | null = null
    const report = (i: number, bytes: number) => {
      const b = Math.max(0, Math.min(caps[i]!, Math.floor(bytes)))
      if (b <= done[i]!) return
      done[i] = b
      opts.onProgress(volumes[i]!.label, b)
    }
    const outcome = await runV2vTool(bin, cmd.argv.slice(1), cmd.env, {
      signal,
      timeoutMs: opts.timeoutMs ?? DEFAULT_FULL_IMPORT_TIMEOUT_MS,
      onProgress: (p) => {
        if (p.message !== null) {
          opts.onMessage?.(p.message)
          const m = /^Copying disk ([0-9]{1,6})\/([0-9]{1,6})$/.exec(p.message)
          if (m) {
            const k = Number(m[1]) - 1
            if (k >= 0 && k < caps.length) {
              for (let j = 0; j < k; j++) report(j, caps[j]!)
              current = k
            }
          }
        } else if (p.fraction !== null && current !== null) {
          report(current, p.fraction * caps[current]!)
        }
      },
    }).catch((e: Error) => fail(`VMCX import: cannot start ${bin}: ${e.message}`))
    if (outcome.kind !== 'ok') throw await outcomeError(binary, outcome, cmd.env.PATH ?? '')
    if (signal.aborted) throw new MigError('E_MIG_CANCELLED', 'VMCX import (virt-v2v) cancelled')

    const warnings = [...outcome.warnings]
    const placement: FullImportResult['placement'] = []
    for (let i = 0; i < volumes.length; i++) {
      const v = volumes[i]!
      const cap = caps[i]!
      const out = cmd.outputs[i]!
      const lst = await lstat(out).catch(() => null)
      if (!lst) fail(`VMCX import: virt-v2v reported success but wrote no disk ${i + 1} (${v.label}): ${path.basename(out)} is missing`, { disk: v.label })
      const info = await volumeInfo(v)
      if (lst.isSymbolicLink()) {
        const target = await readlink(out)
        if (target !== v.path) fail(`VMCX import: ${path.basename(out)} points to ${target}, not to volume ${v.path}`, { disk: v.label })
        if (info.block ? info.size < cap : info.size !== cap) {
          fail(`VMCX import: converted disk ${v.label} in ${v.path} holds ${info.size} bytes, the disk has ${cap}`, {
            disk: v.label,
            size: info.size,
            capacity: cap,
          })
        }
        const fh = await open(v.path, info.block ? C.O_RDONLY : C.O_RDWR)
        try {
          await fh.sync()
        } finally {
          await fh.close()
        }
        placement.push('in_place')
        continue
      }
      if (!lst.isFile())
        fail(`VMCX import: virt-v2v's output ${path.basename(out)} for disk ${v.label} is neither the volume link nor a file`, { disk: v.label })
      if (lst.size !== cap)
        fail(`VMCX import: converted disk ${v.label} holds ${lst.size} bytes, the disk has ${cap}`, { disk: v.label, size: lst.size, capacity: cap })
      if (!info.block && lst.dev === info.dev) {
        await chmod(out, info.mode & 0o7777)
        if (process.getuid?.() === 0) await chown(out, info.uid, info.gid)
        const fh = await open(out, C.O_RDWR | C.O_NOFOLLOW)
        try {
          await fh.sync()
        } finally {
          await fh.close()
        }
        await rename(out, v.path)
        const dir = await open(path.dirname(v.path), 'r')
        await dir.sync().finally(() => dir.close())
        placement.push('renamed')
      } else {
        await copyInto(out, v, cap, info.block, signal)
        placement.push('copied')
      }
      warnings.push(`${v.label}: virt-v2v wrote its own file instead of the volume link; the disk was ${placement[i]} into ${v.path}`)
    }
    for (let i = 0; i < volumes.length; i++) report(i, caps[i]!)
    const libvirtXml = await readBounded(cmd.outputXmlPath)
    if (libvirtXml === null) warnings.push(`virt-v2v wrote no ${path.basename(cmd.outputXmlPath)}`)
    return { libvirtXml, placement, messages: outcome.messages.slice(-50), warnings }
  } finally {
    // The links are removed, never followed.
    await rm(runDir, { recursive: true, force: true }).catch(() => undefined)
    await rmdir(opts.workDir).catch(() => undefined)
  }
}
