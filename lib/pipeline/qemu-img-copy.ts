/**
 * One range of a disk copied by qemu itself: `qemu-img convert` moves the bytes of
 * `[offset, offset+length)` from the reader's qemu block node into the same range of the sink
 * volume, while the migrator's copy loop (copy-engine-qemu-img.ts) keeps the checkpoints, progress,
 * bandwidth cap and cancel.
 *
 * Both sides are the raw format driver's `offset`/`size` window over a qemu block node
 * (qemu `docs/system/qemu-block-drivers`, QAPI `BlockdevOptionsRaw`), passed as `json:` node
 * specifications (no file name is parsed for a protocol prefix):
 *
 *   qemu-img convert -n [-W] -p [--target-is-zero] [-t none] [-r <bytes/s>]
 *     'json:{"driver":"raw","offset":O,"size":L,"file":<source node>}'
 *     'json:{"driver":"raw","offset":O,"size":L,"file":<target node>}'
 *
 * - `-n`: the target exists (the sink created and sized it); `-p`: progress, parsed from stdout
 *   (`(NN.NN/100%)`).
 * - `-W` (out-of-order writes) only into a block device: the copy loop fsyncs the whole range
 *   before it reports a watermark, so order inside a range does not matter to resume, but into
 *   an image file writes landing out of disk order grow ext4's extent tree, and the file then
 *   takes more blocks than `qemu-img convert`'s own (measured on an 8 GiB disk of
 *   65,536 64 KiB extents: 92-560 KiB more); in order, the whole job was 12-29% slower there.
 * - Zeros are never written: qemu-img skips what its block status or its 4 KiB scan finds zero;
 *   with `--target-is-zero` (a range of a fresh volume nothing was written to) it does nothing
 *   for them, otherwise it first discards the range (`BDRV_REQ_MAY_UNMAP`: punch-hole on a file,
 *   discard/zero-out on a block device) and then skips them.
 * - `-t none`: the target is written with `O_DIRECT` (cache=none), past the host's page cache,
 *   where the volume takes it (see `openDirect` in lib/sink/volume.ts).
 * - `-r`: qemu-img's own rate limit (bytes per second of the range it walks, so the bytes it
 *   reads from the source stay under it too).
 */
import { spawn } from 'node:child_process'
import { MigError } from '../errors.ts'

/** A qemu block-node specification (the object after `json:`). */
export type QemuNode = Record<string, unknown>

/** Options of {@link qemuImgCopyRange}. Bytes. */
export interface QemuImgCopyRangeOptions {
  /** Node of the disk's bytes (virtual disk offsets). */
  source: QemuNode
  /** Node of the volume. */
  target: QemuNode
  offset: number
  length: number
  /** The range of the target reads as zeros already (fresh volume, never written there). */
  targetIsZero: boolean
  /** Let qemu-img write out of order (`-W`; see the module comment). */
  outOfOrder?: boolean
  /** Write the target with `-t none` (cache=none, `O_DIRECT`: past the page cache). */
  targetDirect?: boolean
  /** qemu-img's rate limit, bytes per second (0: none). */
  maxBytesPerSecond?: number
  /** Aborting kills qemu-img (SIGKILL) and rejects with `E_MIG_CANCELLED`. */
  signal: AbortSignal
  /** Fraction (0..1) of the range done, as qemu-img reports it. */
  onFraction?(fraction: number): void
  /** qemu-img binary (default from PATH). */
  qemuImgPath?: string
  /** Name used in messages. */
  label: string
  /** Called with the child's pid once it started (tests check it is gone after a cancel). */
  onSpawn?(pid: number): void
}

const window = (node: QemuNode, offset: number, length: number): string => `json:${JSON.stringify({ driver: 'raw', offset, size: length, file: node })}`

/**
 * Runs `qemu-img convert` over one range (see the module comment) and resolves when it exited 0.
 * Throws `E_MIG_CANCELLED` when `signal` aborts (qemu-img is killed and waited for first),
 * `E_MIG_DISK_WRITE_FAILED` when qemu-img failed writing (its stderr names the error), else
 * `E_MIG_DISK_READ_FAILED` with qemu-img's stderr.
 */
export function qemuImgCopyRange(o: QemuImgCopyRangeOptions): Promise<void> {
  const at = `${o.label}: qemu-img convert of ${o.length} bytes at offset ${o.offset}`
  if (o.signal.aborted) return Promise.reject(new MigError('E_MIG_CANCELLED', `${o.label}: copy cancelled at offset ${o.offset}`))
  const args = ['convert', '-n', '-p']
  if (o.outOfOrder) args.push('-W')
  if (o.targetIsZero) args.push('--target-is-zero')
  if (o.targetDirect) args.push('-t', 'none')
  if (o.maxBytesPerSecond && o.maxBytesPerSecond > 0) args.push('-r', String(Math.max(1, Math.floor(o.maxBytesPerSecond))))
  args.push(window(o.source, o.offset, o.length), window(o.target, o.offset, o.length))
  return new Promise((resolve, reject) => {
    let child
    try {
      child = spawn(o.qemuImgPath ?? 'qemu-img', args, { stdio: ['ignore', 'pipe', 'pipe'] })
    } catch (e) {
      return reject(new MigError('E_MIG_DISK_READ_FAILED', `${at}: cannot start qemu-img: ${(e as Error).message}`, { cause: e }))
    }
    if (child.pid !== undefined) o.onSpawn?.(child.pid)
    let err = ''
    let out = ''
    child.stderr!.setEncoding('utf8').on('data', (s: string) => (err = (err + s).slice(-8192)))
    child.stdout!.setEncoding('utf8').on('data', (s: string) => {
      out = (out + s).slice(-256)
      const m = /\((\d+(?:\.\d+)?)\/100%\)[^(]*$/.exec(out)
      if (m) o.onFraction?.(Math.min(1, Number(m[1]) / 100))
    })
    const onAbort = () => child.kill('SIGKILL')
    o.signal.addEventListener('abort', onAbort, { once: true })
    let spawnError: Error | null = null
    child.once('error', (e) => (spawnError = e))
    child.once('close', (code, sig) => {
      o.signal.removeEventListener('abort', onAbort)
      if (o.signal.aborted) return reject(new MigError('E_MIG_CANCELLED', `${o.label}: copy cancelled at offset ${o.offset}`))
      if (code === 0) return resolve()
      const why = spawnError
        ? `cannot run qemu-img: ${(spawnError as Error).message}`
        : `qemu-img ${sig ? `killed by ${sig}` : `exit code ${code}`}${err.trim() ? `: ${err.trim()}` : ''}`
      const code2 =
        /error while writing|write|No space|ENOSPC/i.test(err) && !/error while reading/i.test(err) ? 'E_MIG_DISK_WRITE_FAILED' : 'E_MIG_DISK_READ_FAILED'
      reject(new MigError(code2, `${at} failed: ${why}`, { details: { offset: o.offset } }))
    })
  })
}
