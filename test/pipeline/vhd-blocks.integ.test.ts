/**
 * The dynamic VHD reader by its BAT (lib/pipeline/readers/vhd-blocks.ts), against real VHD files
 * written by qemu-img (`vpc`): bytes equal to `qemu-img convert -f vpc -O raw`, only the file's
 * data read, the CHS-rounded size qemu presents, a tar member read in place, and the refusals
 * (a block over the footer copy or beyond the end of the file). Fixed disks stay with qemu-nbd.
 */
import { describe, expect, test } from 'bun:test'
import { statSync, truncateSync } from 'node:fs'
import * as path from 'node:path'
import { readVhdInfo } from '../../lib/formats/vhd.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { openVhdBlocksReader } from '../../lib/pipeline/readers/vhd-blocks.ts'
import { copyIntoSink, expectTarMemberCopied, scatteredBench, SCATTERED_DATA_BYTES, SCATTERED_SIZE } from '../helpers/scattered-disk.ts'
import { manifestDisk, qemuImageOf, qemuRawOf, sha256File, writeAt } from '../helpers/reader-fixtures.ts'
import { migErrorOf } from '../helpers/mig-error.ts'

const KiB = 1024
const SIZE = SCATTERED_SIZE
const DATA_BYTES = SCATTERED_DATA_BYTES

const { tmp, sink, src: scattered } = scatteredBench('mig-vhd-blocks-')

const vhdDisk = (p: string, capacity: number, src: Partial<ManifestDisk['source']> = {}) =>
  manifestDisk('vpc', { path: p, ...src }, capacity, { label: 'disk vhd' })
/** A VHD of `raw` written by qemu-img with `opts`. */
const vhdOf = (raw: string, name: string, opts: string[] = []) => qemuImageOf(raw, path.join(tmp.dir, name), 'vpc', opts)
/** `qemu-img convert -f vpc -O raw` of `src`. */
const qemuRaw = (src: string) => qemuRawOf(src, `${src}.ref.raw`, 'vpc')

const copy = (d: ManifestDisk) => copyIntoSink(sink, d)

/** Overwrites the BAT entry of block `block` of `file` with the sector number `sector`. */
async function patchBat(file: string, block: number, sector: number): Promise<void> {
  const info = await readVhdInfo(file)
  const b = Buffer.alloc(4)
  b.writeUInt32BE(sector)
  writeAt(file, info.bat_offset! + block * 4, b)
}

describe('dynamic VHD read by its BAT, without qemu-nbd', () => {
  test("exact size (force_size): bit-exact, only the file's data read, no qemu node", async () => {
    const img = vhdOf(scattered.raw, 'exact.vhd', ['-o', 'force_size=on'])
    const out = await copy(vhdDisk(img, SIZE))
    expect(out.qemuNode).toBeUndefined()
    expect(out.size).toBe(SIZE)
    expect(sha256File(out.path)).toBe(scattered.sha)
    // qemu writes a new block's bitmap and data sectors only: the rest of the block is a hole.
    // Holes are whole 4 KiB file-system blocks and a block's data starts 512 bytes into one
    // (after its bitmap): at most 4 KiB more per allocated block (8 here) is read, not 16 MiB.
    expect(out.res.bytes_read).toBeGreaterThanOrEqual(DATA_BYTES)
    expect(out.res.bytes_read).toBeLessThanOrEqual(DATA_BYTES + 8 * 4 * KiB)
    expect(out.res.bytes_written).toBe(DATA_BYTES)
  })

  test("CHS geometry size (qemu creator): the size qemu presents, bytes equal to qemu-img's", async () => {
    const img = vhdOf(scattered.raw, 'chs.vhd')
    const info = await readVhdInfo(img)
    expect(info.virtual_size).not.toBe(SIZE) // rounded to the CHS geometry
    const ref = qemuRaw(img)
    const out = await copy(vhdDisk(img, statSync(ref).size))
    expect(out.qemuNode).toBeUndefined()
    expect(out.size).toBe(statSync(ref).size)
    expect(sha256File(out.path)).toBe(sha256File(ref))
  })

  test('a VHD inside a tar is read in place at its member offset', async () => {
    await expectTarMemberCopied(sink, vhdOf(scattered.raw, 'disk.vhd', ['-o', 'force_size=on']), (src) => vhdDisk(src.path, SIZE, src), scattered.sha)
  })

  test('a fixed VHD is left to qemu-nbd (null here)', async () => {
    const img = vhdOf(scattered.raw, 'fixed.vhd', ['-o', 'subformat=fixed,force_size=on'])
    expect(await openVhdBlocksReader(img)).toBeNull()
    const out = await copy(vhdDisk(img, SIZE))
    expect(out.qemuNode).toBeDefined()
    expect(sha256File(out.path)).toBe(scattered.sha)
  })
})

describe('VHD BAT refusals: before any copy, naming the block', () => {
  for (const [name, sector, words] of [
    ['a block over the footer copy', 0, 'footer copy'],
    ['a block beyond the end of the file', 0x7fffffff, 'beyond the end of the file'],
  ] as const) {
    test(`${name}: E_MIG_DISK_READ_FAILED`, async () => {
      const img = vhdOf(scattered.raw, `bad-${sector}.vhd`, ['-o', 'force_size=on'])
      await patchBat(img, 16, sector)
      const err = await migErrorOf(openDiskReader(vhdDisk(img, SIZE)))
      expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
      expect(err.message).toContain(img)
      expect(err.message).toContain('block 16')
      expect(err.message).toContain(words)
    })
  }

  test('an image cut short: refused at open, as qemu refuses it', async () => {
    const img = vhdOf(scattered.raw, 'cut.vhd', ['-o', 'force_size=on'])
    truncateSync(img, Math.floor(statSync(img).size / 2))
    const err = await migErrorOf(openDiskReader(vhdDisk(img, SIZE)))
    expect(['E_MIG_DISK_READ_FAILED', 'E_MIG_MALFORMED_ARCHIVE']).toContain(err.code)
    expect(err.message).toContain(img)
  })
})
