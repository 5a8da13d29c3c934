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
    const outcomes = await Promise.all(bufs.map((b) => w.write(fd, fd, 0, b)))
    await w.close()
    closeSync(fd)
    expect(outcomes.every((o) => o.done === 64 * KiB && !o.error)).toBe(true)
    expect(readFileSync(p).equals(bufs[63]!)).toBe(true)
  })

  test("a caller's ordinary buffer is copied at the call: changing it afterwards changes nothing written, and it stays usable", async () => {
    const { p, fd } = file('copy')
    const w = new WriterThread()
    const b = randomBytes(8 * KiB)
    const want = Buffer.from(b)
    const done = w.write(fd, fd, 4 * KiB, b)
    b.fill(0)
    expect(b.length).toBe(8 * KiB)
    expect((await done).done).toBe(8 * KiB)
    // A SharedArrayBuffer view reaches the thread as it is.
    const shared = Buffer.from(new SharedArrayBuffer(4 * KiB)).fill(7)
    expect((await w.write(fd, fd, 0, shared)).done).toBe(4 * KiB)
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
    const o = await w.write(direct, fd, 4 * KiB, odd)
    await w.close()
    closeSync(direct)
    closeSync(fd)
    expect([o.done, o.fellBack, o.error]).toEqual([4 * KiB, true, undefined])
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
    const bad = w.write(ro, ro, 0, Buffer.alloc(4 * KiB, 1))
    const zeros = w.zeros(fd, 4 * KiB, 1536 * KiB)
    expect((await bad).error?.code).toBe('EBADF')
    expect((await bad).done).toBe(0)
    expect((await zeros).done).toBe(1536 * KiB)
    await w.close()
    closeSync(ro)
    closeSync(fd)
    const back = readFileSync(p)
    expect(back.subarray(4 * KiB, 4 * KiB + 1536 * KiB).equals(Buffer.alloc(1536 * KiB))).toBe(true)
    expect(back.subarray(0, 4 * KiB).equals(Buffer.alloc(4 * KiB, 0xff))).toBe(true)
    expect(back.subarray(4 * KiB + 1536 * KiB).equals(Buffer.alloc(2 * MiB - 1540 * KiB, 0xff))).toBe(true)
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
})
