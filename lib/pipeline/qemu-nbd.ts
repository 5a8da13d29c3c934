/**
 * Runs `qemu-nbd` as a read-only NBD server on a private Unix socket, so qemu's block drivers
 * (qcow2, vmdk, vhdx, vpc, vdi) decode an image that the TypeScript NBD client then reads
 * (DESIGN.md section 5: Debian's qemu-img 7.2 cannot write raw to a pipe).
 *
 * The image is always described as a `json:` block-node specification (qemu `docs/system/qemu-block-drivers`,
 * QAPI `BlockdevOptions`), never as a bare file name, so that
 * - a file name is never parsed for a protocol prefix (`nbd:`, `http:` ...) or for commas;
 * - a tar member is opened in place through the raw driver's `offset`/`size` options:
 *   `{"driver":"vmdk","file":{"driver":"raw","offset":O,"size":N,"file":{"driver":"file","filename":ARCHIVE}}}`;
 * - the backing chain is exactly the one the importer validated (`backing` nodes built from
 *   `backingChain`, each parent's format probed from its magic bytes), and `"backing": null`
 *   when there is none, so a hostile header cannot make qemu open a host file outside the
 *   import root.
 *
 * Command: `qemu-nbd --read-only --persistent --shared=4 --socket=<tmp>/nbd.sock
 * --pid-file=<tmp>/qemu-nbd.pid 'json:{...}'`; it serves once the pid file exists.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { stat } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { MigError } from '../errors.ts'
import { sleep } from '../retry.ts'
import type { DiskFormat } from '../manifest.ts'
import { probeMagic, readHeadTail } from '../formats/sniff.ts'
import { childFile } from '../hostpath.ts'
import { processAlive } from '../exec.ts'

/** Options of {@link startQemuNbd}. Offsets and lengths in bytes. */
export interface QemuNbdOptions {
  /** Absolute path of the image, or of the archive holding it as a member. */
  path: string
  /** qemu block driver of the image. */
  format: DiskFormat
  /** Byte offset of the image inside `path` (tar member data offset). */
  offset?: number
  /** Byte length of the image inside `path` (tar member size); required with `offset`. */
  length?: number
  /** Parent images, nearest first (absolute paths, already confined to the import root). */
  backingChain?: string[]
  /** Aborting kills qemu-nbd. */
  signal?: AbortSignal
  /** qemu-nbd binary (default `qemu-nbd` from PATH). */
  qemuNbdPath?: string
  /** How long to wait for the socket, milliseconds (default 15 000). */
  startTimeoutMs?: number
  /** Name used in messages (e.g. `disk.vmdk in appliance.ova`); defaults to `path`. */
  label?: string
}

/** A running qemu-nbd. */
export interface QemuNbdServer {
  /** The Unix socket the export is served on (export name `""`). */
  socketPath: string
  /** Process id of qemu-nbd. */
  pid: number
  /** What qemu-nbd wrote on stderr so far (at most 64 KiB, trimmed). */
  stderr(): string
  /** Whether the process has exited. */
  exited(): boolean
  /** Kills qemu-nbd (SIGTERM, then SIGKILL after 2 s), waits for it and removes the socket. Never throws. */
  close(): Promise<void>
}

const MAX_STDERR = 64 * 1024
/** Socket directories are `<tmp>/mig-nbd-<pid of the process that started qemu-nbd>-XXXXXX`. */
const SOCKET_DIR_PREFIX = 'mig-nbd-'

/** A socket directory's name: the pid of the process that made it. */
const SOCKET_DIR = new RegExp(`^${SOCKET_DIR_PREFIX}(\\d+)-`)

/** Removes the socket directories in the temp directory whose maker's pid `which` selects; returns how many. Never throws. */
function removeSocketDirsWhere(which: (pid: number) => boolean): number {
  let removed = 0
  try {
    for (const n of readdirSync(tmpdir())) {
      const m = SOCKET_DIR.exec(n)
      if (!m || !which(Number(m[1]))) continue
      rmSync(join(tmpdir(), n), { recursive: true, force: true })
      removed++
    }
  } catch {
    /* temp dir unreadable: nothing to do */
  }
  return removed
}

/**
 * Removes the socket directories a process `pid` (a job worker that was killed, so its `close()`
 * never ran) left in the temp directory. Never throws.
 */
export function removeSocketDirsOf(pid: number): void {
  removeSocketDirsWhere((p) => p === pid)
}

/**
 * Removes the socket directories of processes that no longer exist: what workers killed together
 * with their server left behind (the server that forked them could not call
 * {@link removeSocketDirsOf}). Run at server start. Never throws; returns how many it removed.
 */
export function removeOrphanSocketDirs(): number {
  return removeSocketDirsWhere((pid) => !processAlive(pid))
}

type Node = Record<string, unknown>

/**
 * The qemu driver of a parent image from its magic bytes (`formats/sniff.ts`); anything without a
 * disk signature is `raw`. Throws `E_MIG_DISK_READ_FAILED` when unreadable, and
 * `E_MIG_UNSUPPORTED_FORMAT` for a legacy qcow v1 image (qemu's `qcow` driver, which no importer
 * reads; before, it was passed to qemu as qcow2).
 */
export async function probeImageFormat(path: string): Promise<DiskFormat> {
  const { head, tail, size } = await readHeadTail(path)
  const hit = probeMagic(head, tail, size)
  if (hit?.format === 'qcow') throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${path}: legacy qcow v1 image; convert it with qemu-img convert -O qcow2`)
  return hit?.disk_format ?? 'raw'
}

/**
 * The qemu block-node specification of {@link QemuNbdOptions} (the object after `json:`).
 * `fileOf` names each file for the process that opens the node (default: the path itself; a
 * child's inherited descriptor, {@link childFile}; or this process's, `pinnedProcPath`). Throws `E_MIG_DISK_READ_FAILED` for an inconsistent offset/length or an unreadable parent.
 */
export async function qemuBlockSpec(
  opts: Pick<QemuNbdOptions, 'path' | 'format' | 'offset' | 'length' | 'backingChain'>,
  fileOf: (path: string) => string = (p) => p,
): Promise<Node> {
  let file: Node = { driver: 'file', filename: fileOf(opts.path) }
  if (opts.offset !== undefined || opts.length !== undefined) {
    if (!Number.isSafeInteger(opts.offset) || !Number.isSafeInteger(opts.length) || opts.offset! < 0 || opts.length! <= 0) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${opts.path}: a member range needs a non-negative offset and a positive length`)
    }
    file = { driver: 'raw', offset: opts.offset, size: opts.length, file }
  }
  const top: Node = { driver: opts.format, 'read-only': true, file }
  let node = top
  for (const parent of opts.backingChain ?? []) {
    const fmt = await probeImageFormat(parent)
    const p: Node = { driver: fmt, 'read-only': true, file: { driver: 'file', filename: fileOf(parent) } }
    node.backing = p
    node = p
  }
  node.backing = null
  return top
}

/**
 * Starts qemu-nbd over the image of `opts` and waits until it serves (its pid file and socket exist).
 * Throws `E_MIG_DISK_READ_FAILED` (qemu-nbd missing, exited early, socket timeout; the message
 * carries qemu-nbd's stderr), `E_MIG_CANCELLED` when `signal` aborts while starting.
 */
export async function startQemuNbd(opts: QemuNbdOptions): Promise<QemuNbdServer> {
  const label = opts.label ?? opts.path
  if (opts.signal?.aborted) throw new MigError('E_MIG_CANCELLED', `${label}: cancelled before qemu-nbd started`)
  const fds: number[] = []
  const spec = await qemuBlockSpec(opts, (p) => childFile(p, fds))
  const dir = mkdtempSync(join(tmpdir(), `${SOCKET_DIR_PREFIX}${process.pid}-`))
  const socketPath = join(dir, 'nbd.sock')
  // qemu-nbd creates its socket before it opens the image, and writes its pid file only once the
  // image is open: the pid file, not the socket, says it serves (one that refuses the image
  // leaves a socket file that refuses connections).
  const pidFile = join(dir, 'qemu-nbd.pid')
  const args = ['--read-only', '--persistent', '--shared=4', `--socket=${socketPath}`, `--pid-file=${pidFile}`, `json:${JSON.stringify(spec)}`]
  let err = ''
  let exitInfo: string | null = null
  let child: ChildProcess
  try {
    child = spawn(opts.qemuNbdPath ?? 'qemu-nbd', args, { stdio: ['ignore', 'ignore', 'pipe', ...fds] })
  } catch (e) {
    rmSync(dir, { recursive: true, force: true })
    throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: cannot start qemu-nbd: ${(e as Error).message}`, { cause: e })
  }
  child.stderr!.setEncoding('utf8')
  child.stderr!.on('data', (s: string) => {
    if (err.length < MAX_STDERR) err += s.slice(0, MAX_STDERR - err.length)
  })
  const exited = new Promise<void>((resolve) => {
    child.once('exit', (code, sig) => {
      exitInfo = sig ? `signal ${sig}` : `exit code ${code}`
      resolve()
    })
    child.once('error', (e) => {
      exitInfo = `spawn error: ${e.message}`
      resolve()
    })
  })

  let closing: Promise<void> | null = null
  const close = (): Promise<void> => {
    closing ??= (async () => {
      opts.signal?.removeEventListener('abort', onAbort)
      if (exitInfo === null && child.pid !== undefined) {
        child.kill('SIGTERM')
        const t = setTimeout(() => child.kill('SIGKILL'), 2000)
        await exited
        clearTimeout(t)
      }
      rmSync(dir, { recursive: true, force: true })
    })()
    return closing
  }
  const onAbort = () => void close()
  opts.signal?.addEventListener('abort', onAbort, { once: true })

  const stderr = () => err.trim()
  const fail = async (why: string): Promise<never> => {
    await close()
    const tail = stderr()
    throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: qemu-nbd ${why}${tail ? `: ${tail}` : ''}`)
  }

  const started = Date.now()
  const deadline = started + (opts.startTimeoutMs ?? 15_000)
  for (;;) {
    if (opts.signal?.aborted) {
      await close()
      throw new MigError('E_MIG_CANCELLED', `${label}: cancelled while qemu-nbd started`)
    }
    if (exitInfo !== null) {
      // Let the last stderr bytes arrive before reporting.
      await sleep(20)
      return fail(`exited before serving (${exitInfo})`)
    }
    try {
      await stat(pidFile)
      if ((await stat(socketPath)).isSocket()) break
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) return fail('did not open its socket in time')
    // qemu-nbd serves 10-20 ms after its start here: polled every 3 ms (a fixed cost of every
    // job), every 15 ms after the first half second.
    await sleep(Date.now() - started < 500 ? 3 : 15)
  }
  return { socketPath, pid: child.pid!, stderr, exited: () => exitInfo !== null, close }
}
