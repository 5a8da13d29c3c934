/**
 * The floor of the data path: what copying one file's bytes into another costs on this machine,
 * by the ways the kernel offers, beside `qemu-img convert` and the migrator's node engine on the
 * same file (docs/benchmarks.md, "The per-byte floor").
 *
 *   ./node_modules/.bin/bun bench/kernel-copy.ts [--size GiB] [--reps N] [--dirs DIR,DIR]
 *
 * The source is `--size` GiB (default 4) of unique random data (this machine's disk compresses
 * repeated data), read into the page cache before the first run; each method copies all of it
 * into a new file in the same directory:
 * - `read+write`: `pread` of 4 MiB (the data path's chunk) into one buffer, `pwrite` of it: two
 *   copies per byte (page cache to buffer, buffer to page cache), one thread;
 * - `copy_file_range`: `copy_file_range(2)` of 4 MiB per call (through `bun:ffi`): the copy the
 *   kernel makes without a user buffer (a file system without its own method, as tmpfs and ext4,
 *   goes through `splice`);
 * - `mmap+write`: `pwrite` of 4 MiB straight from a shared mapping of the source (`Bun.mmap`):
 *   one copy, the source's pages faulted in by the write;
 * - `qemu-img`: `qemu-img convert -f raw -O raw` (zero detection, its thread pool);
 * - `engine`: the migrator's node engine in this process (the raw reader of
 *   lib/pipeline/readers/raw-file.ts, `copyDisk` into the file sink by `copyImageIn`, checkpoints included): reads on
 *   libuv's pool, writes on the volume's writer thread.
 * Every run is followed by `sync -f` of its output and timed with it; before every run the
 * previous output is removed, the file system synced and 500 ms passed. The methods' order turns
 * by one every repetition (with five repetitions each method comes first once), `--reps` (default
 * 3, at least 3) repetitions. Prints per directory and method: wall seconds median [min-max], MB/s of the median,
 * the CPU seconds of the median run (this process's user + system, or qemu-img's) and whether the
 * output equals the source (`cmp`, checked on the last run). Bun only (`bun:ffi`, `Bun.mmap`).
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { closeSync, ftruncateSync, mkdirSync, openSync, readSync, rmSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { cpuTimes } from '../lib/cpu-time.ts'
import { FileSink } from '../lib/sink/file.ts'
import { cliArg, copyImageIn, median, onInterrupt } from './source.ts'

if (typeof Bun === 'undefined') {
  console.error('bench/kernel-copy.ts runs under Bun (bun:ffi, Bun.mmap): ./node_modules/.bin/bun bench/kernel-copy.ts')
  process.exit(2)
}
const { dlopen, FFIType } = await import('bun:ffi')

const GiB = 1024 ** 3
const MiB = 1024 ** 2
const CHUNK = 4 * MiB
const size = Math.round((Number(cliArg('size', '4')) * GiB) / CHUNK) * CHUNK
const reps = Math.max(3, Number(cliArg('reps', '3')))
const dirs = cliArg('dirs', '/dev/shm/mig-bench-kcopy,/var/tmp/mig-bench-kcopy').split(',')

/** `copy_file_range(2)` from glibc: fd_in, off_in (int64 pointer), fd_out, off_out, length, flags; returns bytes or -1. */
const libc = dlopen('libc.so.6', {
  copy_file_range: { args: [FFIType.i32, FFIType.ptr, FFIType.i32, FFIType.ptr, FFIType.u64, FFIType.u32], returns: FFIType.i64 },
})

/** This process's CPU seconds (user + system) and its waited-for children's. */
function cpu(): { self: number; children: number } {
  const t = cpuTimes()
  if (!t) throw new Error('/proc/self/stat cannot be read')
  return { self: t.user + t.system, children: t.childUser + t.childSystem }
}

type Method = 'read+write' | 'copy_file_range' | 'mmap+write' | 'qemu-img' | 'engine'
const METHODS: Method[] = ['read+write', 'copy_file_range', 'mmap+write', 'qemu-img', 'engine']

/** Copies `src` into the new file `dst` (both `size` bytes) by `method`. */
async function copy(method: Method, src: string, dst: string, sink: FileSink): Promise<void> {
  if (method === 'qemu-img') {
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'raw', src, dst])
    return
  }
  if (method === 'engine') {
    await copyImageIn(sink, src, 'raw', size)
    return
  }
  const a = openSync(src, 'r')
  const b = openSync(dst, 'w')
  try {
    ftruncateSync(b, size)
    if (method === 'read+write') {
      const buf = Buffer.allocUnsafe(CHUNK)
      for (let o = 0; o < size; o += CHUNK) {
        const n = readSync(a, buf, 0, CHUNK, o)
        for (let d = 0; d < n; ) d += writeSync(b, buf, d, n - d, o + d)
      }
    } else if (method === 'mmap+write') {
      const map = Bun.mmap(src, { shared: true })
      for (let o = 0; o < size; o += CHUNK) for (let d = 0; d < CHUNK; ) d += writeSync(b, map, o + d, CHUNK - d, o + d)
    } else {
      const offs = new BigInt64Array(2) // the kernel advances both offsets
      for (let o = 0; o < size; o += CHUNK) {
        offs[0] = BigInt(o)
        offs[1] = BigInt(o)
        for (let left = CHUNK; left > 0; ) {
          const n = Number(libc.symbols.copy_file_range(a, offs.subarray(0, 1), b, offs.subarray(1, 2), left, 0))
          if (n <= 0) throw new Error(`copy_file_range at ${o}: returned ${n}`)
          left -= n
        }
      }
    }
  } finally {
    closeSync(a)
    closeSync(b)
  }
}

const made: string[] = []
onInterrupt(() => {
  for (const d of made) rmSync(d, { recursive: true, force: true })
})
console.log(`${size / GiB} GiB of random data; ${reps} repetitions per method, the order turned by one each; medians [min-max]`)
try {
  for (const dir of dirs) {
    mkdirSync(dir, { recursive: true })
    const work = execFileSync('mktemp', ['-d', path.join(dir, 'kcopy-XXXXXX')], { encoding: 'utf8' }).trim()
    made.push(work)
    const src = path.join(work, 'src.raw')
    execFileSync('bash', ['-c', `head -c ${size} /dev/urandom > ${src} && cat ${src} > /dev/null`])
    const sink = new FileSink({ dataDir: work })
    const outOf = (m: Method) => (m === 'engine' ? sink.volumePath('bench', 'disk0') : path.join(work, 'dst.raw'))
    const runs = new Map<Method, Array<{ sec: number; cpu: number }>>(METHODS.map((m) => [m, []]))
    const equal = new Map<Method, boolean>()
    for (let r = 0; r < reps; r++) {
      for (let i = 0; i < METHODS.length; i++) {
        const m = METHODS[(i + r) % METHODS.length]!
        rmSync(path.join(work, 'dst.raw'), { force: true })
        await sink.remove('bench')
        execFileSync('sync')
        await new Promise((res) => setTimeout(res, 500))
        const c0 = cpu()
        const t0 = performance.now()
        await copy(m, src, outOf(m), sink)
        execFileSync('sync', ['-f', outOf(m)])
        const sec = (performance.now() - t0) / 1000
        const c1 = cpu()
        // `sync` is a waited-for child too: counted for every method alike
        runs.get(m)!.push({ sec, cpu: c1.self - c0.self + c1.children - c0.children })
        if (r === reps - 1) equal.set(m, spawnSync('cmp', ['-s', src, outOf(m)]).status === 0)
      }
    }
    const fs = execFileSync('stat', ['-f', '-c', '%T', work], { encoding: 'utf8' }).trim()
    console.log(`\n== ${dir} (${fs})`)
    console.log(`${'method'.padEnd(16)} ${'wall s'.padStart(20)} ${'MB/s'.padStart(7)} ${'cpu s'.padStart(7)}  equal`)
    for (const m of METHODS) {
      const xs = runs.get(m)!
      const secs = xs.map((x) => x.sec)
      // the median run's CPU (for an even count, the upper of the two middle runs)
      const mid = [...xs].sort((a, b) => a.sec - b.sec)[Math.floor(xs.length / 2)]!
      console.log(
        [
          m.padEnd(16),
          `${median(secs).toFixed(2)} [${Math.min(...secs).toFixed(2)}-${Math.max(...secs).toFixed(2)}]`.padStart(20),
          (size / MiB / median(secs)).toFixed(0).padStart(7),
          mid.cpu.toFixed(2).padStart(7),
          equal.get(m) ? ' yes' : ' NO',
        ].join(' '),
      )
      console.log(`  ${m} by repetition: ${secs.map((s) => s.toFixed(2)).join(' / ')} s`)
    }
    rmSync(work, { recursive: true, force: true })
  }
} finally {
  for (const d of made) rmSync(d, { recursive: true, force: true })
}
