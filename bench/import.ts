/**
 * Import benchmark (DESIGN.md section 8): the whole migrator against `qemu-img convert`
 * on the same input, in one run.
 *
 * Source: a qcow2 of SIZE GiB (default 4) with half its 64 KiB clusters holding random data.
 * - Reference: `qemu-img convert -f qcow2 -O raw` to a sparse file, then `sync -f`.
 * - Migrator: the real server (Bun) and its job worker: `POST /migrations` with an offline qcow2
 *   plan (`start: false`: define the domain, do not boot it); the copy time is the time between the
 *   job's `CopyingFull` and `Starting` events on the SSE stream (qemu-nbd start, the copy and its
 *   fsyncs). The worker's peak RSS is its VmHWM, sampled from /proc until it exits.
 * Each side runs twice in the order ref, ours, ours, ref, after removing both destinations and
 * syncing; the best time of each is printed with MB/s of virtual size, their ratio,
 * destination allocated bytes and sha256 (must be equal).
 *
 *   ./node_modules/.bin/bun bench/import.ts [sizeGiB] [bun|node]   (the runtime of the server and its worker)
 * Needs root, qemu-utils and libvirt (started here when not running).
 */
import { execFileSync } from 'node:child_process'
import { rmSync } from 'node:fs'
import * as path from 'node:path'
import { offlinePlan, openStream, submit, volumePath, waitJob } from '../test/helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, stopLibvirt } from '../test/helpers/libvirt.ts'
import { startServer } from '../test/helpers/server.ts'
import { tempDir } from '../test/helpers/tmp.ts'
import { allocatedBytes, makeHalfFullQcow2, printComparison, qemuImgReference, sampleWorkerPeakRss, sha256File, type CopyFigures } from './source.ts'

const GiB = 1024 ** 3
const MiB = 1024 ** 2
const size = Math.round(Number(process.argv[2] ?? 4) * GiB)
const runtime = process.argv[3] === 'node' ? 'node' : 'bun'

const t = tempDir('mig-bench-import-')
const importRoot = path.join(t.dir, 'imports')
execFileSync('mkdir', ['-p', importRoot])
execFileSync('chmod', ['755', t.dir])
await ensureLibvirt()
const srv = await startServer(runtime, t.dir, { MIGRATOR_DOMAIN_TYPE: 'qemu' })
try {
  const { dataBytes } = makeHalfFullQcow2(importRoot, size)
  const qcow = path.join(importRoot, 'src.qcow2')
  const ref = path.join(t.dir, 'ref.raw')
  let refBest: CopyFigures = { sec: Infinity, sha256: '', allocated: 0 }
  let ourBest: CopyFigures = { sec: Infinity, sha256: '', allocated: 0 }
  let peakRss = 0
  let lastJob: string | null = null
  let runNo = 0

  const settle = async () => {
    rmSync(ref, { force: true })
    if (lastJob) rmSync(path.join(t.dir, 'volumes', 'migrations', lastJob), { recursive: true, force: true })
    execFileSync('sync')
    await new Promise((r) => setTimeout(r, 1000))
  }
  const runRef = async () => {
    await settle()
    const r = qemuImgReference(qcow, ref)
    if (r.sec < refBest.sec) refBest = r
  }
  const runOurs = async () => {
    await settle()
    const stream = openStream(srv.base)
    await stream.ready
    const job = await submit(srv.base, offlinePlan('qcow2', 'src.qcow2', { name: `migbench-${++runNo}`, start: false }))
    lastJob = job.id
    const rss = sampleWorkerPeakRss(t.dir, job.id)
    const done = await waitJob(srv.base, job.id, undefined, 600_000)
    const hwm = rss.stop()
    stream.close()
    if (done.state !== 'Completed') throw new Error(`job ended ${done.state}: ${JSON.stringify(done.last_error)}`)
    const at = (state: string) => stream.events.find((e) => e.event === 'migration' && e.data.id === job.id && e.data.state === state)
    const t0 = Date.parse(at('CopyingFull')!.data.updated_at)
    const t1 = Date.parse(at('Starting')!.data.updated_at)
    peakRss = Math.max(peakRss, hwm)
    const sec = (t1 - t0) / 1000
    const img = volumePath(t.dir, job.id, done.progress.disks[0].label)
    if (sec < ourBest.sec) ourBest = { sec, sha256: sha256File(img), allocated: allocatedBytes(img) }
  }
  await runRef()
  await runOurs()
  await runOurs()
  await runRef()

  console.log(`server and worker: ${runtime}`)
  printComparison(size, dataBytes, 'migrator job', refBest, ourBest, [`worker peak RSS (VmHWM): ${(peakRss / MiB).toFixed(0)} MiB`])
} finally {
  await srv.stop()
  await cleanupDomains('migbench-')
  await stopLibvirt()
  t.cleanup()
}
