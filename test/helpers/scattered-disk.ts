/**
 * The reader tests' source disk: 64 MiB of zeros with random data in six 64 KiB-aligned pieces
 * (inside a block, across 1, 2 and 4 MiB boundaries, at both ends), written as a sparse raw file,
 * the set-up each reader test file makes of it, and the copy of a manifest disk into a fresh
 * file-sink volume as a job does it.
 */
import { afterAll, beforeAll, expect } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { closeSync, openSync, truncateSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import type { ManifestDisk } from '../../lib/manifest.ts'
import type { CopyDiskResult } from '../../lib/pipeline/copy-common.ts'
import { copyDisk } from '../../lib/pipeline/copy-disk.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { FileSink } from '../../lib/sink/file.ts'
import { sha256File, tarredImage } from './reader-fixtures.ts'
import { tempDir } from './tmp.ts'

const KiB = 1024
const MiB = 1024 * 1024
/** Virtual size of the scattered disk, bytes. */
export const SCATTERED_SIZE = 64 * MiB
/** Its data pieces, [offset, length] in bytes. */
export const SCATTERED_PIECES: ReadonlyArray<readonly [number, number]> = [
  [0, 64 * KiB],
  [MiB + 64 * KiB, 192 * KiB],
  [7 * MiB, MiB],
  [20 * MiB - 64 * KiB, 128 * KiB],
  [33 * MiB, 4 * MiB + 64 * KiB],
  [SCATTERED_SIZE - 64 * KiB, 64 * KiB],
]
/** Bytes of data in the pieces. */
export const SCATTERED_DATA_BYTES = SCATTERED_PIECES.reduce((a, [, l]) => a + l, 0)

/**
 * Writes the scattered disk to `file`, sparse; returns `file`. Its data is fresh random bytes, or
 * with `fill: 'hex'` fresh random bytes spelled in hex digits (text that deflate halves).
 */
export function writeScatteredRaw(file: string, fill: 'random' | 'hex' = 'random'): string {
  const fd = openSync(file, 'w')
  for (const [o, l] of SCATTERED_PIECES) writeSync(fd, fill === 'hex' ? Buffer.from(randomBytes(l / 2).toString('hex')) : randomBytes(l), 0, l, o)
  closeSync(fd)
  truncateSync(file, SCATTERED_SIZE)
  return file
}

/**
 * A reader test file's set-up: a temporary directory named `prefix...` (removed after the file),
 * a file sink under its `var/`, and the scattered disk written to its `src.raw` (with `fill`, see
 * writeScatteredRaw) before the first test, with its SHA-256 (lower-case hex). `src` is filled in
 * by that `beforeAll`: read it inside tests only.
 */
export function scatteredBench(
  prefix: string,
  fill: 'random' | 'hex' = 'random',
): { tmp: ReturnType<typeof tempDir>; sink: FileSink; src: { raw: string; sha: string } } {
  const tmp = tempDir(prefix)
  const src = { raw: '', sha: '' }
  afterAll(() => tmp.cleanup())
  beforeAll(() => {
    src.raw = writeScatteredRaw(path.join(tmp.dir, 'src.raw'), fill)
    src.sha = sha256File(src.raw)
  })
  return { tmp, sink: new FileSink({ dataDir: path.join(tmp.dir, 'var') }), src }
}

let job = 0
/**
 * `openDiskReader(disk)` + `copyDisk` (from 0, `engine`, default `auto`) into a new volume of
 * `sink` under a fresh job id; both closed. Returns the volume's path, the copy's byte counts,
 * the reader's size and whether it offered a qemu node.
 */
export async function copyIntoSink(
  sink: FileSink,
  disk: ManifestDisk,
  engine: 'auto' | 'node' = 'auto',
): Promise<{ path: string; res: CopyDiskResult; size: number; qemuNode: unknown }> {
  const reader = await openDiskReader(disk)
  const vol = await sink.create(`job${job++}`, disk.label, reader.size)
  try {
    const res = await copyDisk(reader, vol, { from: 0, signal: new AbortController().signal, engine, onProgress() {}, async onWatermark() {} })
    return { path: vol.path, res, size: reader.size, qemuNode: reader.qemuNode }
  } finally {
    await vol.close()
    await reader.close()
  }
}

/**
 * Packs `img` (an image of the scattered disk) alone into a tar, copies the manifest disk
 * `diskOf(source)` that reads it in place at its member offset into a new volume of `sink`, and
 * checks that the copy needed no qemu node and that the volume's SHA-256 is `sha` (the scattered
 * disk's). Returns the copy.
 */
export async function expectTarMemberCopied(
  sink: FileSink,
  img: string,
  diskOf: (source: ManifestDisk['source']) => ManifestDisk,
  sha: string,
): Promise<Awaited<ReturnType<typeof copyIntoSink>>> {
  const out = await copyIntoSink(sink, diskOf(await tarredImage(img)))
  expect(out.qemuNode).toBeUndefined()
  expect(sha256File(out.path)).toBe(sha)
  return out
}
