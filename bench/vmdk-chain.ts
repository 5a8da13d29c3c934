/**
 * Benchmark of the vim_api snapshot-chain reader (lib/adapters/vim/vmdk-chain.ts) fed from local
 * files, beside its reference `qemu-img convert -f vmdk -O raw` + `sync` of the same chain, on
 * each layout of bench/layouts.ts, alternating, in one run.
 *
 * The chain is what a warm pass reads on ESXi: a monolithicFlat base holding the layout's raw
 * image (the descriptor names the cached raw file through a symbolic link: no copy), a
 * vmfsSparse delta (512-byte grains) and a seSparse delta (4 KiB grains) on top. Each delta holds
 * one 64 KiB run of grains per 4 MiB of the disk (1/64 of the disk each, at different offsets),
 * the way a snapshot holds the blocks written since it was taken. Ours opens the chain through
 * {@link RemoteFile}s over local files (positioned reads; the datastore's HTTP transport is left
 * out, so this is the reader and the job's copy loop, not a whole job: a live source cannot be
 * submitted without a vCenter) and copies it with `copyDisk` (zero detection, every checkpoint
 * fsync) into the file sink. Both destinations are compared with `cmp`.
 *
 *   ./node_modules/.bin/bun bench/vmdk-chain.ts [--size GiB] [--layouts a,b] [--reps N] [--cache DIR|none]
 *   defaults: --size 1 --layouts runs,alternating,long,sparse,ext4 --reps 2 --cache /var/tmp/mig-bench-cache
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { open } from 'node:fs/promises'
import * as path from 'node:path'
import { openVmdkChain, type RemoteFile } from '../lib/adapters/vim/vmdk-chain.ts'
import { copyDisk } from '../lib/pipeline/copy-disk.ts'
import { FileSink } from '../lib/sink/file.ts'
import { deltaDescriptor, writeCowd, writeSeSparse, type DeltaGrain } from '../test/helpers/esx-delta.ts'
import { cacheDirArg, cachedRawLayout, layoutsArg } from './layouts.ts'
import { allocatedBytes, alternate, cliArg, median, onInterrupt, span } from './source.ts'

const MiB = 1024 * 1024
const GiB = 1024 * MiB
const size = Math.round(Number(cliArg('size', '1')) * GiB)
const layouts = layoutsArg('runs,alternating,long,sparse,ext4')
const reps = Math.max(1, Number(cliArg('reps', '2')))
const cache = cacheDirArg()
const dir = mkdtempSync('/var/tmp/mig-bench-chain-')
onInterrupt(() => rmSync(dir, { recursive: true, force: true }))

/** Grains of a delta: one 64 KiB run per 4 MiB, starting `at` bytes into each 4 MiB, `grain` bytes each. */
function deltaGrains(grain: number, at: number): Map<number, DeltaGrain> {
  const m = new Map<number, DeltaGrain>()
  const bufs = Array.from({ length: 8 }, () => randomBytes(grain))
  for (let o = at; o + 64 * 1024 <= size; o += 4 * MiB) for (let g = 0; g < (64 * 1024) / grain; g++) m.set(o / grain + g, bufs[g % 8]!)
  return m
}

/** Builds the chain over the raw image `raw` in `dir`; returns the top descriptor's name and the deltas' data bytes. */
function makeChain(raw: string): { top: string; deltaBytes: number } {
  for (const f of ['vm.vmdk', 'vm-flat.vmdk', 'vm-000001.vmdk', 'vm-000001-delta.vmdk', 'vm-000002.vmdk', 'vm-000002-sesparse.vmdk'])
    rmSync(path.join(dir, f), { force: true })
  symlinkSync(raw, path.join(dir, 'vm-flat.vmdk'))
  writeFileSync(
    path.join(dir, 'vm.vmdk'),
    [
      '# Disk DescriptorFile',
      'version=1',
      'CID=aaaa0000',
      'parentCID=ffffffff',
      'createType="monolithicFlat"',
      '',
      `RW ${size / 512} FLAT "vm-flat.vmdk" 0`,
      '',
      'ddb.adapterType = "lsilogic"',
      '',
    ].join('\n'),
  )
  const cowd = deltaGrains(512, MiB)
  writeCowd(path.join(dir, 'vm-000001-delta.vmdk'), size, 1, cowd)
  writeFileSync(
    path.join(dir, 'vm-000001.vmdk'),
    deltaDescriptor({
      createType: 'vmfsSparse',
      extent: 'vm-000001-delta.vmdk',
      capacityBytes: size,
      cid: 'bbbb0001',
      parentCid: 'aaaa0000',
      parentHint: 'vm.vmdk',
    }),
  )
  const se = deltaGrains(4096, 3 * MiB)
  writeSeSparse(path.join(dir, 'vm-000002-sesparse.vmdk'), size, se)
  writeFileSync(
    path.join(dir, 'vm-000002.vmdk'),
    deltaDescriptor({
      createType: 'seSparse',
      extent: 'vm-000002-sesparse.vmdk',
      capacityBytes: size,
      cid: 'bbbb0002',
      parentCid: 'bbbb0001',
      parentHint: 'vm-000001.vmdk',
    }),
  )
  return { top: 'vm-000002.vmdk', deltaBytes: cowd.size * 512 + se.size * 4096 }
}

/** The files a run opened, closed after it. */
const opened: { close(): Promise<void> }[] = []

async function localFile(name: string): Promise<RemoteFile> {
  const fh = await open(path.join(dir, name), 'r')
  opened.push(fh)
  const fileSize = (await fh.stat()).size
  return {
    name,
    size: fileSize,
    read: async (offset, length, into) => {
      const b = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
      const { bytesRead } = await fh.read(b, 0, length, offset)
      if (bytesRead !== length) throw new Error(`${name}: short read`)
      return b
    },
  }
}

const sink = new FileSink({ dataDir: dir })
const ref = path.join(dir, 'ref.raw')
const ours = sink.volumePath('bench', 'disk0')
const mbs = (sec: number) => size / MiB / sec
let failed = false

try {
  console.log(`disk ${size / GiB} GiB; ${reps} repetitions per side, alternating; medians [min-max]; MB/s are MiB of virtual size per second`)
  console.log(
    [
      'layout'.padEnd(12),
      'data MiB'.padStart(9),
      'qemu-img MB/s'.padStart(18),
      'chain+copy MB/s'.padStart(18),
      'ratio'.padStart(16),
      'alloc ref / ours (MiB)'.padStart(24),
      'RSS before / peak'.padStart(18),
      'equal'.padStart(6),
    ].join(' '),
  )
  for (const layout of layouts) {
    const { path: raw, dataBytes } = cachedRawLayout(cache, dir, layout, size)
    const { top, deltaBytes } = makeChain(raw)
    const refSec: number[] = []
    const ourSec: number[] = []
    let peak = 0
    let before = 0
    const runRef = async () => {
      rmSync(ref, { force: true })
      execFileSync('sync')
      const t0 = performance.now()
      execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'raw', path.join(dir, top), ref])
      execFileSync('sync', ['-f', ref])
      refSec.push((performance.now() - t0) / 1000)
    }
    const runOurs = async () => {
      await sink.remove('bench')
      execFileSync('sync')
      ;(globalThis as { Bun?: { gc(force: boolean): void } }).Bun?.gc(true) // the fixture's buffers are garbage by now
      before = Math.max(before, process.memoryUsage().rss)
      const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20)
      const t0 = performance.now()
      const reader = await openVmdkChain(await localFile(top), localFile, async (hint) => ({ file: await localFile(hint), openSibling: localFile }), {
        label: 'bench',
        capacity: size,
      })
      const vol = await sink.create('bench', 'disk0', reader.size)
      await copyDisk(reader, vol, { from: 0, signal: new AbortController().signal, onProgress() {}, async onWatermark() {} })
      await vol.close()
      await reader.close()
      ourSec.push((performance.now() - t0) / 1000)
      clearInterval(sampler)
      await Promise.all(opened.splice(0).map((f) => f.close()))
    }
    await alternate(reps, runRef, runOurs)
    const equal = spawnSync('cmp', ['-s', ours, ref]).status === 0
    if (!equal) failed = true
    const ratio = ourSec.map((s, i) => refSec[i]! / s)
    console.log(
      [
        layout.padEnd(12),
        ((dataBytes + deltaBytes) / MiB).toFixed(0).padStart(9),
        span(refSec.map(mbs)).padStart(18),
        span(ourSec.map(mbs)).padStart(18),
        `${(median(refSec) / median(ourSec)).toFixed(2)} [${Math.min(...ratio).toFixed(2)}-${Math.max(...ratio).toFixed(2)}]`.padStart(16),
        `${(allocatedBytes(ref) / MiB).toFixed(0)} / ${(allocatedBytes(ours) / MiB).toFixed(0)}`.padStart(24),
        `${(before / MiB).toFixed(0)} / ${(peak / MiB).toFixed(0)}`.padStart(18),
        (equal ? 'yes' : 'NO').padStart(6),
      ].join(' '),
    )
    rmSync(ref, { force: true })
    await sink.remove('bench')
    if (!cache) rmSync(raw, { force: true })
  }
  console.log(
    `data MiB: the base's data plus the deltas' grains; RSS (MiB): the bench process's resident set before our copies (after a GC) and its peak during them (sampled every 20 ms); the difference is what the reader and the copy hold`,
  )
} finally {
  rmSync(dir, { recursive: true, force: true })
}
if (failed) process.exitCode = 1
