/**
 * The VDI reader by its block map (lib/pipeline/readers/vdi-blocks.ts), against real VDI files
 * written by qemu-img: bytes equal to `qemu-img convert -f vdi -O raw` (dynamic and fixed), only
 * the stored blocks read, the odd size qemu rounds up, a tar member read in place, discarded
 * blocks as zeros, the refusals (a block beyond the end of the file, a truncated image), and the
 * images left to qemu-nbd.
 */
import { describe, expect, test } from 'bun:test'
import { statSync, truncateSync } from 'node:fs'
import * as path from 'node:path'
import { readVdiInfo } from '../../lib/formats/vdi.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { openVdiBlocksReader } from '../../lib/pipeline/readers/vdi-blocks.ts'
import { copyIntoSink, expectTarMemberCopied, scatteredBench, SCATTERED_DATA_BYTES, SCATTERED_SIZE } from '../helpers/scattered-disk.ts'
import { manifestDisk, qemuImageOf, qemuRawOf, sha256File, writeAt } from '../helpers/reader-fixtures.ts'
import { migErrorOf } from '../helpers/mig-error.ts'

const MiB = 1024 * 1024
const SIZE = SCATTERED_SIZE
const DATA_BYTES = SCATTERED_DATA_BYTES
/** 1 MiB blocks the scattered disk's pieces touch (0, 1, 7, 19-20, 33-37, 63). */
const BLOCKS_WITH_DATA = 11

const { tmp, sink, src: scattered } = scatteredBench('mig-vdi-blocks-')

const vdiDisk = (p: string, capacity: number, src: Partial<ManifestDisk['source']> = {}) => manifestDisk('vdi', { path: p, ...src }, capacity)
/** A VDI of `raw` written by qemu-img with `opts`. */
const vdiOf = (raw: string, name: string, opts: string[] = []) => qemuImageOf(raw, path.join(tmp.dir, name), 'vdi', opts)
/** `qemu-img convert -f vdi -O raw` of `src`. */
const qemuRaw = (src: string) => qemuRawOf(src, `${src}.ref.raw`, 'vdi')

/** Writes `value` as a little-endian 32-bit word at `at` of `file` (`big`: 64-bit). */
function patch(file: string, at: number, value: number, big = false): void {
  const b = Buffer.alloc(big ? 8 : 4)
  if (big) b.writeBigUInt64LE(BigInt(value))
  else b.writeUInt32LE(value)
  writeAt(file, at, b)
}

/** Overwrites the block map entry of block `block` of `file` with `entry`. */
async function patchMap(file: string, block: number, entry: number): Promise<void> {
  patch(file, (await readVdiInfo(file)).bmap_offset + block * 4, entry)
}

const copy = (d: ManifestDisk) => copyIntoSink(sink, d)

describe('VDI read by its block map, without qemu-nbd', () => {
  test('dynamic: bit-exact, only the stored blocks read, zeros inside them never written, no qemu node', async () => {
    const img = vdiOf(scattered.raw, 'dyn.vdi')
    expect((await readVdiInfo(img)).blocks_allocated).toBe(BLOCKS_WITH_DATA)
    const out = await copy(vdiDisk(img, SIZE))
    expect(out.qemuNode).toBeUndefined()
    expect(out.size).toBe(SIZE)
    expect(sha256File(out.path)).toBe(scattered.sha)
    expect(out.res.bytes_read).toBeGreaterThanOrEqual(DATA_BYTES)
    expect(out.res.bytes_read).toBeLessThanOrEqual(BLOCKS_WITH_DATA * MiB)
    expect(out.res.bytes_written).toBe(DATA_BYTES)
  })

  test('fixed (static): bit-exact, no qemu node', async () => {
    const img = vdiOf(scattered.raw, 'static.vdi', ['-o', 'static=on'])
    expect((await readVdiInfo(img)).image_type).toBe('fixed')
    const out = await copy(vdiDisk(img, SIZE))
    expect(out.qemuNode).toBeUndefined()
    expect(sha256File(out.path)).toBe(scattered.sha)
    expect(out.res.bytes_written).toBe(DATA_BYTES)
  })

  test('an odd disk size (as VBoxManage convertfromraw writes): rounded up to 512 bytes as qemu presents it, bytes equal to qemu-img convert', async () => {
    const img = vdiOf(scattered.raw, 'odd.vdi')
    patch(img, 0x170, SIZE - 1000, true) // cbDisk
    const ref = qemuRaw(img)
    expect(statSync(ref).size).toBe(SIZE - 512)
    const out = await copy(vdiDisk(img, SIZE - 512))
    expect(out.qemuNode).toBeUndefined()
    expect(out.size).toBe(SIZE - 512)
    expect(sha256File(out.path)).toBe(sha256File(ref))
  })

  test('a VDI inside a tar is read in place at its member offset', async () => {
    await expectTarMemberCopied(sink, vdiOf(scattered.raw, 'disk.vdi'), (src) => vdiDisk(src.path, SIZE, src), scattered.sha)
  })

  test('a discarded block (0xFFFFFFFE) reads as zeros, as qemu reads it', async () => {
    const img = vdiOf(scattered.raw, 'discarded.vdi')
    await patchMap(img, 7, 0xfffffffe) // the block holding the piece at 7 MiB
    const ref = qemuRaw(img)
    expect(sha256File(ref)).not.toBe(scattered.sha)
    const out = await copy(vdiDisk(img, SIZE))
    expect(out.qemuNode).toBeUndefined()
    expect(sha256File(out.path)).toBe(sha256File(ref))
  })
})

describe('VDI block map refusals and the images left to qemu-nbd', () => {
  test('a block beyond the end of the file: E_MIG_DISK_READ_FAILED before any copy, naming the block', async () => {
    const img = vdiOf(scattered.raw, 'beyond.vdi')
    await patchMap(img, 33, 0x7fffffff)
    const err = await migErrorOf(openDiskReader(vdiDisk(img, SIZE)))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain(img)
    expect(err.message).toContain('block 33')
    expect(err.message).toContain('beyond the end of the file')
  })

  test('an image cut short: E_MIG_DISK_READ_FAILED at open', async () => {
    const img = vdiOf(scattered.raw, 'cut.vdi')
    truncateSync(img, Math.floor(statSync(img).size / 2))
    const err = await migErrorOf(openDiskReader(vdiDisk(img, SIZE)))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain(img)
    expect(err.message).toContain('truncated')
  })

  test('an image with a link UUID is left to qemu-nbd (null here), which refuses it', async () => {
    const img = vdiOf(scattered.raw, 'linked.vdi')
    patch(img, 0x1a8, 0x12345678) // first word of the link UUID
    expect(await openVdiBlocksReader(img)).toBeNull()
    const err = await migErrorOf(openDiskReader(vdiDisk(img, SIZE)))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('link UUID')
  })
})
