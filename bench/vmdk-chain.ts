/**
 * Benchmark of the vim_api snapshot-chain decoder (lib/adapters/vim/vmdk-chain.ts) beside its
 * reference, in one run: `qemu-img convert -f vmdk -O raw` of the same chain.
 *
 * The chain is what a warm pass reads on ESXi: a monolithicFlat base of `GiB` GiB (every other
 * 1 MiB random data), a vmfsSparse delta (512-byte grains) and a seSparse delta (4 KiB grains),
 * each holding one grain in 16 spread over the disk. Ours reads it through {@link RemoteFile}s
 * over local files (positional reads; the datastore HTTP transport is left out) and copies it
 * with the job's copy loop (`copyDisk`, zero detection, fsyncs) into the file sink. Both
 * destinations are compared by sha256.
 *
 * Usage: `bun bench/vmdk-chain.ts [GiB=1] [runs=2]`
 */
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, ftruncateSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync } from 'node:fs'
import { open } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { openVmdkChain, type RemoteFile } from '../lib/adapters/vim/vmdk-chain.ts'
import { copyDisk } from '../lib/pipeline/copy-disk.ts'
import { FileSink } from '../lib/sink/file.ts'
import { deltaDescriptor, makeFlatBase, writeCowd, writeSeSparse, type DeltaGrain } from '../test/helpers/esx-delta.ts'
import { allocatedBytes, fmt, printComparison, qemuImgReference, sha256File, type CopyFigures } from './source.ts'

const MiB = 1024 * 1024
const gib = Number(process.argv[2] ?? 1)
const runs = Number(process.argv[3] ?? 2)
const size = gib * 1024 * MiB
const dir = mkdtempSync(path.join(tmpdir(), 'mig-bench-chain-'))

/** Builds the chain; returns the top descriptor's name and the bytes of data in the deltas. */
function makeChain(): { top: string; deltaBytes: number } {
  const raw = path.join(dir, 'base.raw')
  const fd = openSync(raw, 'w')
  const rnd = randomBytes(MiB)
  for (let o = 0; o < size; o += 2 * MiB) writeSync(fd, rnd, 0, MiB, o)
  ftruncateSync(fd, size)
  closeSync(fd)
  const baseCid = makeFlatBase(dir, raw)
  rmSync(raw)
  const cowd = new Map<number, DeltaGrain>()
  for (let g = 0; g < size / 512; g += 16 * 8) cowd.set(g, randomBytes(512))
  writeCowd(path.join(dir, 'vm-000001-delta.vmdk'), size, 1, cowd)
  writeFileSync(
    path.join(dir, 'vm-000001.vmdk'),
    deltaDescriptor({
      createType: 'vmfsSparse',
      extent: 'vm-000001-delta.vmdk',
      capacityBytes: size,
      cid: 'bbbb0001',
      parentCid: baseCid,
      parentHint: 'vm.vmdk',
    }),
  )
  const se = new Map<number, DeltaGrain>()
  const grain = randomBytes(4096)
  for (let g = 3; g < size / 4096; g += 16) se.set(g, grain)
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
  execFileSync('sh', ['-c', 'cat * > /dev/null'], { cwd: dir })
  return { top: 'vm-000002.vmdk', deltaBytes: cowd.size * 512 + se.size * 4096 }
}

/** The files a run opened, closed after it; the range reads it made (a datastore's requests). */
const opened: { close(): Promise<void> }[] = []
let requests = 0

async function localFile(name: string): Promise<RemoteFile> {
  const fh = await open(path.join(dir, name), 'r')
  opened.push(fh)
  const size = (await fh.stat()).size
  return {
    name,
    size,
    read: async (offset, length) => {
      requests++
      const b = Buffer.allocUnsafe(length)
      const { bytesRead } = await fh.read(b, 0, length, offset)
      if (bytesRead !== length) throw new Error(`${name}: short read`)
      return b
    },
  }
}

const sink = new FileSink({ dataDir: dir })
let peak = 0
let before = 0
let copied = { bytes_read: 0, bytes_written: 0, bytes_zero: 0 }

/** Ours: decode the chain and copy it with the job's copy loop (copyDisk) into the file sink. */
async function ours(top: string): Promise<CopyFigures> {
  await sink.remove('bench')
  execFileSync('sync')
  ;(globalThis as { Bun?: { gc(force: boolean): void } }).Bun?.gc(true) // the fixture's buffers are garbage by now
  before = Math.max(before, process.memoryUsage().rss)
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20)
  requests = 0
  const t0 = performance.now()
  const reader = await openVmdkChain(await localFile(top), localFile, async (hint) => ({ file: await localFile(hint), openSibling: localFile }), {
    label: 'bench',
    capacity: size,
  })
  const vol = await sink.create('bench', 'disk0', reader.size)
  copied = await copyDisk(reader, vol, { from: 0, signal: new AbortController().signal, onProgress() {}, async onWatermark() {} })
  await vol.close()
  await reader.close()
  const sec = (performance.now() - t0) / 1000
  clearInterval(sampler)
  await Promise.all(opened.splice(0).map((f) => f.close()))
  const out = sink.volumePath('bench', 'disk0')
  return { sec, sha256: sha256File(out), allocated: allocatedBytes(out) }
}

try {
  const { top, deltaBytes } = makeChain()
  const best = (a: CopyFigures | null, b: CopyFigures) => (a && a.sec <= b.sec ? a : b)
  let refBest: CopyFigures | null = null
  let ourBest: CopyFigures | null = null
  for (let i = 0; i < runs; i++) {
    const refOut = path.join(dir, 'ref.raw')
    execFileSync('sync')
    refBest = best(refBest, qemuImgReference(path.join(dir, top), refOut, 'vmdk'))
    rmSync(refOut)
    ourBest = best(ourBest, await ours(top))
  }
  printComparison(
    size,
    size / 2,
    'vmdk-chain + copyDisk',
    refBest!,
    ourBest!,
    [
      `best of ${runs} runs each; RSS of the bench process before our copies: ${(before / MiB).toFixed(0)} MiB, peak during them: ${(peak / MiB).toFixed(0)} MiB (sampled every 20 ms)`,
      `copy: read ${fmt(copied.bytes_read)}, written ${fmt(copied.bytes_written)}, zero ${fmt(copied.bytes_zero)} bytes; ${fmt(requests)} range reads of the chain's files`,
    ],
    `monolithicFlat base of ${fmt(size)} bytes (half data) + vmfsSparse (512 B grains) + seSparse (4 KiB grains) deltas holding ${fmt(deltaBytes)} bytes`,
  )
} finally {
  rmSync(dir, { recursive: true, force: true })
}
