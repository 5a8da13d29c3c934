/**
 * Import copy benchmark (DESIGN.md section 8): builds a qcow2 of SIZE GiB (default 4) whose
 * every other 64 KiB cluster holds random data (half the clusters allocated), then copies it to
 * a sparse raw file with
 * - the reference, `qemu-img convert -O raw` + `sync -f`, and
 * - the migrator's data path, `openDiskReader` (qemu-nbd + NBD client) + `copyDisk` into the
 *   file sink (its fsyncs included),
 * each twice in the order ref, ours, ours, ref, every run starting after both destinations were
 * removed and the file system synced (best time of each). Prints side by side: seconds, MB/s of
 * virtual size, destination allocated bytes, sha256 (must be equal); then the ratio, the peak
 * RSS during the copy (sampled) and the process's VmHWM.
 *
 *   ./node_modules/.bin/bun bench/import-copy.ts [sizeGiB] [readAhead] [writeDepth]
 *   env: BENCH_VERBOSE=1 prints every run; BENCH_FLUSH_MIB overrides copyDisk's flush interval.
 */
import { execFileSync } from 'node:child_process'
import { readFileSync, rmSync } from 'node:fs'
import * as path from 'node:path'
import { tempDir } from '../test/helpers/tmp.ts'
import { FileSink } from '../lib/sink/file.ts'
import { allocatedBytes, copyImageIn, fmt, makeHalfFullQcow2, printComparison, qemuImgReference, sha256File, type CopyFigures } from './source.ts'

const GiB = 1024 ** 3
const MiB = 1024 ** 2
const size = Math.round(Number(process.argv[2] ?? 4) * GiB)
const readAhead = Number(process.argv[3] ?? 4)
const writeDepth = Number(process.argv[4] ?? 2)

function vmHwm(): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8'))
  return m ? Number(m[1]) * 1024 : NaN
}

const t = tempDir('mig-bench-')
try {
  const { path: qcow, dataBytes } = makeHalfFullQcow2(t.dir, size)

  // Each side runs twice (best time kept), in the order ref, ours, ours, ref. Before every run
  // both destinations are removed and the file system synced, so each run starts from the same
  // page-cache state (on this VM, writing into never-touched guest memory while another 2 GiB
  // output sits in the page cache costs up to 2x, whichever tool runs).
  const ref = path.join(t.dir, 'ref.raw')
  const sink = new FileSink({ dataDir: t.dir })
  const ourPath = sink.volumePath('bench', 'disk0')
  let refBest: CopyFigures = { sec: Infinity, sha256: '', allocated: 0 }
  let ourBest: CopyFigures = { sec: Infinity, sha256: '', allocated: 0 }
  let peak = 0
  let res = { bytes_read: 0, bytes_written: 0, bytes_zero: 0 }
  const settle = async () => {
    rmSync(ref, { force: true })
    await sink.remove('bench')
    execFileSync('sync')
    await new Promise((r) => setTimeout(r, 1000))
  }
  const runRef = async () => {
    await settle()
    const r = qemuImgReference(qcow, ref)
    if (process.env.BENCH_VERBOSE) console.log(`qemu-img: ${r.sec.toFixed(2)} s`)
    if (r.sec < refBest.sec) refBest = r
  }
  const runOurs = async () => {
    // Migrator data path: qemu-nbd start, copy (fsync included), close.
    await settle()
    const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20)
    const t0 = performance.now()
    res = await copyImageIn(sink, qcow, 'qcow2', size, {
      readAhead,
      writeDepth,
      flushEveryBytes: process.env.BENCH_FLUSH_MIB ? Number(process.env.BENCH_FLUSH_MIB) * MiB : undefined,
    })
    const sec = (performance.now() - t0) / 1000
    clearInterval(sampler)
    if (process.env.BENCH_VERBOSE) console.log(`ours: ${sec.toFixed(2)} s`)
    if (sec < ourBest.sec) ourBest = { sec, sha256: sha256File(ourPath), allocated: allocatedBytes(ourPath) }
  }
  await runRef()
  await runOurs()
  await runOurs()
  await runRef()
  const hwm = vmHwm()

  printComparison(size, dataBytes, 'openDiskReader+copyDisk', refBest, ourBest, [
    `peak RSS during the copy: ${(peak / MiB).toFixed(0)} MiB (process.memoryUsage().rss sampled every 20 ms); VmHWM of the whole bench process: ${(hwm / MiB).toFixed(0)} MiB`,
    `copy: read ${fmt(res.bytes_read)}, written ${fmt(res.bytes_written)}, zero ${fmt(res.bytes_zero)} bytes; read-ahead ${readAhead}, write depth ${writeDepth}`,
  ])
} finally {
  t.cleanup()
}
