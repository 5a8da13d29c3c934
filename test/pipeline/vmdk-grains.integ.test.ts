/**
 * The monolithicSparse VMDK reader by its grain tables (lib/pipeline/readers/vmdk-grains.ts),
 * against real VMDK files written by qemu-img and qemu-io: bytes equal to `qemu-img convert -f
 * vmdk -O raw`, only the stored grains read, zeroed grain table entries, a tar member; the files
 * left to qemu (a text descriptor with its extents, a child of a parent, stream-optimized
 * grains); and the refusals before any copy (a grain or grain table outside the file, a file cut
 * short after open).
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { statSync } from 'node:fs'
import * as path from 'node:path'
import { readVmdkSparseHeader } from '../../lib/formats/vmdk/inspect.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { openSparseVmdkReader } from '../../lib/pipeline/readers/vmdk-grains.ts'
import { migErrorOf } from '../helpers/mig-error.ts'
import { manifestDisk, qemuImageOf, qemuRawOf, sha256File, expectCutShortReadFails, expectZeroedAt7MiB, bytesAt, writeAt } from '../helpers/reader-fixtures.ts'
import { copyIntoSink, expectTarMemberCopied, scatteredBench, SCATTERED_DATA_BYTES, SCATTERED_SIZE } from '../helpers/scattered-disk.ts'

const KiB = 1024
const SIZE = SCATTERED_SIZE

const { tmp, sink, src: scattered } = scatteredBench('mig-vmdk-grains-')

const vmdkDisk = (p: string, src: Partial<ManifestDisk['source']> = {}) => manifestDisk('vmdk', { path: p, ...src }, SIZE)
/** A VMDK of `raw` written by qemu-img (monolithicSparse unless `opts` say otherwise). */
const vmdkOf = (raw: string, name: string, opts: string[] = []) => qemuImageOf(raw, path.join(tmp.dir, name), 'vmdk', opts)
const copy = (d: ManifestDisk) => copyIntoSink(sink, d)

/** Reads (`value` undefined) or overwrites the little-endian 32-bit word at `at` of `file`. */
function wordAt(file: string, at: number, value?: number): number {
  if (value !== undefined) {
    const b = Buffer.alloc(4)
    b.writeUInt32LE(value)
    writeAt(file, at, b)
  }
  return bytesAt(file, at, 4).readUInt32LE()
}

/** File offsets of grain directory entry 0 and of the grain table entry of grain `g` (in table 0) of `img`. */
async function entries(img: string, g: number): Promise<{ gd0: number; gte: number }> {
  const h = await readVmdkSparseHeader(img)
  const gd0 = h.gdOffset! * 512
  return { gd0, gte: wordAt(img, gd0) * 512 + g * 4 }
}

describe('monolithicSparse VMDK read by its grain tables, without qemu-nbd', () => {
  test('bit-exact, only the stored grains read, no qemu node', async () => {
    const img = vmdkOf(scattered.raw, 'mono.vmdk')
    const out = await copy(vmdkDisk(img))
    expect(out.qemuNode).toBeUndefined() // the grain reader (node engine), not qemu-nbd
    expect(sha256File(out.path)).toBe(scattered.sha)
    expect(out.res.bytes_read).toBe(SCATTERED_DATA_BYTES) // qemu stores only the 64 KiB grains holding data
    expect(out.res.bytes_written).toBe(SCATTERED_DATA_BYTES)
  })

  test('zeroed grain table entries (1): zero extents, never read; bytes as qemu-img reads them', async () => {
    const img = vmdkOf(scattered.raw, 'zeroed.vmdk', ['-o', 'zeroed_grain=on'])
    execFileSync('qemu-io', ['-f', 'vmdk', '-c', 'write -z 7M 512k', img])
    expect(wordAt(img, (await entries(img, 112)).gte)).toBe(1)
    await expectZeroedAt7MiB(img, openSparseVmdkReader)
    const out = await copy(vmdkDisk(img))
    expect(out.res.bytes_read).toBe(SCATTERED_DATA_BYTES - 512 * KiB)
    expect(sha256File(out.path)).toBe(sha256File(qemuRawOf(img, path.join(tmp.dir, 'zeroed.raw'), 'vmdk')))
  })

  test('a tar member read in place', async () => {
    await expectTarMemberCopied(sink, vmdkOf(scattered.raw, 'member.vmdk'), (src) => vmdkDisk(src.path, src), scattered.sha)
  })
})

describe('VMDK files left to qemu', () => {
  test('a text descriptor with its extents, a child of a parent, stream-optimized grains: null here', async () => {
    const split = vmdkOf(scattered.raw, 'split.vmdk', ['-o', 'subformat=twoGbMaxExtentSparse'])
    expect(await openSparseVmdkReader(split)).toBeNull()
    const viaQemu = await copy(vmdkDisk(split))
    expect(viaQemu.qemuNode).toBeDefined()
    expect(sha256File(viaQemu.path)).toBe(scattered.sha)
    const child = path.join(tmp.dir, 'child.vmdk')
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-b', vmdkOf(scattered.raw, 'parent.vmdk'), '-F', 'vmdk', child])
    expect(await openSparseVmdkReader(child)).toBeNull()
    expect(await openSparseVmdkReader(vmdkOf(scattered.raw, 'stream.vmdk', ['-o', 'subformat=streamOptimized']))).toBeNull()
    // A header naming deflate (compressAlgorithm 1, byte 77) without the compressed-grains flag:
    // the grain table codec does not read it, so qemu does.
    const odd = vmdkOf(scattered.raw, 'odd.vmdk')
    wordAt(odd, 76, (wordAt(odd, 76) & 0xff) | (1 << 8))
    expect((await readVmdkSparseHeader(odd)).compressAlgorithm).toBe(1)
    expect(await openSparseVmdkReader(odd)).toBeNull()
  })
})

describe('VMDK grain refusals: before any copy, naming the grain or table', () => {
  test('a grain outside the file: E_MIG_DISK_READ_FAILED', async () => {
    const img = vmdkOf(scattered.raw, 'bad-grain.vmdk')
    const { gte } = await entries(img, 112)
    wordAt(img, gte, Math.ceil(statSync(img).size / 512) + 8)
    const err = await migErrorOf(openDiskReader(vmdkDisk(img)))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain(img)
    expect(err.message).toContain('grain 112')
    expect(err.message).toContain('outside the file')
    expect(err.message).toContain('refusing to copy it')
  })

  test('a grain table outside the file: E_MIG_DISK_READ_FAILED', async () => {
    const img = vmdkOf(scattered.raw, 'bad-table.vmdk')
    const { gd0 } = await entries(img, 0)
    wordAt(img, gd0, 0x7fffffff)
    const err = await migErrorOf(openDiskReader(vmdkDisk(img)))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('grain table 0')
    expect(err.message).toContain('outside the file')
  })

  test('a file cut short after it was opened: the read fails, no zeros copied', async () => {
    await expectCutShortReadFails(vmdkOf(scattered.raw, 'shrinks.vmdk'), openSparseVmdkReader)
  })
})
