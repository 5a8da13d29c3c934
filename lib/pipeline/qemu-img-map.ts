/**
 * The data map of a qemu block node: which ranges of a raw or flat disk file hold data
 * and which read as zeros, as `qemu-img map --output=json` reports them (qemu
 * `docs/tools/qemu-img.rst`, "map"; for the `file` protocol driver the answer comes from
 * `lseek(SEEK_DATA/SEEK_HOLE)` on the open descriptor, which Node cannot call itself).
 *
 *   qemu-img map --output=json --start-offset=FROM 'json:<node>'
 *
 * prints one JSON object per line: `{ "start": S, "length": L, "depth": D, "present": P,
 * "zero": Z, "data": X, "offset": O }` (the list's `[`, `,` and `]` around them). A range with
 * `zero: true` and `data: false` reads as zeros (a hole); everything else must be read.
 *
 * The output is read line by line (memory stays flat however many ranges the file has), each line
 * is checked (numbers, order, no gap, no overlap, inside the disk) and the ranges must cover
 * `[from, size)` exactly, else the map is refused.
 */
import { spawn } from 'node:child_process'
import { MigError } from '../errors.ts'
import type { DiskExtent } from '../contracts/disk-reader.ts'
import type { QemuNode } from './qemu-img-copy.ts'

/** Options of {@link qemuImgMap}. */
export interface QemuImgMapOptions {
  /** Node whose bytes are the disk (virtual offsets 0..size). */
  node: QemuNode
  /** First byte of the map. */
  from: number
  /** Virtual size of the disk, bytes (the map must end there). */
  size: number
  /** Name used in messages. */
  label: string
  /** qemu-img binary (default from PATH). */
  qemuImgPath?: string
}

/** Longest line accepted from qemu-img, characters (a map line is about 120). */
const MAX_LINE = 4096

/** The lines of a stream, each at most {@link MAX_LINE} characters; ends when the stream ends or is destroyed. */
async function* lines(stream: NodeJS.ReadableStream, fail: (why: string) => Error): AsyncGenerator<string> {
  let rest = ''
  try {
    for await (const chunk of stream) {
      const parts = (rest + chunk.toString()).split('\n')
      rest = parts.pop()!
      if (rest.length > MAX_LINE) throw fail(`an output line longer than ${MAX_LINE} characters`)
      yield* parts
    }
  } catch (e) {
    if ((e as { code?: string }).code === 'E_MIG_DISK_READ_FAILED') throw e
    // A destroyed stream (qemu-img could not be started): the exit status says why.
  }
  if (rest) yield rest
}

/** One line of `qemu-img map --output=json` (only the fields used). */
const LINE = /^\[?\{\s*"start":\s*(\d+),\s*"length":\s*(\d+),.*"zero":\s*(true|false),\s*"data":\s*(true|false)/

/**
 * Yields the extents of `[from, size)` in increasing order, without gaps, adjacent extents of the
 * same kind merged. Throws `E_MIG_DISK_READ_FAILED` when qemu-img cannot be run or fails (its
 * stderr quoted), or when its output is not a map covering exactly `[from, size)`. Stopping the
 * iteration early kills qemu-img.
 */
export async function* qemuImgMap(o: QemuImgMapOptions): AsyncGenerator<DiskExtent> {
  const fail = (why: string) => new MigError('E_MIG_DISK_READ_FAILED', `${o.label}: qemu-img map from offset ${o.from}: ${why}`)
  if (o.from >= o.size) return
  const child = spawn(o.qemuImgPath ?? 'qemu-img', ['map', '--output=json', `--start-offset=${o.from}`, `json:${JSON.stringify(o.node)}`], {
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let err = ''
  child.stderr.setEncoding('utf8').on('data', (s: string) => (err = (err + s).slice(-4096)))
  let spawnError: Error | null = null
  const exited = new Promise<number | null>((resolve) => {
    child.once('error', (e) => {
      spawnError = e
      child.stdout.destroy() // no process: end the line reader
      resolve(null)
    })
    child.once('close', (code) => resolve(code))
  })
  let at = o.from
  let pending: DiskExtent | null = null
  try {
    for await (const line of lines(child.stdout, fail)) {
      if (line === '' || line === '[]' || line === ']') continue
      const m = LINE.exec(line)
      if (!m) throw fail(`unexpected output line ${JSON.stringify(line.slice(0, 200))}`)
      const start = Number(m[1])
      const length = Number(m[2])
      if (!Number.isSafeInteger(start) || !Number.isSafeInteger(length) || length <= 0 || start !== at || start + length > o.size) {
        throw fail(`range of ${m[2]} bytes at ${m[1]} does not follow offset ${at} inside the disk (${o.size} bytes)`)
      }
      const zero = m[3] === 'true' && m[4] === 'false'
      at = start + length
      if (pending && pending.zero === zero) pending.length += length
      else {
        if (pending) yield pending
        pending = { offset: start, length, zero }
      }
    }
    const code = await exited
    if (code !== 0) throw fail(spawnError ? `cannot run qemu-img: ${(spawnError as Error).message}` : `exit code ${code}: ${err.trim()}`)
    if (at !== o.size) throw fail(`the map ends at ${at}, not at the disk's end (${o.size} bytes)`)
    if (pending) yield pending
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  }
}
