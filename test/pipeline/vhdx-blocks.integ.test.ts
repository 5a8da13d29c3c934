/**
 * The VHDX reader by its BAT (lib/pipeline/readers/vhdx-blocks.ts), against real VHDX files
 * written by qemu-img: bytes equal to `qemu-img convert -f vhdx -O raw`, only the file's data
 * read (present blocks' holes skipped), BAT entries past a sector bitmap entry, a member of a
 * tar, blocks stored out of order, and the refusals (undefined and differencing states, blocks in
 * the header section or beyond the end of the file, a file cut short after open). Also the
 * file hole map it uses (lib/pipeline/readers/file-holes.ts).
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, openSync, readSync, statSync, truncateSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { batEntryAt, batIndexOfBlock, readVhdxInfo } from '../../lib/formats/vhdx.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { FileHoleMap, MAX_RESTARTS } from '../../lib/pipeline/readers/file-holes.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { openVhdxBlocksReader } from '../../lib/pipeline/readers/vhdx-blocks.ts'
import { copyIntoSink, scatteredBench, SCATTERED_DATA_BYTES, SCATTERED_SIZE } from '../helpers/scattered-disk.ts'
import { manifestDisk, qemuImageOf, sha256File, tarredImage, collectExtents, expectCutShortReadFails, writeAt } from '../helpers/reader-fixtures.ts'
import { setVhdxLogGuid } from '../helpers/vhdx-log.ts'
import { migErrorOf } from '../helpers/mig-error.ts'

const KiB = 1024
const MiB = 1024 * 1024
const SIZE = SCATTERED_SIZE
const DATA_BYTES = SCATTERED_DATA_BYTES

const { tmp, sink, src: scattered } = scatteredBench('mig-vhdx-blocks-')

const vhdxDisk = (p: string, capacity = SIZE, src: Partial<ManifestDisk['source']> = {}) => manifestDisk('vhdx', { path: p, ...src }, capacity)
/** A VHDX of `raw` written by qemu-img with `opts`. */
const vhdxOf = (raw: string, name: string, opts: string[] = []) => qemuImageOf(raw, path.join(tmp.dir, name), 'vhdx', opts)

const copy = (d: ManifestDisk) => copyIntoSink(sink, d)

/** Overwrites the 8-byte BAT entry of payload block `block` of `file` with `entry`. */
async function patchBat(file: string, block: number, entry: bigint): Promise<void> {
  const info = await readVhdxInfo(file)
  const b = Buffer.alloc(8)
  b.writeBigUInt64LE(entry)
  writeAt(file, info.bat_offset + batIndexOfBlock(block, info.chunk_ratio) * 8, b)
}

/** The BAT entry of payload block `block` of `file`. */
async function batEntry(file: string, block: number): Promise<{ state: number; fileOffset: number }> {
  const info = await readVhdxInfo(file)
  const b = Buffer.alloc(8)
  const fd = openSync(file, 'r')
  readSync(fd, b, 0, 8, info.bat_offset + batIndexOfBlock(block, info.chunk_ratio) * 8)
  closeSync(fd)
  return batEntryAt(b, 0)
}

describe('VHDX read by its BAT, without qemu-nbd', () => {
  for (const bs of ['1M', '8M', '32M']) {
    test(`block size ${bs}: bit-exact, only the file's data read, no qemu node`, async () => {
      const img = vhdxOf(scattered.raw, `bs${bs}.vhdx`, ['-o', `block_size=${bs}`])
      const out = await copy(vhdxDisk(img))
      expect(out.qemuNode).toBeUndefined() // the BAT reader (node engine), not qemu-nbd
      expect(sha256File(out.path)).toBe(scattered.sha)
      // qemu writes only the data sectors of a block: the rest are holes, never read.
      expect(out.res.bytes_read).toBe(DATA_BYTES)
      expect(out.res.bytes_written).toBe(DATA_BYTES)
      expect(statSync(out.path).blocks * 512).toBeLessThanOrEqual(DATA_BYTES * 1.05)
    })
  }

  test('a fixed VHDX (every block present) and a tar member read in place', async () => {
    const img = vhdxOf(scattered.raw, 'fixed.vhdx', ['-o', 'subformat=fixed'])
    const fixed = await copy(vhdxDisk(img))
    expect(sha256File(fixed.path)).toBe(scattered.sha)
    const src = await tarredImage(vhdxOf(scattered.raw, 'disk.vhdx', ['-o', 'block_size=2M']))
    const member = await copy(vhdxDisk(src.path, SIZE, src))
    expect(sha256File(member.path)).toBe(scattered.sha)
    // tar stores the member's holes as zeros: the 8 present 2 MiB blocks are read whole, and
    // only their data written.
    expect(member.res.bytes_read).toBe(8 * 2 * MiB)
    expect(member.res.bytes_written).toBe(DATA_BYTES)
  })

  test('blocks after a sector bitmap entry (256 MiB blocks, 16 per chunk, 5 GiB): extents and bytes where qemu-img has them', async () => {
    const size = 5 * 1024 * MiB
    const raw = path.join(tmp.dir, 'big.raw')
    const pieces: Array<[number, number, Buffer]> = [
      [3 * MiB, 64 * KiB],
      [15 * 256 * MiB + 5 * MiB, 128 * KiB],
      [16 * 256 * MiB + MiB, 64 * KiB], // block 16: BAT index 17, after the first sector bitmap entry
      [size - 64 * KiB, 64 * KiB],
    ].map(([o, l]) => [o!, l!, randomBytes(l!)])
    const fd = openSync(raw, 'w')
    for (const [o, l, b] of pieces) writeSync(fd, b, 0, l, o)
    closeSync(fd)
    truncateSync(raw, size)
    const img = vhdxOf(raw, 'big.vhdx', ['-o', 'block_size=256M'])
    const info = await readVhdxInfo(img)
    expect(info.chunk_ratio).toBe(16)
    const reader = (await openVhdxBlocksReader(img))!
    try {
      expect(reader.size).toBe(size)
      const data = (await collectExtents(reader.extents(0))).filter((x) => !x.zero)
      expect(data.map((x) => [x.offset, x.length])).toEqual(pieces.map(([o, l]) => [o, l]))
      for (const [o, l, b] of pieces) expect((await reader.read(o, l)).equals(b)).toBe(true)
      // A read across blocks 15 and 16 (the sector bitmap entry between them in the BAT).
      const across = await reader.read(16 * 256 * MiB - MiB, 3 * MiB)
      const want = Buffer.alloc(3 * MiB)
      pieces[2]![2].copy(want, 2 * MiB)
      expect(across.equals(want)).toBe(true)
      // From the middle: extents start there.
      const tail = await collectExtents(reader.extents(16 * 256 * MiB + MiB + 32 * KiB))
      expect(tail[0]).toEqual({ offset: 16 * 256 * MiB + MiB + 32 * KiB, length: 32 * KiB, zero: false })
    } finally {
      await reader.close()
    }
  })

  test('blocks stored out of order in the file: bit-exact, the hole map restarts behind its position', async () => {
    const img = vhdxOf(scattered.raw, 'swapped.vhdx', ['-o', 'block_size=1M'])
    // Swap the file offsets of blocks 0 and 7 (both present) and their bytes: same virtual disk.
    const a = await batEntry(img, 0)
    const b = await batEntry(img, 7)
    expect([a.state, b.state]).toEqual([6, 6])
    const fd = openSync(img, 'r+')
    const ba = Buffer.alloc(MiB)
    const bb = Buffer.alloc(MiB)
    readSync(fd, ba, 0, MiB, a.fileOffset)
    readSync(fd, bb, 0, MiB, b.fileOffset)
    writeSync(fd, bb, 0, MiB, a.fileOffset)
    writeSync(fd, ba, 0, MiB, b.fileOffset)
    closeSync(fd)
    await patchBat(img, 0, (BigInt(b.fileOffset / MiB) * (1n << 20n)) | 6n)
    await patchBat(img, 7, (BigInt(a.fileOffset / MiB) * (1n << 20n)) | 6n)
    expect(b.fileOffset).toBeGreaterThan(a.fileOffset)
    const ref = path.join(tmp.dir, 'swapped.raw')
    execFileSync('qemu-img', ['convert', '-f', 'vhdx', '-O', 'raw', img, ref])
    expect(sha256File(ref)).toBe(scattered.sha)
    const out = await copy(vhdxDisk(img))
    expect(sha256File(out.path)).toBe(scattered.sha)
  })

  test('a VHDX whose header names a log is left to qemu (null here; qemu-nbd replays or refuses a log)', async () => {
    const img = vhdxOf(scattered.raw, 'dirty-log.vhdx', ['-o', 'block_size=1M'])
    setVhdxLogGuid(img)
    expect(await openVhdxBlocksReader(img)).toBeNull()
    // This LogGuid has no log entries behind it: qemu finds nothing to replay and reads the disk.
    const out = await copy(vhdxDisk(img))
    expect(out.qemuNode).toBeDefined()
    expect(sha256File(out.path)).toBe(scattered.sha)
  })
})

describe('VHDX BAT refusals: before any copy, naming the block', () => {
  const cases: Array<[string, (img: string, off: number) => bigint, string]> = [
    ['an undefined state (4)', (_img, off) => (BigInt(off / MiB) * (1n << 20n)) | 4n, 'does not define'],
    ['PARTIALLY_PRESENT without a parent', (_img, off) => (BigInt(off / MiB) * (1n << 20n)) | 7n, 'differencing'],
    ['a block inside the header section', () => 6n, 'header section'],
    ['a block beyond the end of the file', () => (1n << 40n) | 6n, 'beyond the end of the file'],
  ]
  for (const [name, entry, words] of cases) {
    test(`${name}: E_MIG_DISK_READ_FAILED`, async () => {
      const img = vhdxOf(scattered.raw, `bad-${name.replace(/\W+/g, '_')}.vhdx`, ['-o', 'block_size=1M'])
      const { fileOffset } = await batEntry(img, 33)
      await patchBat(img, 33, entry(img, fileOffset))
      const err = await migErrorOf(openDiskReader(vhdxDisk(img)))
      expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
      expect(err.message).toContain(img)
      expect(err.message).toContain('block 33')
      expect(err.message).toContain(words)
    })
  }

  test('a file cut short after it was opened: the read fails, no zeros copied', async () => {
    await expectCutShortReadFails(vhdxOf(scattered.raw, 'shrinks.vhdx', ['-o', 'block_size=1M']), openVhdxBlocksReader)
  })
})

describe('file hole map', () => {
  test('pieces in order, behind the position (a restart), and everything data after too many restarts', async () => {
    const node = { driver: 'raw', file: { driver: 'file', filename: scattered.raw } }
    const map = new FileHoleMap({ node, size: SIZE, label: 'scattered.raw' })
    try {
      const s = async (o: number, l: number) => (await collectExtents(map.split(o, l))).map((x) => [x.offset, x.length, x.zero])
      expect(await s(0, 2 * MiB)).toEqual([
        [0, 64 * KiB, false],
        [64 * KiB, MiB, true],
        [MiB + 64 * KiB, 192 * KiB, false],
        [MiB + 256 * KiB, 768 * KiB, true],
      ])
      expect(await s(7 * MiB - KiB, 2 * KiB)).toEqual([
        [7 * MiB - KiB, KiB, true],
        [7 * MiB, KiB, false],
      ])
      expect(map.restartCount).toBe(0)
      expect(await s(0, 128 * KiB)).toEqual([
        [0, 64 * KiB, false],
        [64 * KiB, 64 * KiB, true],
      ])
      expect(map.restartCount).toBe(1)
      for (let i = 0; i < MAX_RESTARTS; i++) {
        await s(MiB, KiB)
        await s(0, KiB)
      }
      expect(map.restartCount).toBeGreaterThan(MAX_RESTARTS)
      expect(await s(64 * KiB, KiB)).toEqual([[64 * KiB, KiB, false]]) // given up: data, read and zero-checked
    } finally {
      await map.close()
    }
  })
})
