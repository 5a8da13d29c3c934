/**
 * The benchmark source disk of DESIGN.md section 8: a qcow2 of `size` bytes (64 KiB
 * clusters) whose every other cluster holds random data, so half the clusters are allocated.
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, openSync, readFileSync, statSync, writeSync } from 'node:fs'
import { constants } from 'node:os'
import * as path from 'node:path'
import { cpuTimes } from '../lib/cpu-time.ts'
import type { DiskFormat } from '../lib/manifest.ts'
import type { CopyDiskOptions, CopyDiskResult } from '../lib/pipeline/copy-common.ts'
import { copyDisk } from '../lib/pipeline/copy-disk.ts'
import { openDiskReader } from '../lib/pipeline/readers/open.ts'
import type { Sink } from '../lib/sink/types.ts'
import { workerPid, type SseEvent } from '../test/helpers/jobs.ts'

/** Cluster size of the benchmark qcow2, bytes. */
export const CLUSTER = 64 * 1024

/**
 * Writes `<dir>/<name>` (qcow2, virtual size `size` bytes, half the clusters random data) and
 * warms the page cache with it. Returns its path and the bytes of data it holds.
 */
export function makeHalfFullQcow2(dir: string, size: number, name = 'src.qcow2'): { path: string; dataBytes: number } {
  const raw = path.join(dir, 'src.raw')
  const fd = openSync(raw, 'w')
  const rnd = randomBytes(CLUSTER * 256)
  let dataBytes = 0
  for (let o = 0; o < size; o += 2 * CLUSTER) {
    writeSync(fd, rnd, ((o / (2 * CLUSTER)) % 256) * CLUSTER, CLUSTER, o)
    dataBytes += CLUSTER
  }
  closeSync(fd)
  spawnSync('truncate', ['-s', String(size), raw])
  const qcow = path.join(dir, name)
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, qcow])
  execFileSync('rm', ['-f', raw])
  execFileSync('cat', [qcow], { stdio: ['ignore', 'ignore', 'inherit'] })
  return { path: qcow, dataBytes }
}

/** One side of a copy benchmark: best seconds, sha256 of the destination, its allocated bytes. */
export interface CopyFigures {
  sec: number
  sha256: string
  allocated: number
}

/** Thousands separators for byte counts. */
export const fmt = (n: number): string => n.toLocaleString('en-US')

/** sha256 of a file by `sha256sum`, so hashing does not inflate the benchmark's own RSS. */
export function sha256File(file: string): string {
  return execFileSync('sha256sum', [file], { encoding: 'utf8' }).split(' ')[0]!
}

/** Bytes the file system allocated for `file` (st_blocks x 512). */
export function allocatedBytes(file: string): number {
  return statSync(file).blocks * 512
}

/** The reference: `qemu-img convert -f <format> -O raw <src> <out>` (sparse) and `sync -f`, timed. */
export function qemuImgReference(src: string, out: string, format = 'qcow2'): CopyFigures {
  const t0 = performance.now()
  execFileSync('qemu-img', ['convert', '-f', format, '-O', 'raw', src, out])
  execFileSync('sync', ['-f', out])
  const sec = (performance.now() - t0) / 1000
  return { sec, sha256: sha256File(out), allocated: allocatedBytes(out) }
}

/**
 * Prints the side-by-side table (seconds, MB/s of the virtual `size`, allocated bytes, sha256),
 * the ratio, the caller's `notes`, and whether the destinations are equal; a mismatch sets a
 * failing exit code. `source` describes the source disk (default: the half-full qcow2 of
 * {@link makeHalfFullQcow2} holding `dataBytes`).
 */
export function printComparison(
  size: number,
  dataBytes: number,
  oursTitle: string,
  ref: CopyFigures,
  ours: CopyFigures,
  notes: string[],
  source = `qcow2, ${fmt(size)} bytes virtual, ${fmt(dataBytes)} bytes of data (half the 64 KiB clusters)`,
): void {
  const w = Math.max(20, oursTitle.length + 2)
  const row = (name: string, a: string, b: string) => console.log(`${name.padEnd(30)}${a.padStart(20)}${b.padStart(w)}`)
  const mbs = (s: number) => (size / (1024 * 1024) / s).toFixed(0)
  console.log(`source: ${source}`)
  console.log('')
  row('', 'qemu-img convert', oursTitle)
  row('seconds', ref.sec.toFixed(2), ours.sec.toFixed(2))
  row('MB/s (virtual size)', mbs(ref.sec), mbs(ours.sec))
  row('destination allocated bytes', fmt(ref.allocated), fmt(ours.allocated))
  row('sha256', ref.sha256.slice(0, 16), ours.sha256.slice(0, 16))
  console.log('')
  console.log(`ratio (${oursTitle} / qemu-img MB/s): ${(ref.sec / ours.sec).toFixed(2)}`)
  for (const n of notes) console.log(n)
  const equal = ref.sha256 === ours.sha256
  console.log(equal ? 'destinations are sha256-equal' : 'MISMATCH: destinations differ')
  if (!equal) process.exitCode = 1
}

/** VmHWM (peak resident set, bytes) of process `pid` from /proc; 0 when it is gone. */
export function vmHwm(pid: number): number {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
    return m ? Number(m[1]) * 1024 : 0
  } catch {
    return 0
  }
}

/**
 * Samples the VmHWM of the worker of job `jobId` (of the server on `dataDir`) every 50 ms;
 * `stop()` ends sampling and returns the peak, bytes.
 */
export function sampleWorkerPeakRss(dataDir: string, jobId: string): { stop(): number } {
  let pid: number | null = null
  let hwm = 0
  const sampler = setInterval(() => {
    pid ??= workerPid(dataDir, jobId)
    if (pid) hwm = Math.max(hwm, vmHwm(pid))
  }, 50)
  return {
    stop() {
      clearInterval(sampler)
      return hwm
    },
  }
}

/** The value after `--<name>` on the command line, else `dflt`. */
export function cliArg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1]! : dflt
}

/**
 * CPU seconds (user + system) of the children this process has waited for so far
 * (lib/cpu-time.ts): the difference around an `execFileSync` is that command's CPU time.
 */
export function childCpuSeconds(): number {
  const t = cpuTimes()
  if (!t) throw new Error('childCpuSeconds: /proc/self/stat cannot be read')
  return t.childUser + t.childSystem
}

/** Median of `xs` (mean of the two middle values for an even count). */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

/** `median [min-max]` of `xs`, each rounded to a whole number. */
export function span(xs: number[]): string {
  return `${median(xs).toFixed(0)} [${Math.min(...xs).toFixed(0)}-${Math.max(...xs).toFixed(0)}]`
}

/**
 * Runs repetitions of both sides, alternating the order (reference first on even repetition
 * indexes, ours first on odd ones): `reps` of them, or with `more.minSeconds` more (at most
 * `more.maxReps`) until the repetitions took `minSeconds` of wall time together, so a layout
 * whose runs last a fraction of a second gets as many samples as its noise needs. Whether a
 * repetition is the last is decided before it runs (from the mean duration of those before it);
 * `onRep(r, last)` runs before each repetition. Resolves the number of repetitions run.
 */
export async function alternate(
  reps: number,
  runRef: () => Promise<void>,
  runOurs: () => Promise<void>,
  onRep: (r: number, last: boolean) => void = () => {},
  more: { minSeconds?: number; maxReps?: number } = {},
): Promise<number> {
  const minMs = (more.minSeconds ?? 0) * 1000
  const maxReps = Math.max(reps, more.maxReps ?? reps)
  let spent = 0
  for (let r = 0; ; r++) {
    const last = r + 1 >= reps && (r + 1 >= maxReps || spent + (r > 0 ? spent / r : 0) >= minMs)
    onRep(r, last)
    const t0 = performance.now()
    if (r % 2 === 0) {
      await runRef()
      await runOurs()
    } else {
      await runOurs()
      await runRef()
    }
    spent += performance.now() - t0
    if (last) return r + 1
  }
}

/**
 * The migrator's copy phase of a disk image in process, as a job runs it: the job's reader of
 * `src` (`format`, a qemu format name: `qcow2`, `raw`, ...; `size` bytes virtual;
 * `openDiskReader`: by its block table, qemu-nbd for the images it leaves to qemu, the raw reader
 * for `raw`), a new volume `bench/disk0` of `sink`, `copyDisk` (every checkpoint fsync included)
 * with `opts`, both closed. Returns the copy's byte counts.
 */
export async function copyImageIn(sink: Sink, src: string, format: DiskFormat, size: number, opts: Partial<CopyDiskOptions> = {}): Promise<CopyDiskResult> {
  const reader = await openDiskReader({ label: 'disk0', capacity_bytes: size, disk_format: format, source: { path: src }, controller: 'virtio', address: '0' })
  const vol = await sink.create('bench', 'disk0', reader.size)
  try {
    return await copyDisk(reader, vol, { from: 0, signal: new AbortController().signal, onProgress() {}, async onWatermark() {}, ...opts })
  } finally {
    await vol.close()
    await reader.close()
  }
}

/**
 * Runs `cleanup` when the bench is stopped by SIGINT, SIGTERM or SIGHUP, then exits with 128 +
 * the signal's number: a `finally` does not run when a signal ends the process, and a stopped
 * run must leave no loop device, domain, server or temporary directory behind.
 */
export function onInterrupt(cleanup: () => void | Promise<void>): void {
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(sig, () => {
      Promise.resolve()
        .then(cleanup)
        .catch((e) => console.error(`cleanup after ${sig}: ${(e as Error).message}`))
        .finally(() => process.exit(128 + constants.signals[sig]))
    })
  }
}

const TERMINAL = ['completed', 'failed', 'cancelled']

/**
 * Resolves once `events` (an open stream's) holds job `id`'s terminal `migration` event, as the
 * client receives it (checked every 2 ms, no poll of the API), or after `timeoutMs`.
 */
export async function sawTerminal(events: SseEvent[], id: string, timeoutMs: number): Promise<void> {
  const terminal = () => events.some((e) => e.event === 'migration' && e.data.id === id && TERMINAL.includes(e.data.status))
  const deadline = Date.now() + timeoutMs
  while (!terminal() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 2))
}

/**
 * Seconds job `id` spent in `CopyingFull`, from a stream's `migration` events: from its first
 * `CopyingFull` event to the first event of another state (a live job publishes `CopyingFull`
 * again once its snapshot is taken).
 */
export function copyPhaseSeconds(events: SseEvent[], id: string): number {
  const evs = events.filter((e) => e.event === 'migration' && e.data.id === id)
  const i = evs.findIndex((e) => e.data.state === 'CopyingFull')
  const next = evs.findIndex((e, k) => k > i && e.data.state !== 'CopyingFull')
  return (Date.parse(evs[next]!.data.updated_at) - Date.parse(evs[i]!.data.updated_at)) / 1000
}
