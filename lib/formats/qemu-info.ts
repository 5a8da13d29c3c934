/**
 * `qemu-img info` as a bounded subprocess: the fallback probe of DESIGN.md section 5 and the
 * source of `allocated_bytes` (qemu's `actual-size`) for single-disk importers; and
 * `qemu-img check`, run before a copy to refuse truncated or damaged images.
 *
 * Follows qemu's `qemu-img info --output=json` schema (QAPI `ImageInfo`: `virtual-size`,
 * `actual-size`, `backing-filename`, `backing-filename-format`, `cluster-size`, `dirty-flag`,
 * `format`). `-U` (force share) lets a running VM's image be inspected without taking its lock.
 * A tar member is probed in place through qemu's raw driver `offset`/`size` options layered under
 * the format driver (`--image-opts driver=<fmt>,file.driver=raw,file.offset=..,file.size=..`).
 *
 * Security note: with `backingChain: true` qemu opens every backing file it names, wherever it
 * is; confine the chain first (e.g. `resolveQcow2BackingChain`) before asking for it.
 */
import { exec, type ExecResult } from '../exec.ts'
import { MigError } from '../errors.ts'
import { childFile } from '../hostpath.ts'
import type { DiskFormat } from '../manifest.ts'

/** Default time limit of one `qemu-img info` run, milliseconds. */
export const QEMU_INFO_TIMEOUT_MS = 20_000
/** Largest stdout accepted from `qemu-img info`, bytes (1 MiB). */
export const QEMU_INFO_STDOUT_CAP = 1024 * 1024

/**
 * What `qemu-img info` says about one image. Sizes are bytes.
 * - `format`: qemu's driver name (`qcow2`, `vmdk`, `vpc`, `vhdx`, `vdi`, `raw`, `qcow`, ...).
 * - `virtual_size`: size the guest sees.
 * - `actual_size`: host bytes allocated to the file (null when qemu cannot tell).
 * - `backing_filename` / `backing_format`: as recorded in the image (not resolved), or null.
 * - `cluster_size`: allocation unit (qcow2 cluster, vhdx/vpc block, vmdk grain), or null.
 * - `dirty`: the image's dirty flag (qcow2 lazy refcounts, vhdx log, ...).
 * - `filename`: the name qemu reports (a `json:` pseudo-name for `--image-opts`).
 */
export interface QemuImgInfo {
  format: string
  virtual_size: number
  actual_size: number | null
  backing_filename: string | null
  backing_format: string | null
  cluster_size: number | null
  dirty: boolean
  filename: string
}

/**
 * Options of {@link qemuImgInfo}.
 * - `format`: force the driver (`-f`); omitted, qemu probes.
 * - `offset`/`length`: byte range of an embedded image (tar member). `length` is rounded up to a
 *   multiple of 512 (qemu's raw driver requires it; tar pads members to 512 bytes anyway).
 * - `backingChain`: pass `--backing-chain` and return one entry per image, top first.
 * - `timeoutMs`: time limit (default 20 s). `qemuImg`: binary (default `qemu-img`).
 */
export interface QemuImgInfoOptions {
  format?: DiskFormat
  offset?: number
  length?: number
  backingChain?: boolean
  timeoutMs?: number
  qemuImg?: string
}

/** Escapes a value for qemu's `key=value,...` option syntax (a comma is doubled). */
function optValue(v: string): string {
  return v.replace(/,/g, ',,')
}

/** Builds the argument vector of `qemu-img info` for `path` and `opts` (exported for tests). */
export function qemuInfoArgs(path: string, opts: QemuImgInfoOptions = {}): string[] {
  const args = ['info', '--output=json', '-U']
  if (opts.backingChain) args.push('--backing-chain')
  if (opts.offset !== undefined || opts.length !== undefined) {
    const offset = opts.offset ?? 0
    if (!Number.isSafeInteger(offset) || offset < 0) throw new MigError('E_MIG_INTERNAL', `qemuImgInfo: bad offset ${offset}`)
    const parts: string[] = []
    if (opts.format) parts.push(`driver=${opts.format}`)
    parts.push('file.driver=raw', `file.offset=${offset}`)
    if (opts.length !== undefined) {
      if (!Number.isSafeInteger(opts.length) || opts.length < 0) throw new MigError('E_MIG_INTERNAL', `qemuImgInfo: bad length ${opts.length}`)
      parts.push(`file.size=${Math.ceil(opts.length / 512) * 512}`)
    }
    parts.push('file.file.driver=file', `file.file.filename=${optValue(path)}`)
    args.push('--image-opts', parts.join(','))
  } else {
    if (opts.format) args.push('-f', opts.format)
    // `--` is not understood by qemu-img; a leading `-` is defused by making the path explicit.
    args.push(path.startsWith('-') ? `./${path}` : path)
  }
  return args
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : null
}

function str(v: unknown): string | null {
  return typeof v === 'string' ? v : null
}

/** Maps one QAPI `ImageInfo` object to {@link QemuImgInfo}; null when it lacks the basics. */
function toInfo(o: unknown): QemuImgInfo | null {
  if (!o || typeof o !== 'object' || Array.isArray(o)) return null
  const r = o as Record<string, unknown>
  const format = str(r['format'])
  const virtual_size = num(r['virtual-size'])
  if (format === null || virtual_size === null) return null
  return {
    format,
    virtual_size,
    actual_size: num(r['actual-size']),
    backing_filename: str(r['backing-filename']),
    backing_format: str(r['backing-filename-format']),
    cluster_size: num(r['cluster-size']),
    dirty: r['dirty-flag'] === true,
    filename: str(r['filename']) ?? '',
  }
}

/**
 * Runs `bin args` (lib/exec.ts; `fds` become the child's fds 3, 4, ...) with a time limit (SIGKILL) and a stdout cap; resolves with the
 * exit status and output. Rejects with `E_MIG_MALFORMED_ARCHIVE` (time limit, oversized output)
 * or `E_MIG_INTERNAL` (qemu-img missing or not startable).
 */
async function runBounded(bin: string, args: string[], label: string, timeoutMs: number, what = 'qemu-img info', fds: number[] = []): Promise<ExecResult> {
  const r = await exec(bin, args, { timeoutMs, maxStdout: QEMU_INFO_STDOUT_CAP, fds })
  const e = r.spawnError
  if (e?.code === 'ENOENT') throw new MigError('E_MIG_INTERNAL', `qemu-img is not installed (${bin} not found)`, { cause: e })
  if (e) throw new MigError('E_MIG_INTERNAL', `cannot run ${bin}: ${e.message}`, { cause: e })
  if (r.timedOut) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: ${what} did not finish within ${timeoutMs} ms`)
  if (r.overflow) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: ${what} printed more than ${QEMU_INFO_STDOUT_CAP} bytes`)
  return r
}

/** First meaningful line of qemu-img's stderr, without the `qemu-img: ` prefix. */
function firstErrorLine(stderr: string): string {
  const line =
    stderr
      .split('\n')
      .map((l) => l.trim())
      .find((l) => l.length > 0) ?? 'failed without a message'
  return line.replace(/^qemu-img:\s*/, '').slice(0, 500)
}

/**
 * Runs `qemu-img info --output=json -U` on `path` (or on the byte range `offset`/`length` of it).
 *
 * @returns one {@link QemuImgInfo}; with `backingChain: true`, an array, top image first.
 * @throws E_MIG_MALFORMED_ARCHIVE qemu-img failed (message names the file and qemu's first error
 *   line), ran past the time limit, printed over 1 MiB, or printed something that is not its JSON.
 * @throws E_MIG_INTERNAL `qemu-img` is not installed or cannot be started.
 */
export function qemuImgInfo(path: string, opts: QemuImgInfoOptions & { backingChain: true }): Promise<QemuImgInfo[]>
export function qemuImgInfo(path: string, opts?: QemuImgInfoOptions & { backingChain?: false }): Promise<QemuImgInfo>
export function qemuImgInfo(path: string, opts?: QemuImgInfoOptions): Promise<QemuImgInfo | QemuImgInfo[]>
export async function qemuImgInfo(path: string, opts: QemuImgInfoOptions = {}): Promise<QemuImgInfo | QemuImgInfo[]> {
  const label = opts.offset !== undefined ? `${path}@${opts.offset}` : path
  const fds: number[] = []
  const args = qemuInfoArgs(opts.backingChain ? path : childFile(path, fds), opts)
  const res = await runBounded(opts.qemuImg ?? 'qemu-img', args, label, opts.timeoutMs ?? QEMU_INFO_TIMEOUT_MS, 'qemu-img info', fds)
  if (res.code !== 0) {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: qemu-img info failed: ${firstErrorLine(res.stderr)}`)
  }
  let parsed: unknown
  try {
    parsed = JSON.parse(res.stdout)
  } catch {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: qemu-img info printed invalid JSON`)
  }
  if (opts.backingChain) {
    if (!Array.isArray(parsed)) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: qemu-img info --backing-chain did not print an array`)
    const chain = parsed.map(toInfo)
    if (chain.length === 0 || chain.some((c) => c === null))
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: qemu-img info printed an entry without format or virtual-size`)
    return chain as QemuImgInfo[]
  }
  const info = toInfo(parsed)
  if (!info) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: qemu-img info printed no format or virtual-size`)
  return info
}

/** Formats whose `qemu-img check` finds data beyond the end of a truncated file (qemu 7.2: qcow2, VHDX, VMDK sparse; its VDI check does not). */
export const CHECKABLE_FORMATS: readonly DiskFormat[] = ['qcow2', 'vhdx', 'vmdk']

/**
 * What `qemu-img check` found (QAPI `ImageCheck`): `corruptions` (e.g. data clusters beyond the
 * end of the file), `leaks` (harmless unreferenced clusters), `check_errors` (metadata it could
 * not read), `image_end_offset` (bytes, when reported). `checked` is false when the driver has no
 * check (exit status 63).
 */
export interface QemuImgCheck {
  checked: boolean
  corruptions: number
  leaks: number
  check_errors: number
  image_end_offset: number | null
}

/**
 * Runs `qemu-img check --output=json -U -f <format> <path>`: reads only metadata (L1/L2 tables,
 * refcounts, BAT), so it is fast whatever the disk size. qemu reads data clusters that lie beyond
 * the end of a truncated file as zeros without any error (and so does `qemu-img convert`), so a
 * copy must run this first to notice the missing data.
 * Exit status (qemu-img(1)): 0 clean, 2 corruptions, 3 leaks only, 63 no check for the format,
 * 1 the check could not complete.
 * @throws E_MIG_DISK_READ_FAILED the check could not complete (qemu's first error line).
 * @throws E_MIG_MALFORMED_ARCHIVE time limit (default 10 min), oversized or unparsable output.
 * @throws E_MIG_INTERNAL `qemu-img` is not installed.
 */
export async function qemuImgCheck(path: string, format: DiskFormat, opts: { timeoutMs?: number; qemuImg?: string } = {}): Promise<QemuImgCheck> {
  const fds: number[] = []
  const file = childFile(path, fds)
  // Inside an input scope the image is the pinned descriptor, and only it: `backing: null`.
  const image = fds.length > 0 ? `json:${JSON.stringify({ driver: format, backing: null, file: { driver: 'file', filename: file } })}` : path
  const res = await runBounded(
    opts.qemuImg ?? 'qemu-img',
    fds.length > 0 ? ['check', '--output=json', '-U', image] : ['check', '--output=json', '-U', '-f', format, path],
    path,
    opts.timeoutMs ?? 600_000,
    'qemu-img check',
    fds,
  )
  if (res.code === 63) return { checked: false, corruptions: 0, leaks: 0, check_errors: 0, image_end_offset: null }
  if (res.code !== 0 && res.code !== 2 && res.code !== 3) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${path}: qemu-img check could not complete: ${firstErrorLine(res.stderr)}`)
  }
  let r: Record<string, unknown>
  try {
    r = JSON.parse(res.stdout) as Record<string, unknown>
  } catch {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${path}: qemu-img check printed invalid JSON`)
  }
  const n = (k: string) => (typeof r[k] === 'number' && Number.isSafeInteger(r[k]) ? (r[k] as number) : 0)
  return {
    checked: true,
    corruptions: n('corruptions'),
    leaks: n('leaks'),
    check_errors: n('check-errors'),
    image_end_offset: typeof r['image-end-offset'] === 'number' ? (r['image-end-offset'] as number) : null,
  }
}
