/**
 * File sink: sparse images under <dataDir>/volumes/migrations/<job-id>/, resume reopening, zero
 * runs (nothing on a fresh image, hole punching over old data), O_DIRECT writes past the page-cache
 * budget, removal, ENOSPC on a 4 MiB tmpfs.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { randomBytes, randomFillSync } from 'node:crypto'
import { existsSync, mkdirSync, readFileSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { FileSink } from '../../lib/sink/file.ts'
import type { HandleVolume } from '../../lib/sink/volume.ts'
import { tempDir } from '../helpers/tmp.ts'
import { migErrorOf } from '../helpers/mig-error.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-filesink-')
afterAll(() => tmp.cleanup())
const blocks = (p: string) => statSync(p).blocks * 512
/** Bytes of file `p` in the page cache (fincore). */
const resident = (p: string) => Number(execFileSync('fincore', ['-b', '-n', '--raw', '-o', 'RES', p], { encoding: 'utf8' }).trim())

describe('FileSink', () => {
  const sink = new FileSink({ dataDir: tmp.dir })

  test('creates a sparse image of the capacity at the documented path', async () => {
    const v = await sink.create('job-1', 'Hard disk 1', 10 * MiB + 512)
    expect(v.path).toBe(path.join(tmp.dir, 'volumes', 'migrations', 'job-1', 'Hard_disk_1.img'))
    expect(statSync(v.path).size).toBe(10 * MiB + 512)
    expect(blocks(v.path)).toBe(0)
    expect(v.blockSize).toBe(4096)
    // A regular file: the copy flushes it back to back while it runs (writeback of the page cache).
    expect(v.writeback).toBe(true)
    await v.close()
  })

  test('writes land at their offsets; zero runs past the written data cost nothing on a fresh image', async () => {
    const v = await sink.create('job-2', 'd', 16 * MiB)
    const data = randomBytes(MiB)
    await v.write(2 * MiB, data)
    await v.zero(4 * MiB, 12 * MiB) // never written: no I/O
    await v.flush()
    expect(blocks(v.path)).toBe(MiB)
    // A zero run over data written in this session is honoured (zero-filled or punched).
    await v.zero(2 * MiB, 4096)
    await v.flush()
    await v.close()
    const back = readFileSync(v.path)
    expect(back.subarray(2 * MiB, 2 * MiB + 4096).equals(Buffer.alloc(4096))).toBe(true)
    expect(back.subarray(2 * MiB + 4096, 3 * MiB).equals(data.subarray(4096))).toBe(true)
  })

  test('past its page-cache budget a volume writes aligned buffers O_DIRECT (qemu-img -t none); unaligned ones through the cache; all land', async () => {
    // The test directory is on a disk file system (ext4 on this machine kind), which takes O_DIRECT.
    const v = await new FileSink({ dataDir: tmp.dir, pageCacheBytes: 4 * MiB }).create('job-direct', 'd', 16 * MiB)
    const first = randomFillSync(Buffer.allocUnsafe(4 * MiB))
    await v.write(0, first)
    // Bytes of the file held in the page cache (fincore, util-linux): the budget's 4 MiB.
    expect(resident(v.path)).toBe(4 * MiB)
    const aligned = randomFillSync(Buffer.allocUnsafe(4 * MiB))
    await v.write(4 * MiB, aligned)
    expect(resident(v.path)).toBe(4 * MiB)
    // qemu-img is told to write past the cache too, now that the budget is spent.
    expect(v.qemuTarget?.takeDirect(MiB)).toBe(true)
    const odd = randomBytes(1000)
    await v.write(12 * MiB + 100, odd)
    expect(resident(v.path)).toBeGreaterThan(4 * MiB)
    await v.flush()
    await v.close()
    const back = readFileSync(v.path)
    expect(back.subarray(0, 4 * MiB).equals(first)).toBe(true)
    expect(back.subarray(4 * MiB, 8 * MiB).equals(aligned)).toBe(true)
    expect(back.subarray(12 * MiB + 100, 12 * MiB + 1100).equals(odd)).toBe(true)
  })

  test('the first O_DIRECT write waits for the page-cache writes before it to get their blocks: the file takes the blocks of the same writes all through the cache', async () => {
    // 20,000 writes of 4 KiB every 8 KiB, two at a time as the copy loop sends them: 20,000
    // extents, so ext4 keeps them in an extent tree. Without the wait the direct writes
    // allocated ahead of the cached ones still dirty, and the tree took one block more (80,244
    // KiB against 80,240 on this machine kind, in each of 4 runs).
    const piece = Buffer.alloc(4096, 7)
    const writeAll = async (pageCacheBytes: number, job: string) => {
      const v = await new FileSink({ dataDir: tmp.dir, pageCacheBytes }).create(job, 'd', 20_000 * 8192)
      for (let i = 0; i < 20_000; i += 2) await Promise.all([v.write(i * 8192, piece), v.write((i + 1) * 8192, piece)])
      await v.flush()
      await v.close()
      return v.path
    }
    const mixed = await writeAll(40 * MiB, 'job-mixed') // the first 10,000 through the cache
    const cached = await writeAll(2 ** 40, 'job-cached')
    expect(resident(mixed)).toBeLessThanOrEqual(40 * MiB + 8192) // the rest went O_DIRECT
    expect(blocks(mixed)).toBe(blocks(cached))
    // The same writes as lists of 48 segments of one buffer (writeSegments, as the copy loop
    // sends a chunk's pieces): the list during which the budget runs out (at the 10,000th
    // write, mid-list) still lets the cached writes before it get their blocks first.
    const v = (await new FileSink({ dataDir: tmp.dir, pageCacheBytes: 40 * MiB }).create('job-segments', 'd', 20_000 * 8192)) as HandleVolume
    const shared = Buffer.from(new SharedArrayBuffer(4096)).fill(7)
    for (let i = 0; i < 20_000; i += 48) {
      const list = Array.from({ length: Math.min(48, 20_000 - i) }, (_, k) => ({ offset: (i + k) * 8192, start: 0, length: 4096 }))
      await v.writeSegments(shared, list)
    }
    await v.flush()
    await v.close()
    expect(resident(v.path)).toBeLessThanOrEqual(40 * MiB + 48 * 8192)
    expect(blocks(v.path)).toBe(blocks(cached))
    expect(readFileSync(v.path).equals(readFileSync(cached))).toBe(true)
  })

  test('writes called while the first O_DIRECT write waits for its fsync land after it, in the order they were called', async () => {
    const v = await new FileSink({ dataDir: tmp.dir, pageCacheBytes: 4 * MiB }).create('job-gate-order', 'd', 16 * MiB)
    await v.write(0, randomBytes(4 * MiB)) // the page-cache budget
    const direct = Buffer.alloc(MiB, 1) // aligned: the first O_DIRECT write, behind the fsync
    const later = Buffer.alloc(1000, 2) // unaligned: through the cache, called after it, over its range
    const p1 = v.write(8 * MiB, direct)
    const p2 = v.write(8 * MiB + 100, later)
    await Promise.all([p1, p2])
    await v.flush()
    await v.close()
    const back = readFileSync(v.path).subarray(8 * MiB, 9 * MiB)
    expect(back.subarray(0, 100).equals(direct.subarray(0, 100))).toBe(true)
    expect(back.subarray(100, 1100).equals(later)).toBe(true)
    expect(back.subarray(1100).equals(direct.subarray(1100))).toBe(true)
  })

  test('a resumed job reopens the image with its data; zero runs over old data punch holes', async () => {
    const v1 = await sink.create('job-3', 'disk', 8 * MiB)
    await v1.write(0, randomBytes(4 * MiB))
    await v1.flush()
    await v1.close()
    const v2 = await sink.create('job-3', 'disk', 8 * MiB)
    expect(blocks(v2.path)).toBe(4 * MiB)
    await v2.zero(MiB, 2 * MiB + 100)
    await v2.flush()
    await v2.close()
    const back = readFileSync(v2.path)
    expect(back.subarray(MiB, 3 * MiB + 100).equals(Buffer.alloc(2 * MiB + 100))).toBe(true)
    expect(blocks(v2.path)).toBeLessThanOrEqual(2 * MiB + 4096)
  })

  test('writes outside the volume and after close are E_MIG_DISK_WRITE_FAILED', async () => {
    const v = await sink.create('job-4', 'disk', MiB)
    const e1 = await migErrorOf(v.write(MiB - 10, Buffer.alloc(20)))
    expect(e1.code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(e1.message).toContain('disk.img')
    await v.close()
    expect((await migErrorOf(v.write(0, Buffer.alloc(1)))).code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(statSync(v.path).size).toBe(MiB)
  })

  test('remove deletes every image of the job; removing twice is fine', async () => {
    const v = await sink.create('job-5', 'a', MiB)
    await v.close()
    await (await sink.create('job-5', 'b', MiB)).close()
    await sink.remove('job-5')
    expect(existsSync(path.join(tmp.dir, 'volumes', 'migrations', 'job-5'))).toBe(false)
    await sink.remove('job-5')
  })

  test('the pre-V2V snapshot: rollback restores the images as they were at take; release removes the copies', async () => {
    const s2 = new FileSink({ dataDir: tmp.dir })
    const v = await s2.create('job-snap', 'disk0', 8 * MiB)
    const a = randomBytes(64 * 1024)
    await v.write(MiB, a)
    await v.flush()
    await v.close()
    const img = s2.volumePath('job-snap', 'disk0')
    const snap = s2.snapshot('job-snap')
    await snap.take()
    const v2 = await s2.create('job-snap', 'disk0', 8 * MiB)
    await v2.write(MiB, randomBytes(64 * 1024))
    await v2.write(0, randomBytes(4096))
    await v2.flush()
    await v2.close()
    expect(
      readFileSync(img)
        .subarray(MiB, MiB + a.length)
        .equals(a),
    ).toBe(false)
    await snap.rollback()
    await snap.release()
    const back = readFileSync(img)
    expect(back.subarray(MiB, MiB + a.length).equals(a)).toBe(true)
    expect(back.subarray(0, 4096).every((b) => b === 0)).toBe(true)
    expect(statSync(img).size).toBe(8 * MiB)
    expect(existsSync(path.join(s2.jobDir('job-snap'), '.pre-v2v'))).toBe(false)
  })

  test('a job id that is not a safe path segment is refused', async () => {
    expect((await migErrorOf(sink.create('../x', 'a', MiB))).code).toBe('E_MIG_INTERNAL')
    expect((await migErrorOf(sink.remove('..'))).code).toBe('E_MIG_INTERNAL')
  })
})

describe('FileSink on a full file system', () => {
  test('ENOSPC on a 4 MiB tmpfs is E_MIG_DISK_WRITE_FAILED naming the volume and offset', async () => {
    const mnt = path.join(tmp.dir, 'mnt')
    mkdirSync(mnt)
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', mnt])
    try {
      const sink = new FileSink({ dataDir: mnt })
      const v = await sink.create('job-full', 'disk', 64 * MiB)
      let err: MigError | null = null
      try {
        for (let o = 0; o < 16 * MiB; o += MiB) await v.write(o, randomBytes(MiB))
      } catch (e) {
        err = e as MigError
      }
      await v.close()
      expect(err).toBeInstanceOf(MigError)
      expect(err!.code).toBe('E_MIG_DISK_WRITE_FAILED')
      expect(err!.message).toContain(v.path)
      expect(err!.message).toMatch(/at offset \d+/)
      expect(err!.details?.errno).toBe('ENOSPC')
      expect(Number(err!.details?.offset)).toBeGreaterThanOrEqual(2 * MiB)
      expect(Number(err!.details?.offset)).toBeLessThanOrEqual(4 * MiB)
    } finally {
      execFileSync('umount', [mnt])
    }
  })
})
