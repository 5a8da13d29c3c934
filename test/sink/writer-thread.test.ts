/**
 * WriterThread (lib/sink/writer-thread.ts): writes done in call order on their own thread, the
 * caller's buffers left alone, the O_DIRECT EINVAL fallback, errors as outcomes, zeros, and a
 * close that waits for the writes before it. Real files on the test directory's file system.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { constants as C, closeSync, openSync, readFileSync, writeFileSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import * as path from 'node:path'
import { open } from 'node:fs/promises'
import { FileSink } from '../../lib/sink/file.ts'
import { HandleVolume } from '../../lib/sink/volume.ts'
import { WriterThread } from '../../lib/sink/writer-thread.ts'
import { tempDir } from '../helpers/tmp.ts'

const KiB = 1024
const MiB = 1024 * KiB
const tmp = tempDir('mig-writer-')
afterAll(() => tmp.cleanup())

/** An empty file in the test directory, open for reading and writing. */
function file(name: string): { p: string; fd: number } {
  const p = path.join(tmp.dir, name)
  writeFileSync(p, Buffer.alloc(0))
  return { p, fd: openSync(p, 'r+') }
}

describe('WriterThread', () => {
  test('writes to the same offset, issued without waiting, land in call order (the last wins)', async () => {
    const { p, fd } = file('order')
    const w = new WriterThread()
    const bufs = Array.from({ length: 64 }, (_, i) => Buffer.alloc(64 * KiB, i + 1))
    const outcomes = await Promise.all(bufs.map((b) => w.write(fd, b, [fd, 0, 0, b.length])))
    await w.close()
    closeSync(fd)
    expect(outcomes.every((o) => o.fellBack === 0 && !o.error)).toBe(true)
    expect(readFileSync(p).equals(bufs[63]!)).toBe(true)
  })

  test("a caller's ordinary buffer is copied at the call: changing it afterwards changes nothing written, and it stays usable", async () => {
    const { p, fd } = file('copy')
    const w = new WriterThread()
    const b = randomBytes(8 * KiB)
    const want = Buffer.from(b)
    const done = w.write(fd, b, [fd, 4 * KiB, 0, b.length])
    b.fill(0)
    expect(b.length).toBe(8 * KiB)
    expect(await done).toEqual({ fellBack: 0 })
    // A SharedArrayBuffer view reaches the thread as it is.
    const shared = Buffer.from(new SharedArrayBuffer(4 * KiB)).fill(7)
    expect(await w.write(fd, shared, [fd, 0, 0, shared.length])).toEqual({ fellBack: 0 })
    await w.close()
    closeSync(fd)
    const back = readFileSync(p)
    expect(back.subarray(4 * KiB).equals(want)).toBe(true)
    expect(back.subarray(0, 4 * KiB).equals(Buffer.alloc(4 * KiB, 7))).toBe(true)
  })

  test('an O_DIRECT descriptor refusing a buffer not aligned in memory (EINVAL): the alternate descriptor writes it', async () => {
    // The test directory is on a disk file system (ext4 on this machine kind), which takes O_DIRECT.
    const { p, fd } = file('direct')
    const direct = openSync(p, C.O_WRONLY | C.O_DIRECT)
    const w = new WriterThread()
    const sab = Buffer.from(new SharedArrayBuffer(8 * KiB + 1))
    const odd = sab.subarray(1, 1 + 4 * KiB).fill(9)
    const o = await w.write(fd, odd, [direct, 4 * KiB, 0, odd.length])
    await w.close()
    closeSync(direct)
    closeSync(fd)
    expect(o).toEqual({ fellBack: 4 * KiB })
    expect(
      readFileSync(p)
        .subarray(4 * KiB)
        .equals(Buffer.alloc(4 * KiB, 9)),
    ).toBe(true)
  })

  test('a failed write is an outcome with the errno, not a rejection; later writes still run; zeros write zeros', async () => {
    const { p, fd } = file('err')
    writeFileSync(p, Buffer.alloc(2 * MiB, 0xff))
    const ro = openSync(p, 'r')
    const w = new WriterThread()
    const bad = w.write(ro, Buffer.alloc(4 * KiB, 1), [ro, 0, 0, 4 * KiB])
    const zeros = w.zeros(fd, 4 * KiB, 1536 * KiB)
    expect((await bad).error).toMatchObject({ code: 'EBADF', seg: 0, at: 0 })
    expect(await zeros).toEqual({ fellBack: 0 })
    await w.close()
    closeSync(ro)
    closeSync(fd)
    const back = readFileSync(p)
    expect(back.subarray(4 * KiB, 4 * KiB + 1536 * KiB).equals(Buffer.alloc(1536 * KiB))).toBe(true)
    expect(back.subarray(0, 4 * KiB).equals(Buffer.alloc(4 * KiB, 0xff))).toBe(true)
    expect(back.subarray(4 * KiB + 1536 * KiB).equals(Buffer.alloc(2 * MiB - 1540 * KiB, 0xff))).toBe(true)
  })

  test('one call writes its segments in order; a failing segment stops the call there and names its index and offset', async () => {
    const { p, fd } = file('segments')
    writeFileSync(p, Buffer.alloc(64 * KiB, 0xee))
    const w = new WriterThread()
    const src = Buffer.from(new SharedArrayBuffer(16 * KiB))
    for (let i = 0; i < 4; i++) src.fill(i + 1, i * 4 * KiB, (i + 1) * 4 * KiB)
    // Segments out of disk order, one overwriting another: the later one wins.
    const o = await w.write(fd, src, [fd, 32 * KiB, 0, 4 * KiB, fd, 0, 8 * KiB, 8 * KiB, fd, 32 * KiB, 12 * KiB, 4 * KiB])
    expect(o).toEqual({ fellBack: 0 })
    const ro = openSync(p, 'r')
    const bad = await w.write(fd, src, [fd, 16 * KiB, 0, 4 * KiB, ro, 20 * KiB, 4 * KiB, 4 * KiB, fd, 24 * KiB, 4 * KiB, 4 * KiB])
    expect(bad.error).toMatchObject({ code: 'EBADF', seg: 1, at: 20 * KiB })
    await w.close()
    closeSync(ro)
    closeSync(fd)
    const back = readFileSync(p)
    expect(back.subarray(0, 8 * KiB).equals(src.subarray(8 * KiB, 16 * KiB))).toBe(true)
    expect(back.subarray(32 * KiB, 36 * KiB).equals(Buffer.alloc(4 * KiB, 4))).toBe(true)
    expect(back.subarray(16 * KiB, 20 * KiB).equals(Buffer.alloc(4 * KiB, 1))).toBe(true)
    // The failed segment and the one after it are not written.
    expect(back.subarray(20 * KiB, 32 * KiB).equals(Buffer.alloc(12 * KiB, 0xee))).toBe(true)
  })
})

describe('HandleVolume on its writer thread', () => {
  test('close waits for the writes issued before it: every byte lands', async () => {
    const v = await new FileSink({ dataDir: tmp.dir }).create('job-pending', 'd', 64 * MiB)
    const chunks = Array.from({ length: 16 }, () => randomBytes(MiB))
    const writes = chunks.map((c, i) => v.write(i * 4 * MiB, c))
    await v.close()
    await Promise.all(writes)
    const back = readFileSync(v.path)
    for (const [i, c] of chunks.entries()) expect(back.subarray(i * 4 * MiB, i * 4 * MiB + MiB).equals(c)).toBe(true)
  })

  test('a write the file system refuses is E_MIG_DISK_WRITE_FAILED naming the volume, the offset reached and the errno', async () => {
    // A volume over a handle open for reading only: every write answers an errno (EBADF), as a
    // failing device answers EIO.
    const p = path.join(tmp.dir, 'ro.img')
    writeFileSync(p, Buffer.alloc(16 * MiB))
    const v = new HandleVolume(await open(p, 'r'), p, 16 * MiB, 4096, { fresh: false })
    const err = await v.write(MiB, randomBytes(4096)).catch((e) => e)
    expect(err.code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(err.message).toContain(p)
    expect(err.message).toContain('offset 1048576')
    expect(err.details).toEqual({ volume: p, offset: MiB, errno: 'EBADF' })
    await v.close()
  })

  test('writeSegments lands every segment where write would, checks them all before writing any, and names a failed one', async () => {
    const v = (await new FileSink({ dataDir: tmp.dir }).create('job-segments', 'd', 16 * MiB)) as HandleVolume
    const buf = Buffer.from(new SharedArrayBuffer(4 * MiB))
    buf.set(randomBytes(4 * MiB))
    const segs = Array.from({ length: 32 }, (_, i) => ({ offset: MiB + i * 128 * KiB, start: i * 128 * KiB, length: 64 * KiB }))
    await v.writeSegments(buf, segs)
    // A segment past the volume's end or its buffer's: nothing of the list is written.
    const outside = await v
      .writeSegments(buf, [
        { offset: 0, start: 0, length: 4 * KiB },
        { offset: 16 * MiB, start: 0, length: 4 * KiB },
      ])
      .catch((e) => e)
    expect(outside.code).toBe('E_MIG_DISK_WRITE_FAILED')
    const past = await v
      .writeSegments(buf, [
        { offset: 0, start: 0, length: 4 * KiB },
        { offset: 0, start: 4 * MiB - 4 * KiB, length: 8 * KiB },
      ])
      .catch((e) => e)
    expect(past.code).toBe('E_MIG_INTERNAL')
    await v.flush()
    await v.close()
    const back = readFileSync(v.path)
    const want = Buffer.alloc(16 * MiB)
    for (const s of segs) buf.copy(want, s.offset, s.start, s.start + s.length)
    expect(back.equals(want)).toBe(true)

    const p = path.join(tmp.dir, 'ro-segments.img')
    writeFileSync(p, Buffer.alloc(16 * MiB))
    const ro = new HandleVolume(await open(p, 'r'), p, 16 * MiB, 4096, { fresh: false })
    const err = await ro.writeSegments(buf, segs.slice(0, 3)).catch((e) => e)
    expect(err.code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(err.details).toEqual({ volume: p, offset: MiB, errno: 'EBADF' })
    expect(err.message).toContain('write of 65536 bytes')
    await ro.close()
  })
})
