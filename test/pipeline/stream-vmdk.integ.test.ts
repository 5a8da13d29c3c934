/**
 * The stream-optimized VMDK reader (lib/pipeline/readers/stream-vmdk.ts), against real files
 * written by qemu-img and VirtualBox: bytes equal to `qemu-img convert -f vmdk -O raw`, only the
 * stored grains read, a tar member (an OVA's disk) read in place, zeroed grain entries as zeros,
 * the same bytes under Node; and the refusals, each naming the grain: a truncated file, a grain
 * table entry outside the file, a marker naming another grain, an oversized compressed size,
 * damaged deflate data, a grain inflating past its size (a deflate bomb). Files that are no
 * stream-optimized extent, and those whose data barely compresses, are left to qemu. The data is
 * text (random bytes in hex digits) unless a test says otherwise.
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { statSync, truncateSync } from 'node:fs'
import * as path from 'node:path'
import { deflateSync } from 'node:zlib'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { openStreamVmdkReader } from '../../lib/pipeline/readers/stream-vmdk.ts'
import { copyIntoSink, expectTarMemberCopied, scatteredBench, SCATTERED_DATA_BYTES, SCATTERED_SIZE, writeScatteredRaw } from '../helpers/scattered-disk.ts'
import { manifestDisk, qemuImageOf, qemuRawOf, sha256File, bytesAt, writeAt } from '../helpers/reader-fixtures.ts'
import { migErrorOf } from '../helpers/mig-error.ts'
import { ensureNodeBuild } from '../helpers/server.ts'
import { CORPUS, REPO } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const GRAIN = 64 * 1024
const SIZE = SCATTERED_SIZE

const { tmp, sink, src: scattered } = scatteredBench('mig-stream-vmdk-', 'hex')

const vmdkDisk = (p: string, capacity = SIZE, src: Partial<ManifestDisk['source']> = {}) => manifestDisk('vmdk', { path: p, ...src }, capacity)
/** A stream-optimized VMDK of `raw` written by qemu-img. */
const streamOf = (raw: string, name: string) => qemuImageOf(raw, path.join(tmp.dir, name), 'vmdk', ['-o', 'subformat=streamOptimized'])
const copy = (d: ManifestDisk) => copyIntoSink(sink, d)

/**
 * Where the grain table entries of a qemu-written stream-optimized file lie (VMDK 5.0: header
 * byte 56 is `gdOffset`, which qemu writes in the first header, not as `GD_AT_END`; directory
 * and table entries are 32-bit sectors): `entryAt(g)` is the file offset of grain `g`'s table
 * entry, `markerAt(g)` the file offset of its grain marker (throws when the grain is not stored).
 */
function grainTables(file: string): { entryAt(g: number): number; markerAt(g: number): number } {
  const gd = Number(bytesAt(file, 56, 8).readBigUInt64LE(0)) * 512
  const entryAt = (g: number) => bytesAt(file, gd + Math.floor(g / 512) * 4, 4).readUInt32LE(0) * 512 + (g % 512) * 4
  const markerAt = (g: number) => {
    const at = bytesAt(file, entryAt(g), 4).readUInt32LE(0) * 512
    if (at === 0) throw new Error(`grain ${g} is not stored in ${file}`)
    return at
  }
  return { entryAt, markerAt }
}

describe('stream-optimized VMDK read by its grain tables, inflated on threads', () => {
  test('bit-exact with qemu-img, only the stored grains read, zeros never written, no qemu node', async () => {
    const img = streamOf(scattered.raw, 'so.vmdk')
    expect(sha256File(qemuRawOf(img, `${img}.ref.raw`, 'vmdk'))).toBe(scattered.sha)
    const out = await copy(vmdkDisk(img))
    expect(out.qemuNode).toBeUndefined()
    expect(out.size).toBe(SIZE)
    expect(sha256File(out.path)).toBe(scattered.sha)
    // The scattered pieces are whole 64 KiB grains: exactly their bytes are read and written.
    expect(out.res.bytes_read).toBe(SCATTERED_DATA_BYTES)
    expect(out.res.bytes_written).toBe(SCATTERED_DATA_BYTES)
  })

  test('reads at any offset and length, also across grains and into no buffer of the caller', async () => {
    const img = streamOf(scattered.raw, 'odd.vmdk')
    const r = (await openStreamVmdkReader(img))!
    try {
      const raw = bytesAt(scattered.raw, 0, SIZE)
      for (const [o, n] of [
        [MiB + 64 * 1024 + 1000, 300_000],
        [7 * MiB - 10, 20],
        [SIZE - 5, 5],
        [0, 1],
      ] as const) {
        expect((await r.read(o, n)).equals(raw.subarray(o, o + n))).toBe(true)
      }
    } finally {
      await r.close()
    }
  })

  test('an OVA member read in place at its offset', async () => {
    await expectTarMemberCopied(sink, streamOf(scattered.raw, 'vm-disk1.vmdk'), (src) => vmdkDisk(src.path, SIZE, src), scattered.sha)
  })

  test('a zeroed grain entry (1, flag bit 2 set) reads as zeros, as qemu reads it', async () => {
    const img = streamOf(scattered.raw, 'zeroed.vmdk')
    writeAt(img, 8, Buffer.from([bytesAt(img, 8, 1)[0]! | 4])) // flags, first byte
    const t = grainTables(img)
    const b = Buffer.alloc(4)
    b.writeUInt32LE(1)
    writeAt(img, t.entryAt((7 * MiB) / GRAIN), b) // the first grain of the piece at 7 MiB
    const ref = qemuRawOf(img, `${img}.ref.raw`, 'vmdk')
    expect(sha256File(ref)).not.toBe(scattered.sha)
    const out = await copy(vmdkDisk(img))
    expect(out.qemuNode).toBeUndefined()
    expect(sha256File(out.path)).toBe(sha256File(ref))
  })

  test('VirtualBox-written stream-optimized vmdk (corpus, 4 MiB): bytes equal to qemu-img', async () => {
    const src = path.join(CORPUS, 'vagrant-mutate/virtualbox-box-disk1.vmdk')
    const out = await copy(vmdkDisk(src, 4 * MiB))
    expect(out.qemuNode).toBeUndefined()
    expect(sha256File(out.path)).toBe(sha256File(qemuRawOf(src, path.join(tmp.dir, 'vbox.ref.raw'), 'vmdk')))
  })

  test('under Node (compiled output): the same bytes', async () => {
    await ensureNodeBuild()
    const img = streamOf(scattered.raw, 'node.vmdk')
    const script = `
      const { openStreamVmdkReader } = require(${JSON.stringify(path.join(REPO, 'dist/lib/pipeline/readers/stream-vmdk.js'))})
      openStreamVmdkReader(${JSON.stringify(img)}).then(async (r) => {
        const b = Buffer.from(new SharedArrayBuffer(${SIZE}))
        for (let o = 0; o < ${SIZE}; o += ${4 * MiB}) await r.read(o, ${4 * MiB}, b.subarray(o))
        await r.close()
        console.log(require('node:crypto').createHash('sha256').update(b).digest('hex'))
        process.exit(0)
      })
    `
    expect(execFileSync('node', ['-e', script], { encoding: 'utf8', timeout: 60_000 }).trim()).toBe(scattered.sha)
  })
})

describe('stream-optimized VMDK refusals, and the files left to qemu', () => {
  /** The message of the copy of `img` (open or read), which must fail with E_MIG_DISK_READ_FAILED naming `img`. */
  async function refusal(img: string): Promise<string> {
    const err = await migErrorOf(copy(vmdkDisk(img)))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain(img)
    expect(err.message).toContain('refusing to copy it')
    return err.message
  }

  test('a file cut short: refused at open, naming the first grain past the end', async () => {
    const img = streamOf(scattered.raw, 'cut.vmdk')
    truncateSync(img, Math.floor(statSync(img).size / 2))
    const msg = await refusal(img)
    expect(msg).toMatch(/grain \d+ at byte \d+ lies outside the file \(truncated\?\)/)
  })

  test('a grain table entry outside the file: refused at open, naming the grain', async () => {
    const img = streamOf(scattered.raw, 'outside.vmdk')
    const b = Buffer.alloc(4)
    b.writeUInt32LE(0x7fffff00)
    writeAt(img, grainTables(img).entryAt(33 * 16), b)
    const msg = await refusal(img)
    expect(msg).toContain(`grain ${33 * 16}`)
    expect(msg).toContain('outside the file')
  })

  test("a table entry pointing at another grain's marker: refused, naming both sectors", async () => {
    const img = streamOf(scattered.raw, 'swapped.vmdk')
    const t = grainTables(img)
    const b = Buffer.alloc(4)
    b.writeUInt32LE(t.markerAt(0) / 512)
    writeAt(img, t.entryAt(16), b) // grain 16 (1 MiB) now names grain 0's marker
    const msg = await refusal(img)
    expect(msg).toContain('grain 16 ')
    expect(msg).toContain('marker names sector 0, not 2048')
  })

  test('a compressed size over twice the grain: refused', async () => {
    const img = streamOf(scattered.raw, 'huge.vmdk')
    const b = Buffer.alloc(4)
    b.writeUInt32LE(0x7fffffff)
    writeAt(img, grainTables(img).markerAt(17) + 8, b) // the first grain of the piece at 1 MiB + 64 KiB
    expect(await refusal(img)).toContain(`compressed size ${0x7fffffff} is outside 1..${2 * GRAIN} bytes`)
  })

  test('damaged deflate data: refused, naming the grain', async () => {
    const img = streamOf(scattered.raw, 'damaged.vmdk')
    const at = grainTables(img).markerAt(7 * 16) + 12
    writeAt(img, at + 100, Buffer.alloc(64, 0xa5))
    const msg = await refusal(img)
    expect(msg).toContain(`grain ${7 * 16} `)
    expect(msg).toContain('does not inflate')
  })

  test('a grain inflating past its size (a deflate bomb): refused at the grain size, naming the grain', async () => {
    const img = streamOf(scattered.raw, 'bomb.vmdk')
    const marker = grainTables(img).markerAt(33 * 16)
    const bomb = deflateSync(Buffer.alloc(MiB, 1))
    expect(bomb.length).toBeLessThan(bytesAt(img, marker + 8, 4).readUInt32LE(0)) // fits where the grain's data was
    const size = Buffer.alloc(4)
    size.writeUInt32LE(bomb.length)
    writeAt(img, marker + 8, size)
    writeAt(img, marker + 12, bomb)
    const msg = await refusal(img)
    expect(msg).toContain(`grain ${33 * 16} `)
    expect(msg).toContain(`inflates to more than the grain size (${GRAIN} bytes)`)
  })

  test('random data (deflate stores it as it is): null here, read by qemu-img, which is faster on it', async () => {
    const raw = writeScatteredRaw(path.join(tmp.dir, 'random.raw'))
    const img = streamOf(raw, 'random.vmdk')
    expect(await openStreamVmdkReader(img)).toBeNull()
    const out = await copy(vmdkDisk(img))
    expect(out.qemuNode).toBeDefined()
    expect(sha256File(out.path)).toBe(sha256File(raw))
  })

  test('monolithicSparse and text-descriptor VMDKs are no stream-optimized extent: null here (monolithicSparse read by its grain tables)', async () => {
    const img = qemuImageOf(scattered.raw, path.join(tmp.dir, 'mono.vmdk'), 'vmdk', ['-o', 'subformat=monolithicSparse'])
    expect(await openStreamVmdkReader(img)).toBeNull()
    const out = await copy(vmdkDisk(img))
    expect(out.qemuNode).toBeUndefined() // lib/pipeline/readers/vmdk-grains.ts
    expect(sha256File(out.path)).toBe(scattered.sha)
    const flat = qemuImageOf(scattered.raw, path.join(tmp.dir, 'flat.vmdk'), 'vmdk', ['-o', 'subformat=monolithicFlat'])
    expect(await openStreamVmdkReader(flat)).toBeNull()
  })
})
