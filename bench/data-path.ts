/**
 * Data-path benchmark: for each layout (bench/layouts.ts) and reader kind, the whole
 * migrator job against `qemu-img convert -O raw` + `sync` of the same input, alternating, in one
 * run, and one table per layout:
 *
 *   kind | qemu-img MB/s | job MB/s | copy MB/s | ratio (job/qemu-img) | allocated ref/ours (KiB, exact) | worker RSS | bytes equal
 *
 * MB/s are MiB of virtual size per second; figures are medians over the repetitions with
 * [min-max]. "job" is `POST /migrations` (offline plan, `start: false`) to `Completed` as the
 * client sees it (inspection, the reader's open, the copy with every checkpoint fsync, the domain
 * definition); "copy" is the `CopyingFull` phase (from its event to the next state's). Worker
 * peak RSS is its VmHWM sampled from /proc. Before every timed run both destinations are removed
 * and the file system synced, so each side writes into the memory the previous run's output
 * just freed (on tmpfs a side that found the other's output still there would pay the host's
 * cost of fresh pages); the order alternates (ref first on odd repetitions, the job first on
 * even ones). The byte and allocation comparison is made after the repetitions, against one
 * more, untimed run of the side whose output the last timed run removed.
 *
 * After each layout's table, where each kind's fixed costs go (medians, ms): submit to the
 * worker's fork or to the hand-over to the warm spare worker (supervisor log `worker started`),
 * process start, module evaluation, the configuration over IPC (these three are 0 for a spare:
 * done before the job existed), the spare's receipt of its job, store and job wiring, inspection, pre-copy checks and volumes, the
 * `CopyingFull` write, the wait for the reader's open (qemu-nbd, a BAT check, a packed digest;
 * it starts before the pre-copy checks), then after the copy the
 * domain definition, the `Completed` write and the client's receipt of it (the worker's `job
 * timings` log line, runtime/worker.ts); `fixed` is the whole job minus the copy. The server runs
 * at log level info for these lines. The worker entry the supervisor used is printed at the end.
 *
 * Reader kinds: `qcow2` by its clusters, `vmdk` (monolithicSparse) by its grain tables; `vdi`
 * (VirtualBox folder) by its block map; `vhdx`, `vhd` (dynamic VHD, qemu `vpc`, read by the vhdx importer) by their BAT; `ova` (a streamOptimized VMDK read in place as a tar member); `flat` (a VMX folder
 * with a monolithicFlat VMDK: a raw file); `xva` (XVA 1 MiB blocks, each checked by the reader
 * against its XXH64 `.xxhash` companion, as xapi writes them today); `xva-sha1` (the same with
 * SHA-1 `.checksum` companions, as older xapi wrote them). The qemu-img reference reads the same
 * bytes in place (for `ova` the member through the raw driver's offset/size, for the XVA kinds
 * the raw disk the archive was built from: qemu-img cannot read an XVA). For the XVA kinds the
 * archive's extraction (`tar -xf` into a directory + `sync`, timed right after the qemu-img
 * reference in each repetition) is printed under the table with the job's ratio to it: what a
 * tool that converts the extracted blocks (xva-img) pays before it starts.
 *
 *   ./node_modules/.bin/bun bench/data-path.ts [--size GiB] [--layouts a,b] [--kinds a,b] [--reps N] [--warmup N] [--min-seconds S] [--max-reps M] [--dirs DIR,DIR] [--cache DIR|none]
 *   defaults: --size 8 --layouts runs,alternating,long,sparse,ext4 --kinds qcow2 --reps 3 --warmup 0 --min-seconds 0 --dirs /var/tmp/mig-bench-data-path --cache /var/tmp/mig-bench-cache
 * `--dirs`: the directories benched one after another, each with its own tables (inputs, both
 * destinations and the server's data in it): `--dirs /dev/shm/mig-bench,/var/tmp/mig-bench`
 * compares on tmpfs (storage out of the comparison) and on disk in one run; `--dir` is one.
 * The `cpu s` column is the CPU seconds (user + system) of `qemu-img convert` + `sync` and of the
 * job's worker (its threads and the children it waited for; a spare's loading before its job not
 * counted), medians.
 * `--warmup N`: N repetitions of each kind (both sides, alternating as the others) run before the
 * measured ones and left out of every column: on this virtual machine a side's first write into
 * memory it has not touched lately can take several times longer, so without a warm-up one side
 * of a kind may get that cost and the other not.
 * `--min-seconds S`: past `--reps`, a kind is repeated (at most `--max-reps` times, default 12)
 * until its repetitions took S seconds of wall time, both sides and the settling between runs
 * together: on a layout whose runs take a fraction of a second (`sparse`), one slow run no longer
 * decides a median. The `reps` column says how many each row got.
 * The raw layout images are kept in the cache directory (`<layout>-<bytes>.raw`) and reused by
 * later runs (the 8 GiB ext4 layout takes about 10 minutes to build here); `--cache none` builds
 * them in DIR and deletes them.
 * Needs root, qemu-utils, libvirt (started when not running), e2fsprogs; space for the source,
 * the reference and the job's copy (inputs are deleted at the end).
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput } from '../test/helpers/inputs.ts'
import { offlinePlan, openStream, submit, volumePath, waitJob } from '../test/helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, stopLibvirt } from '../test/helpers/libvirt.ts'
import { type RunningServer, startServer } from '../test/helpers/server.ts'
import { cacheDirArg, cachedRawLayout, layoutsArg } from './layouts.ts'
import { allocatedBytes, alternate, childCpuSeconds, cliArg, copyPhaseSeconds, median, onInterrupt, sampleWorkerPeakRss, sawTerminal, span } from './source.ts'

const GiB = 1024 ** 3
const MiB = 1024 ** 2
const arg = cliArg
const size = Math.round(Number(arg('size', '8')) * GiB)
const layouts = layoutsArg('runs,alternating,long,sparse,ext4')
const kinds = arg('kinds', 'qcow2').split(',')
const reps = Math.max(1, Number(arg('reps', '3')))
const warmup = Math.max(0, Number(arg('warmup', '0')))
const minSeconds = Math.max(0, Number(arg('min-seconds', '0')))
const maxReps = Math.max(reps, Number(arg('max-reps', '12')))
// One table per directory and layout: a tmpfs directory takes the storage out of the comparison.
const dirs = arg('dirs', arg('dir', '/var/tmp/mig-bench-data-path')).split(',')
// Raw layout images are kept here between runs (an 8 GiB ext4 layout takes minutes to build);
// `--cache none` builds them afresh and deletes them.
const cache = cacheDirArg()

/**
 * One reader kind: how to build its input from a raw image, the plan, and the reference command;
 * `archive`: a tar archive whose extraction (`tar -xf` + `sync`) is timed too (the XVA kinds).
 */
interface Kind {
  build(root: string, raw: string): { plan: Record<string, unknown>; refArgs: string[]; archive?: string }
}

const qemuKind = (kind: string, fmt: string): Kind => ({
  build(root, raw) {
    const b = buildInput(kind, root, `k${kind}`, [raw])
    const rel = path.relative(root, b.path)
    return { plan: offlinePlan(kind, rel), refArgs: ['-f', fmt, b.path] }
  },
})

/**
 * An XVA archive `name` of the layout with `xvaChecksum` companions; the reference reads the raw
 * disk (qemu-img cannot read an XVA), and the archive's extraction is timed as the floor of the
 * tools that convert an XVA after unpacking it (xva-img works on the extracted `Ref:N` directory).
 */
const xvaKind = (name: string, xvaChecksum: 'xxh64' | 'sha1'): Kind => ({
  build(root, raw) {
    const b = buildInput('xva_archive', root, name, [raw], { xvaChecksum })
    return { plan: offlinePlan('xva_archive', path.relative(root, b.path)), refArgs: ['-f', 'raw', raw], archive: b.path }
  },
})

const KINDS: Record<string, Kind> = {
  qcow2: qemuKind('qcow2', 'qcow2'),
  vmdk: qemuKind('vmdk', 'vmdk'),
  vhdx: qemuKind('vhdx', 'vhdx'),
  vhd: {
    build(root, raw) {
      // a dynamic VHD of exactly the raw size (force_size: no CHS rounding), read by the vhdx importer
      const file = path.join(root, 'kvhd.vhd')
      execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vpc', '-o', 'subformat=dynamic,force_size=on', raw, file])
      return { plan: offlinePlan('vhdx', 'kvhd.vhd'), refArgs: ['-f', 'vpc', file] }
    },
  },
  vdi: {
    build(root, raw) {
      const b = buildInput('vbox_folder', root, 'kvdi', [raw])
      return { plan: offlinePlan('vbox_folder', path.relative(root, b.path)), refArgs: ['-f', 'vdi', path.join(b.path, 'kvdi-0.vdi')] }
    },
  },
  ova: {
    build(root, raw) {
      const b = buildInput('ova_archive', root, 'kova', [raw])
      const offset = tarMemberOffset(b.path, 'kova-disk1.vmdk')
      const spec = { driver: 'vmdk', file: { driver: 'raw', offset: offset.offset, size: offset.size, file: { driver: 'file', filename: b.path } } }
      return { plan: offlinePlan('ova_archive', path.relative(root, b.path)), refArgs: [`json:${JSON.stringify(spec)}`] }
    },
  },
  flat: {
    build(root, raw) {
      const dir = path.join(root, 'kflat')
      mkdirSync(dir, { recursive: true })
      execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, path.join(dir, 'kflat.vmdk')])
      writeFileSync(
        path.join(dir, 'kflat.vmx'),
        [
          '.encoding = "UTF-8"',
          'config.version = "8"',
          'virtualHW.version = "13"',
          'displayName = "kflat"',
          'guestOS = "debian10-64"',
          'memSize = "512"',
          'numvcpus = "1"',
          'scsi0.present = "TRUE"',
          'scsi0.virtualDev = "pvscsi"',
          'scsi0:0.present = "TRUE"',
          'scsi0:0.fileName = "kflat.vmdk"',
          'scsi0:0.deviceType = "scsi-hardDisk"',
        ].join('\n') + '\n',
      )
      return { plan: offlinePlan('vmx_folder', 'kflat'), refArgs: ['-f', 'raw', path.join(dir, 'kflat-flat.vmdk')] }
    },
  },
  xva: xvaKind('kxva', 'xxh64'),
  'xva-sha1': xvaKind('kxvasha1', 'sha1'),
}
for (const k of kinds) if (!KINDS[k]) throw new Error(`unknown kind ${k}`)

/** Data offset and size of tar member `name` (ustar headers, 512-byte blocks). */
function tarMemberOffset(tar: string, name: string): { offset: number; size: number } {
  const fd = openSync(tar, 'r')
  const h = Buffer.alloc(512)
  let at = 0
  try {
    for (;;) {
      if (readSync(fd, h, 0, 512, at) < 512 || h[0] === 0) throw new Error(`${tar}: no member ${name}`)
      const n = h.subarray(0, 100).toString('latin1').replace(/\0.*$/s, '')
      const sz = parseInt(h.subarray(124, 136).toString('latin1').replace(/\0.*$/s, '').trim(), 8)
      if (n === name) return { offset: at + 512, size: sz }
      at += 512 + Math.ceil(sz / 512) * 512
    }
  } finally {
    closeSync(fd)
  }
}

/** The worker entries the supervisor forked (the bytecode bundle or the .ts module), printed at the end. */
const entries = new Set<string>()

/**
 * Where the fixed costs of one job go, ms, from the client's submit time, the supervisor's
 * `worker started` log line (`forked_at`), the worker's `job timings` line (epoch-ms marks, see
 * runtime/worker.ts) and the time the client saw the terminal event. `copy` is the copy itself
 * (reader open to copy end); `fixed` is everything else.
 */
async function breakdownOf(srv: RunningServer, jobId: string, submittedAt: number, seenAt: number): Promise<Record<string, number>> {
  let forked = Number.NaN
  let spare = false
  let marks: Record<string, number> | null = null
  let cpu = Number.NaN
  for (let tries = 0; tries < 100 && !marks; tries++) {
    for (const line of srv.stdout().split('\n')) {
      if (!line.includes(jobId)) continue
      try {
        const o = JSON.parse(line)
        if (o.job !== jobId) continue
        if (o.msg === 'worker started') {
          forked = o.forked_at
          spare = o.spare === true
          entries.add(path.relative(process.cwd(), o.entry))
        }
        if (o.msg === 'job timings') {
          marks = Object.fromEntries(o.timings as Array<[string, number]>)
          if (o.cpu) cpu = o.cpu.user + o.cpu.system
        }
      } catch {}
    }
    if (!marks) await new Promise((r) => setTimeout(r, 50))
  }
  if (!marks) throw new Error(`no job timings line for ${jobId} in the server log`)
  const m = marks
  const at = (k: string) => m[k] ?? Number.NaN
  // A warm spare worker started, loaded and took its configuration before the job existed: those
  // phases cost the job nothing; `assign` is the supervisor's hand-over to the worker's receipt.
  const out: Record<string, number> = {
    pickup: forked - submittedAt,
    spawn: spare ? 0 : at('process') - forked,
    load: spare ? 0 : at('loaded') - at('process'),
    config: spare ? 0 : at('config') - at('loaded'),
    assign: spare ? at('assigned') - forked : 0,
    deps: at('deps') - (spare ? at('assigned') : at('config')),
    inspect: at('inspected') - at('deps'),
    volumes: at('volumes') - at('inspected'),
    state: at('copying') - at('volumes'),
    reader: at('reader') - at('copying'),
    copy: at('copied') - at('reader'),
    define: at('started') - at('copied'),
    complete: at('completed') - at('started'),
    seen: seenAt - at('completed'),
  }
  out.fixed = seenAt - submittedAt - out.copy!
  // the worker's CPU seconds for the job (its threads and waited-for children), not a phase
  out.cpu = cpu
  return out
}

const PHASES = ['pickup', 'spawn', 'load', 'config', 'assign', 'deps', 'inspect', 'volumes', 'state', 'reader', 'define', 'complete', 'seen', 'fixed', 'copy']

/** Prints the fixed-cost breakdown (medians over the repetitions, ms) of every kind of a layout. */
function printBreakdown(rows: Array<[string, Record<string, number>[]]>): void {
  console.log(
    `  fixed costs, ms (medians): submit -> worker fork or spare hand-over (pickup), -> process start (spawn), -> modules evaluated (load), -> configuration (config),`,
  )
  console.log(`  -> a spare's receipt of its job (assign; spawn, load and config are 0 for a spare: done before the job existed),`)
  console.log(
    `  -> store/job wiring (deps), -> inspection (inspect), -> pre-copy checks + volumes (volumes), -> CopyingFull written (state), -> the wait for the reader opened since inspection (reader),`,
  )
  console.log(`  copy end -> domain defined (define), -> Completed written (complete), -> client sees it (seen); fixed = whole job - copy`)
  console.log(['  kind'.padEnd(8), ...PHASES.map((p) => p.padStart(9))].join(''))
  for (const [kind, bs] of rows)
    console.log(
      [
        '  ' + kind.padEnd(6),
        ...PHASES.map((p) =>
          median(bs.map((b) => b[p]!))
            .toFixed(0)
            .padStart(9),
        ),
      ].join(''),
    )
}

const mbs = (sec: number) => size / MiB / sec

/** The file system type of `dir` as `stat -f` names it (`tmpfs`, `ext2/ext3`, `overlayfs`...). */
const fsType = (dir: string) => execFileSync('stat', ['-f', '-c', '%T', dir], { encoding: 'utf8' }).trim()

const cpus = execFileSync('nproc', { encoding: 'utf8' }).trim()
const mem = Math.round(Number(/MemTotal:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))![1]) / 1024 / 1024)
console.log(
  `machine: ${cpus} cores, ${mem} GiB RAM, shared; disk ${size / GiB} GiB; ${reps} repetitions per side${warmup > 0 ? ` after ${warmup} left out (warm-up)` : ''}${minSeconds > 0 ? ` (more, at most ${maxReps}, until a kind's repetitions took ${minSeconds} s)` : ''}, alternating; medians [min-max]`,
)
console.log("cpu s: CPU seconds (user + system) of qemu-img and of the job's worker (its threads and waited-for children), medians")
let runNo = 0
let failed = false
/** The cleanup of the directory being benched (its server and files), for an interrupt. */
let cleanupDir: (() => Promise<void>) | null = null
onInterrupt(async () => {
  await cleanupDir?.()
  await stopLibvirt()
})
await ensureLibvirt()
try {
  for (const base of dirs) await benchDir(base)
} finally {
  await cleanupDomains('migbench-')
  await stopLibvirt()
}
console.log(`\nworker entry: ${[...entries].join(', ')} (npm run build:worker makes the bundle; a stale one falls back to runtime/worker.ts)`)
if (failed) process.exitCode = 1

/** Every layout and kind with the destinations, the inputs and the server's data in `base`. */
async function benchDir(base: string): Promise<void> {
  rmSync(base, { recursive: true, force: true })
  mkdirSync(base, { recursive: true })
  execFileSync('chmod', ['755', base])
  const importRoot = path.join(base, 'imports')
  mkdirSync(importRoot)
  // info level: the supervisor's `worker started` and the worker's `job timings` lines feed the breakdown
  const srv = await startServer('bun', base, { MIGRATOR_DOMAIN_TYPE: 'qemu', MIGRATOR_LOG_LEVEL: 'info' })
  const cleanup = async () => {
    await srv.stop()
    await cleanupDomains('migbench-')
    rmSync(base, { recursive: true, force: true })
  }
  cleanupDir = cleanup
  console.log(`\n== storage: ${base} (${fsType(base)})`)
  try {
    for (const layout of layouts) {
      const { path: raw, dataBytes } = cachedRawLayout(cache, base, layout, size)
      console.log(`\nlayout ${layout}: ${(dataBytes / MiB).toFixed(0)} MiB of data in ${size / GiB} GiB`)
      console.log(
        [
          'kind'.padEnd(6),
          'qemu-img MB/s'.padStart(18),
          'job MB/s'.padStart(18),
          'copy MB/s'.padStart(18),
          'ratio'.padStart(16),
          'cpu s ref/job'.padStart(14),
          'alloc ref / ours (KiB)'.padStart(24),
          'RSS MiB'.padStart(8),
          'equal'.padStart(8),
          'reps'.padStart(5),
        ].join(' '),
      )
      const fixedRows: Array<[string, Record<string, number>[]]> = []
      for (const kind of kinds) {
        const { plan, refArgs, archive } = KINDS[kind]!.build(importRoot, raw)
        execFileSync('sync')
        const ref = path.join(base, 'ref.raw')
        const extracted = path.join(base, 'extracted')
        const extractSec: number[] = []
        const refSec: number[] = []
        const refCpu: number[] = []
        const jobSec: number[] = []
        const copySec: number[] = []
        const breakdowns: Record<string, number>[] = []
        let peak = 0
        let lastJob: { id: string; label: string } | null = null
        // Before each timed run both destinations are removed; `keep` spares the other side's
        // output for the untimed run that makes the comparison's pair.
        const settle = async (keep?: 'ref' | 'ours') => {
          if (keep !== 'ref') rmSync(ref, { force: true })
          if (lastJob && keep !== 'ours') rmSync(path.join(base, 'volumes', 'migrations', lastJob.id), { recursive: true, force: true })
          await cleanupDomains('migbench-')
          execFileSync('sync')
          await new Promise((r) => setTimeout(r, 500))
        }
        const runRef = async (timed = true) => {
          await settle(timed ? undefined : 'ours')
          const t0 = performance.now()
          const cpu0 = childCpuSeconds()
          execFileSync('qemu-img', ['convert', ...refArgs, '-O', 'raw', ref])
          execFileSync('sync', ['-f', ref])
          if (!timed) return
          refSec.push((performance.now() - t0) / 1000)
          refCpu.push(childCpuSeconds() - cpu0)
          if (!archive) return
          rmSync(extracted, { recursive: true, force: true })
          mkdirSync(extracted)
          execFileSync('sync')
          await new Promise((r) => setTimeout(r, 500))
          const t1 = performance.now()
          execFileSync('tar', ['-xf', archive, '-C', extracted])
          execFileSync('sync', ['-f', extracted])
          extractSec.push((performance.now() - t1) / 1000)
          rmSync(extracted, { recursive: true, force: true })
        }
        const runOurs = async (timed = true) => {
          await settle(timed ? undefined : 'ref')
          const stream = openStream(srv.base)
          await stream.ready
          const t0 = performance.now()
          const submittedAt = Date.now()
          const job = await submit(srv.base, { ...plan, name: `migbench-${++runNo}`, start: false })
          const rss = sampleWorkerPeakRss(base, job.id)
          // the end is the terminal state's SSE event as the client receives it (no poll interval)
          await sawTerminal(stream.events, job.id, 1_800_000)
          const sec = (performance.now() - t0) / 1000
          const seenAt = Date.now()
          const hwm = rss.stop()
          const done = await waitJob(srv.base, job.id, undefined, 60_000)
          stream.close()
          if (done.state !== 'Completed') throw new Error(`${kind}/${layout}: job ended ${done.state}: ${JSON.stringify(done.last_error)}`)
          lastJob = { id: job.id, label: done.progress.disks[0].label }
          if (!timed) return
          copySec.push(copyPhaseSeconds(stream.events, job.id))
          jobSec.push(sec)
          peak = Math.max(peak, hwm)
          breakdowns.push(await breakdownOf(srv, job.id, submittedAt, seenAt))
        }
        if (warmup > 0) {
          await alternate(warmup, runRef, runOurs)
          for (const xs of [refSec, refCpu, jobSec, copySec, extractSec, breakdowns]) xs.length = 0
          peak = 0
        }
        const repsDone = await alternate(reps, runRef, runOurs, undefined, { minSeconds, maxReps })
        // The last timed run's output is there; the other side runs once more, untimed, for the pair.
        if (existsSync(ref)) await runOurs(false)
        else await runRef(false)
        const img = volumePath(base, lastJob!.id, lastJob!.label)
        // Byte equality by `cmp` (sha256sum of two 8 GiB files costs minutes on this shared machine;
        // equal bytes mean equal sha256).
        const equal = spawnSync('cmp', ['-s', img, ref]).status === 0
        if (!equal) failed = true
        const ratio = jobSec.map((s, i) => refSec[i]! / s)
        // allocation exact (st_blocks, KiB), "over" when ours is more than qemu-img's
        const refAlloc = allocatedBytes(ref)
        const imgAlloc = allocatedBytes(img)
        console.log(
          [
            kind.padEnd(6),
            span(refSec.map(mbs)).padStart(18),
            span(jobSec.map(mbs)).padStart(18),
            span(copySec.map(mbs)).padStart(18),
            `${median(refSec) / median(jobSec) > 0 ? (median(refSec) / median(jobSec)).toFixed(2) : '-'} [${Math.min(...ratio).toFixed(2)}-${Math.max(...ratio).toFixed(2)}]`.padStart(
              16,
            ),
            `${median(refCpu).toFixed(2)} / ${median(breakdowns.map((b) => b.cpu!)).toFixed(2)}`.padStart(14),
            `${refAlloc / 1024} / ${imgAlloc / 1024}${imgAlloc > refAlloc ? ' over' : ''}`.padStart(24),
            (peak / MiB).toFixed(0).padStart(8),
            (equal ? 'yes' : 'NO').padStart(8),
            String(repsDone).padStart(5),
          ].join(' '),
        )
        // Each repetition's figures, in order: a slow run that always falls in the same place of
        // the order (the job right after the previous job, or first after a kind's build) shows here.
        const each = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(' / ')
        console.log(
          `  ${kind} by repetition (qemu-img first in the 1st, 3rd, ..., the job first in the 2nd, 4th, ...): qemu-img ${each(refSec.map(mbs))} MB/s, ` +
            `job ${each(jobSec.map(mbs))} MB/s, job cpu s ${breakdowns.map((b) => b.cpu!.toFixed(2)).join(' / ')}`,
        )
        if (extractSec.length > 0) {
          const vsExtract = jobSec.map((s, i) => extractSec[i]! / s)
          console.log(
            `  ${kind}: the archive's extraction alone (tar -xf + sync, before an extract-first tool such as xva-img converts) ${span(extractSec.map(mbs))} MB/s; job / extraction ${(median(extractSec) / median(jobSec)).toFixed(2)} [${Math.min(...vsExtract).toFixed(2)}-${Math.max(...vsExtract).toFixed(2)}]`,
          )
        }
        fixedRows.push([kind, breakdowns])
        await settle()
        rmSync(path.join(base, 'volumes', 'migrations'), { recursive: true, force: true })
        for (const f of execFileSync('ls', ['-A', importRoot], { encoding: 'utf8' }).split('\n').filter(Boolean))
          rmSync(path.join(importRoot, f), { recursive: true, force: true })
      }
      printBreakdown(fixedRows)
      if (!cache) rmSync(raw, { force: true })
    }
  } finally {
    await cleanup()
  }
}
