/**
 * The data map of raw and flat files (lib/pipeline/qemu-img-map.ts): holes of a sparse
 * file are zero extents the copy never reads, data extents are exactly the written ranges, a tar
 * member window is mapped in disk offsets, and a qemu-img whose output is not a covering map (a
 * stand-in script, named as such) is refused with E_MIG_DISK_READ_FAILED.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { chmodSync, closeSync, ftruncateSync, openSync, writeFileSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import type { DiskExtent } from '../../lib/contracts/disk-reader.ts'
import { qemuImgMap } from '../../lib/pipeline/qemu-img-map.ts'
import { openRawFileReader } from '../../lib/pipeline/readers/raw-file.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-map-')
afterAll(() => tmp.cleanup())

/** A sparse file of `size` bytes with 0xA5 written at each `[offset, length]`. */
function sparseFile(name: string, size: number, pieces: Array<[number, number]>): string {
  const p = path.join(tmp.dir, name)
  const fd = openSync(p, 'w')
  for (const [o, l] of pieces) writeSync(fd, Buffer.alloc(l, 0xa5), 0, l, o)
  ftruncateSync(fd, size)
  closeSync(fd)
  return p
}
async function all(it: AsyncIterable<DiskExtent>): Promise<DiskExtent[]> {
  const out: DiskExtent[] = []
  for await (const x of it) out.push(x)
  return out
}

describe('raw file extents from the file holes', () => {
  test('a sparse file: holes are zero extents, the written pieces data, covering the disk in order', async () => {
    const p = sparseFile('s.raw', 64 * MiB, [
      [4 * MiB, 2 * MiB],
      [20 * MiB, MiB],
    ])
    const r = await openRawFileReader(p)
    try {
      const xs = await all(r.extents(0))
      expect(xs).toEqual([
        { offset: 0, length: 4 * MiB, zero: true },
        { offset: 4 * MiB, length: 2 * MiB, zero: false },
        { offset: 6 * MiB, length: 14 * MiB, zero: true },
        { offset: 20 * MiB, length: MiB, zero: false },
        { offset: 21 * MiB, length: 43 * MiB, zero: true },
      ])
      // From the middle of a hole: starts exactly there.
      expect((await all(r.extents(5 * MiB)))[0]).toEqual({ offset: 5 * MiB, length: MiB, zero: false })
      expect(await all(r.extents(64 * MiB))).toEqual([])
    } finally {
      await r.close()
    }
    await expect(all(r.extents(0))).rejects.toMatchObject({ code: 'E_MIG_DISK_READ_FAILED' })
  })

  test('a window (a tar member at offset 3 MiB): extents in disk offsets, the bytes around it ignored', async () => {
    const p = sparseFile('w.raw', 40 * MiB, [
      [0, MiB],
      [8 * MiB, MiB],
      [39 * MiB, MiB],
    ])
    const r = await openRawFileReader(p, { offset: 3 * MiB, length: 32 * MiB })
    try {
      expect(await all(r.extents(0))).toEqual([
        { offset: 0, length: 5 * MiB, zero: true },
        { offset: 5 * MiB, length: MiB, zero: false },
        { offset: 6 * MiB, length: 26 * MiB, zero: true },
      ])
      expect((await r.read(5 * MiB, 4)).toString('hex')).toBe('a5a5a5a5')
    } finally {
      await r.close()
    }
  })

  test('a file with no hole is one data extent per GiB at most', async () => {
    const p = sparseFile('d.raw', 2 * MiB, [[0, 2 * MiB]])
    const r = await openRawFileReader(p)
    try {
      expect(await all(r.extents(0))).toEqual([{ offset: 0, length: 2 * MiB, zero: false }])
    } finally {
      await r.close()
    }
  })
})

describe('qemuImgMap refuses what is not a covering map (stand-in qemu-img scripts)', () => {
  const node = { driver: 'null-co', size: 4 * MiB }
  const fake = (name: string, body: string) => {
    const p = path.join(tmp.dir, name)
    writeFileSync(p, `#!/bin/sh\n${body}\n`)
    chmodSync(p, 0o755)
    return p
  }
  const line = (start: number, length: number, data: boolean) =>
    `{ "start": ${start}, "length": ${length}, "depth": 0, "present": true, "zero": ${!data}, "data": ${data}, "offset": ${start}}`

  test('the real qemu-img on a null-co node: one zero extent', async () => {
    expect(await all(qemuImgMap({ node: { driver: 'null-co', size: 4 * MiB, 'read-zeroes': true }, from: 0, size: 4 * MiB, label: 'n' }))).toEqual([
      { offset: 0, length: 4 * MiB, zero: true },
    ])
  })

  for (const [why, body] of [
    ['a gap', `echo '[${line(0, MiB, true)},'; echo '${line(2 * MiB, 2 * MiB, false)}]'`],
    ['an overlap', `echo '[${line(0, 2 * MiB, true)},'; echo '${line(MiB, 3 * MiB, false)}]'`],
    ['past the end', `echo '[${line(0, 8 * MiB, true)}]'`],
    ['short of the end', `echo '[${line(0, MiB, true)}]'`],
    ['garbage', `echo 'hello'`],
    ['a failing exit', `echo '[${line(0, 4 * MiB, true)}]'; echo 'Could not open' >&2; exit 1`],
  ] as const) {
    test(`${why}: E_MIG_DISK_READ_FAILED`, async () => {
      const err = await thrown(() =>
        all(qemuImgMap({ node, from: 0, size: 4 * MiB, label: 'disk.raw', qemuImgPath: fake(`q-${why.replace(/ /g, '-')}`, body) })),
      )
      expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
      expect(err.message).toContain('disk.raw: qemu-img map')
    })
  }

  test('no qemu-img at all: E_MIG_DISK_READ_FAILED naming it', async () => {
    const err = await thrown(() => all(qemuImgMap({ node, from: 0, size: 4 * MiB, label: 'disk.raw', qemuImgPath: path.join(tmp.dir, 'absent') })))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('cannot run qemu-img')
  })

  test('adjacent ranges of one kind are merged', async () => {
    const q = fake('q-merge', `echo '[${line(0, MiB, true)},'; echo '${line(MiB, MiB, true)},'; echo '${line(2 * MiB, 2 * MiB, false)}]'`)
    expect(await all(qemuImgMap({ node, from: 0, size: 4 * MiB, label: 'm', qemuImgPath: q }))).toEqual([
      { offset: 0, length: 2 * MiB, zero: false },
      { offset: 2 * MiB, length: 2 * MiB, zero: true },
    ])
  })
})
