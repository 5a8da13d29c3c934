/**
 * Whole-job benchmark of a live vim_api migration (worker peak RSS of the vim_api
 * reader in a whole job): for each layout (bench/layouts.ts), a VM of govmomi's vCenter simulator
 * (test/vcsim, the named test double of vCenter and ESXi) whose one disk holds the layout, migrated
 * cold (`start: false`) by the real server and worker into the file sink, beside
 * `qemu-img convert -f vmdk -O raw` + `sync` of the same datastore VMDK read locally, in one run:
 *
 *   layout | data MiB | qemu-img MB/s | job MB/s | copy MB/s | worker RSS | served MiB | equal
 *
 * The worker reads the snapshot's disk through the vmdk chain reader over the datastore's HTTPS
 * interface (Range GETs) with CBT on (changeId `*`: the allocated areas only). MB/s are MiB of
 * virtual size per second. "job" is submit to `Completed` as the client sees it; it includes the
 * simulator's own snapshot work (a sparse file copy of the disk and, for CBT, a raw image of it
 * made with qemu-img: harness costs, not ESXi's), so it is not a figure of the migrator;
 * "copy" is the `CopyingFull` phase. Worker peak RSS is its VmHWM sampled from /proc. "served" is
 * what the datastore interface sent (the harness's counter). Bytes are compared with `cmp`
 * against the reference. A fresh simulator runs per layout (its CBT images are removed with it).
 *
 *   ./node_modules/.bin/bun bench/vim-job.ts [--size GiB] [--layouts a,b] [--disk flat|sparse] [--reps N] [--cache DIR|none]
 *   defaults: --size 8 --layouts runs,alternating,long,sparse,ext4 --disk flat --reps 1 --cache /var/tmp/mig-bench-cache
 * `--disk`: the datastore disk as monolithicFlat (how ESXi keeps a disk) or monolithicSparse.
 * Needs root, qemu-utils, libvirt (started when not running), golang and Debian's govmomi sources (the harness is built on first use).
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { chmodSync, mkdirSync, rmSync } from 'node:fs'
import * as path from 'node:path'
import { openStream, submit, volumePath, waitJob } from '../test/helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, stopLibvirt } from '../test/helpers/libvirt.ts'
import { startServer } from '../test/helpers/server.ts'
import { putVmdk, registerVcsim, SMALL_LINUX_VM, startVcsim, type Vcsim } from '../test/helpers/vcsim.ts'
import { cacheDirArg, cachedRawLayout, layoutsArg } from './layouts.ts'
import { cliArg, copyPhaseSeconds, median, onInterrupt, sampleWorkerPeakRss, sawTerminal, span } from './source.ts'

const GiB = 1024 ** 3
const MiB = 1024 ** 2
const size = Math.round(Number(cliArg('size', '8')) * GiB)
const layouts = layoutsArg('runs,alternating,long,sparse,ext4')
const disk = cliArg('disk', 'flat') as 'flat' | 'sparse'
if (disk !== 'flat' && disk !== 'sparse') throw new Error(`--disk ${disk}: flat or sparse`)
const reps = Math.max(1, Number(cliArg('reps', '1')))
const cache = cacheDirArg()
const base = '/var/tmp/mig-bench-vim-job'

rmSync(base, { recursive: true, force: true })
mkdirSync(base, { recursive: true })
chmodSync(base, 0o755)
await ensureLibvirt()
// info level: the supervisor's `worker started` lines name the worker entry (printed at the end)
const srv = await startServer('bun', base, { MIGRATOR_DOMAIN_TYPE: 'qemu', MIGRATOR_LOG_LEVEL: 'info' })
let v: Vcsim | null = null
const cleanup = async () => {
  await srv.stop()
  await v?.stop()
  await cleanupDomains('migbench-')
  await stopLibvirt()
  rmSync(base, { recursive: true, force: true })
}
onInterrupt(cleanup)
const mbs = (sec: number) => size / MiB / sec
let failed = false
let runNo = 0
/** The worker entries the supervisor forked (the bytecode bundle or the .ts module). */
const entries = new Set<string>()

console.log(`disk ${size / GiB} GiB, datastore disk ${disk === 'flat' ? 'monolithicFlat' : 'monolithicSparse'}, ${reps} job(s) per layout, medians [min-max]`)
console.log(
  [
    'layout'.padEnd(12),
    'data MiB'.padStart(9),
    'qemu-img MB/s'.padStart(16),
    'job MB/s'.padStart(16),
    'copy MB/s'.padStart(16),
    'RSS MiB'.padStart(8),
    'served MiB'.padStart(11),
    'equal'.padStart(6),
  ].join(' '),
)
try {
  for (const layout of layouts) {
    const { path: raw, dataBytes } = cachedRawLayout(cache, base, layout, size)
    v = await startVcsim({ cbtPage: 64 * MiB })
    const sourceId = await registerVcsim(srv.base, v, `vcsim-${layout}`)
    const file = await putVmdk(v, `b-${layout}`, `b-${layout}`, raw, disk)
    const ref = path.join(base, 'ref.raw')
    const t0 = performance.now()
    execFileSync('qemu-img', ['convert', '-f', 'vmdk', path.join(v.datastore.dir, file), '-O', 'raw', ref])
    execFileSync('sync', ['-f', ref])
    const refSec = (performance.now() - t0) / 1000
    const jobSec: number[] = []
    const copySec: number[] = []
    let peak = 0
    let served = 0
    let equal = true
    for (let r = 0; r < reps; r++) {
      const name = `migbench-vim-${++runNo}`
      const vmId = await v.createVm({ name, ...SMALL_LINUX_VM, cbt: true, power_on: true, disks: [{ file, capacity_bytes: size }] })
      execFileSync('sync')
      const stream = openStream(srv.base)
      await stream.ready
      const servedBefore = await v.folderBytes()
      const s0 = performance.now()
      const job = await submit(srv.base, {
        source: { Live: 'vim_api' },
        source_ref: { kind: 'live_vm', source_id: sourceId, vm_id: vmId },
        mode: 'Cold',
        name,
        start: false,
      })
      const rss = sampleWorkerPeakRss(base, job.id)
      await sawTerminal(stream.events, job.id, 3_600_000)
      jobSec.push((performance.now() - s0) / 1000)
      peak = Math.max(peak, rss.stop())
      const done = await waitJob(srv.base, job.id, undefined, 60_000)
      stream.close()
      if (done.state !== 'Completed') throw new Error(`${layout}: job ended ${done.state}: ${JSON.stringify(done.last_error)}`)
      served = (await v.folderBytes()) - servedBefore
      copySec.push(copyPhaseSeconds(stream.events, job.id))
      const img = volumePath(base, job.id, done.progress.disks[0].label)
      equal &&= spawnSync('cmp', ['-s', img, ref]).status === 0
      rmSync(path.join(base, 'volumes', 'migrations', job.id), { recursive: true, force: true })
      await cleanupDomains('migbench-')
    }
    if (!equal) failed = true
    console.log(
      [
        layout.padEnd(12),
        (dataBytes / MiB).toFixed(0).padStart(9),
        mbs(refSec).toFixed(0).padStart(16),
        (reps > 1 ? span(jobSec.map(mbs)) : mbs(median(jobSec)).toFixed(0)).padStart(16),
        (reps > 1 ? span(copySec.map(mbs)) : mbs(median(copySec)).toFixed(0)).padStart(16),
        (peak / MiB).toFixed(0).padStart(8),
        (served / MiB).toFixed(0).padStart(11),
        (equal ? 'yes' : 'NO').padStart(6),
      ].join(' '),
    )
    for (const line of srv.stdout().split('\n')) if (line.includes('"worker started"')) entries.add(path.relative(process.cwd(), JSON.parse(line).entry))
    rmSync(ref, { force: true })
    await v.stop()
    v = null
    if (!cache) rmSync(raw, { force: true })
  }
} finally {
  await cleanup()
}
console.log(`\nworker entry: ${[...entries].join(', ')} (npm run build:worker makes the bundle; a stale one falls back to runtime/worker.ts)`)
if (failed) process.exitCode = 1
