/**
 * zvol sink block-device benchmark: the copy into the zvol sink's block device against
 * `qemu-img convert -n` into the same kind of block device. A loop device over a sparse file
 * stands in for the zvol; `zfs` is a named TEST DOUBLE (a shell script that links the dataset's
 * `/dev/zvol/...` path to the loop device), since ZFS cannot run here.
 *
 * - Reference: `qemu-img convert -n -f qcow2 -O raw <src> /dev/loopN` + `sync`.
 * - Migrator: `ZvolSink.create` (through the double) + `openDiskReader` (the qcow2 by its
 *   clusters) + `copyDisk`
 *   (its fsyncs included) + close, in process: the copy phase of a job.
 * Before every run the device is discarded (`blkdiscard`, so it reads as zeros and its backing
 * file is sparse again) and the file system synced; the order alternates. Prints medians
 * [min-max] of MB/s (virtual size), and whether `qemu-img compare` finds the device equal to
 * the source after each side.
 *
 *   ./node_modules/.bin/bun bench/zvol.ts [--size GiB] [--layouts runs,...] [--reps 3] [--dir DIR] [--cache DIR|none] [--page-cache-mib N] [--qemu-processes N]
 * `--page-cache-mib`: the sink's page-cache budget before it writes `O_DIRECT` (default the
 * sink's, `PAGE_CACHE_BYTES`), to compare the two write paths on the same device.
 * `--qemu-processes`: qemu-img processes the copy runs at once (default the engine's into a
 * block device, `QEMU_IMG_PROCESSES`), to compare with one at a time.
 * One line per layout; the raw layout images come from the same cache as bench/data-path.ts's
 * (default /var/tmp/mig-bench-cache; `--cache none` builds them in DIR and deletes them).
 * Needs root (losetup), qemu-utils.
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { mkdirSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { QEMU_IMG_PROCESSES } from '../lib/pipeline/copy-engine-qemu-img.ts'
import { ZvolSink } from '../lib/sink/zvol.ts'
import { cacheDirArg, cachedRawLayout, layoutsArg } from './layouts.ts'
import { alternate, cliArg, copyImageIn, median, onInterrupt } from './source.ts'

const GiB = 1024 ** 3
const MiB = 1024 ** 2
const arg = cliArg
const size = Math.round(Number(arg('size', '2')) * GiB)
const layouts = layoutsArg('runs')
const cache = cacheDirArg()
const pageCacheMib = arg('page-cache-mib', '')
const pageCacheBytes = pageCacheMib === '' ? undefined : Number(pageCacheMib) * MiB
const reps = Math.max(1, Number(arg('reps', '3')))
const qemuProcessesArg = arg('qemu-processes', '')
const qemuProcesses = qemuProcessesArg === '' ? undefined : Number(qemuProcessesArg)
const dir = arg('dir', '/var/tmp/mig-bench-zvol')

rmSync(dir, { recursive: true, force: true })
mkdirSync(dir, { recursive: true })
let loop = ''
const cleanup = () => {
  if (loop) spawnSync('losetup', ['-d', loop])
  rmSync(dir, { recursive: true, force: true })
}
onInterrupt(cleanup)
try {
  const backing = path.join(dir, 'zvol-backing.img')
  execFileSync('truncate', ['-s', String(size), backing])
  loop = execFileSync('losetup', ['-f', '--show', backing], { encoding: 'utf8' }).trim()
  const devRoot = path.join(dir, 'dev', 'zvol')
  const zfsDouble = path.join(dir, 'zfs-test-double')
  // zfs TEST DOUBLE: `create ... <dataset>` links the dataset's device path to the loop device.
  writeFileSync(
    zfsDouble,
    `#!/bin/sh\nfor last in "$@"; do :; done\ncase "$1" in\n  create) mkdir -p "${devRoot}/$(dirname "$last")" && ln -sfn ${loop} "${devRoot}/$last";;\n  destroy) rm -rf "${devRoot}/$last";;\nesac\n`,
    { mode: 0o755 },
  )
  const sink = new ZvolSink({ pool: 'tank', appliance: 'migrator', zfsPath: zfsDouble, devPrefix: devRoot, pageCacheBytes })

  const src = path.join(dir, 'src.qcow2')
  const reset = async () => {
    await sink.remove('bench')
    execFileSync('blkdiscard', ['-f', loop], { stdio: 'ignore' }) // -f: a layout's file system signature left by the run before must not stop it
    execFileSync('sync')
    await new Promise((r) => setTimeout(r, 500))
  }
  const same = () => spawnSync('qemu-img', ['compare', '-q', '-f', 'qcow2', '-F', 'raw', src, loop]).status === 0
  const mbs = (s: number) => (size / MiB / s).toFixed(0)
  const fmt = (xs: number[]) => `${mbs(median(xs))} [${mbs(Math.max(...xs))}-${mbs(Math.min(...xs))}]`
  console.log(
    `zvol block-device path (a loop device standing in for the zvol, zfs TEST DOUBLE), ${size / GiB} GiB, ${reps} repetitions alternating, medians [min-max], page-cache budget ${pageCacheMib === '' ? 'default' : `${pageCacheMib} MiB`}, qemu-img processes at once ${qemuProcesses ?? `default (${QEMU_IMG_PROCESSES})`}`,
  )
  for (const layout of layouts) {
    const { path: raw, dataBytes } = cachedRawLayout(cache, dir, layout, size)
    rmSync(src, { force: true })
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, src])
    if (!cache) rmSync(raw)
    const refSec: number[] = []
    const ourSec: number[] = []
    let equal = true
    const runRef = async () => {
      await reset()
      const t0 = performance.now()
      execFileSync('qemu-img', ['convert', '-n', '-f', 'qcow2', '-O', 'raw', src, loop])
      execFileSync('sync')
      refSec.push((performance.now() - t0) / 1000)
      equal &&= same()
    }
    const runOurs = async () => {
      await reset()
      const t0 = performance.now()
      await copyImageIn(sink, src, 'qcow2', size, { qemuProcesses })
      ourSec.push((performance.now() - t0) / 1000)
      equal &&= same()
    }
    await alternate(reps, runRef, runOurs)
    console.log(`${layout}: ${(dataBytes / MiB).toFixed(0)} MiB of data`)
    console.log(
      `  qemu-img convert -n into the device + sync ${fmt(refSec)} MB/s, zvol sink ${fmt(ourSec)} MB/s, ratio of medians ${(median(refSec) / median(ourSec)).toFixed(2)}, device equal to the source after every run (qemu-img compare): ${equal ? 'yes' : 'NO'}`,
    )
    if (!equal) process.exitCode = 1
    rmSync(src)
  }
} finally {
  cleanup()
}
