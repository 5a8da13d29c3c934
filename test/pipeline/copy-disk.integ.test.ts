/**
 * copyDisk: resume from a watermark with a new reader (bit-exact, only the rest read), abort,
 * watermark durability order, gaps left untouched, digest verification, error propagation.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { closeSync, openSync, readFileSync, statSync, writeFileSync, writeSync } from 'node:fs'
import { availableParallelism } from 'node:os'
import * as path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { MigError } from '../../lib/errors.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import type { CopyDiskOptions } from '../../lib/pipeline/copy-common.ts'
import { copyDisk, usesQemuImg } from '../../lib/pipeline/copy-disk.ts'
import { WRITE_DEPTH } from '../../lib/pipeline/copy-engine-node.ts'
import { QEMU_IMG_PROCESSES, qemuImgProcesses } from '../../lib/pipeline/copy-engine-qemu-img.ts'
import { openNbdReader } from '../../lib/pipeline/readers/nbd.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import type { DiskExtent, DiskReader } from '../../lib/contracts/disk-reader.ts'
import { FileSink } from '../../lib/sink/file.ts'
import type { SinkVolume } from '../../lib/sink/types.ts'
import { tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const KiB = 1024
const SIZE = 64 * MiB
/** 64 KiB-aligned data pieces spread over the disk. */
const PIECES: Array<[number, number]> = [
  [MiB, 256 * KiB],
  [10 * MiB, 2 * MiB],
  [30 * MiB + 64 * KiB, 64 * KiB],
  [40 * MiB, 3 * MiB],
  [60 * MiB, 128 * KiB],
]
const tmp = tempDir('mig-copy-')
let RAW = ''
let QCOW = ''
let RAW_BYTES = Buffer.alloc(0)
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex')
const noop = { onProgress() {}, async onWatermark() {} }
afterAll(() => tmp.cleanup())

beforeAll(() => {
  RAW = path.join(tmp.dir, 'src.raw')
  const fd = openSync(RAW, 'w')
  for (const [o, l] of PIECES) writeSync(fd, randomBytes(l), 0, l, o)
  closeSync(fd)
  execFileSync('truncate', ['-s', String(SIZE), RAW])
  RAW_BYTES = readFileSync(RAW)
  QCOW = path.join(tmp.dir, 'src.qcow2')
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', RAW, QCOW])
})

const qcowDisk = (): ManifestDisk => ({
  label: 'disk0',
  capacity_bytes: SIZE,
  disk_format: 'qcow2',
  source: { path: QCOW },
  controller: 'virtio',
  address: '0',
})
/**
 * The qcow2 source through qemu-nbd (the qemu node the qemu-img engine needs; `openDiskReader`
 * reads this image by its clusters, with no qemu node).
 */
const nbdQcow = () => openNbdReader({ path: QCOW, format: 'qcow2', label: 'disk0' })
const dataFrom = (w: number) => PIECES.reduce((a, [o, l]) => a + Math.max(0, o + l - Math.max(o, w)), 0)

/** A reader over an in-memory disk that counts the bytes it reads. */
function memReader(bytes: Buffer, extents?: DiskExtent[]): DiskReader & { readBytes: number } {
  const r = {
    size: bytes.length,
    readBytes: 0,
    async *extents(from: number) {
      for (const e of extents ?? [{ offset: 0, length: bytes.length, zero: false }]) if (e.offset + e.length > from) yield e
    },
    async read(offset: number, length: number) {
      r.readBytes += length
      await new Promise((res) => setTimeout(res, 1))
      return Buffer.from(bytes.subarray(offset, offset + length))
    },
    async close() {},
  }
  return r
}

/** A volume in memory that logs operations. */
function memVolume(size: number): SinkVolume & { bytes: Buffer; log: string[]; failAt?: number } {
  const v = {
    path: 'mem',
    blockSize: 4096,
    bytes: Buffer.alloc(size, 0xee),
    log: [] as string[],
    failAt: undefined as number | undefined,
    async write(offset: number, buf: Buffer) {
      if (v.failAt !== undefined && offset <= v.failAt && v.failAt < offset + buf.length) {
        throw new MigError('E_MIG_DISK_WRITE_FAILED', `mem: write at offset ${offset} failed: ENOSPC`)
      }
      buf.copy(v.bytes, offset)
      v.log.push(`w ${offset} ${buf.length}`)
    },
    async zero(offset: number, length: number) {
      v.bytes.fill(0, offset, offset + length)
      v.log.push(`z ${offset} ${length}`)
    },
    async flush() {
      v.log.push('flush')
    },
    async close() {},
  }
  return v
}

describe('copyDisk', () => {
  for (const engine of ['node', 'qemu-img'] as const)
    test(`resume (${engine} engine): copy until a watermark, then continue from it with a new reader; bit-exact, the second run reads only the rest`, async () => {
      const sink = new FileSink({ dataDir: path.join(tmp.dir, `var-${engine}`) })
      const ac = new AbortController()
      let watermark = 0
      const r1 = await nbdQcow()
      // The node engine's checkpoints run in the background: its reads from 40 MiB on wait for
      // the abort, so the copy cannot finish before a watermark of 8 MiB or more is durable.
      const aborted = new Promise((res) => ac.signal.addEventListener('abort', res))
      const gated: DiskReader = Object.create(r1)
      gated.read = async (o, l, into) => {
        if (o >= 40 * MiB) await Promise.race([aborted, sleep(5000)])
        return r1.read(o, l, into)
      }
      const v1 = await sink.create('job-resume', 'disk0', SIZE)
      let err: unknown
      try {
        await copyDisk(gated, v1, {
          from: 0,
          signal: ac.signal,
          engine,
          flushEveryBytes: MiB, // of data read: both engines count data, not zero extents
          onProgress() {},
          async onWatermark(w) {
            watermark = w
            if (w >= 8 * MiB) ac.abort()
          },
        })
      } catch (e) {
        err = e
      }
      await v1.close()
      await r1.close()
      expect(err).toBeInstanceOf(MigError)
      expect((err as MigError).code).toBe('E_MIG_CANCELLED')
      expect(watermark).toBeGreaterThanOrEqual(8 * MiB)
      expect(watermark).toBeLessThan(SIZE)
      expect(watermark % (engine === 'node' ? 64 * KiB : 512)).toBe(0) // a chunk edge: 4 MiB or a qcow2 cluster's

      // A new process would reopen the volume (resume) and a new reader.
      const r2 = await nbdQcow()
      const v2 = await sink.create('job-resume', 'disk0', SIZE)
      const marks: number[] = []
      const res = await copyDisk(r2, v2, {
        from: watermark,
        signal: new AbortController().signal,
        engine,
        onProgress() {},
        async onWatermark(w) {
          marks.push(w)
        },
      })
      await v2.close()
      await r2.close()
      expect(res.bytes_read).toBe(dataFrom(watermark))
      expect(res.bytes_read).toBeLessThan(PIECES.reduce((a, [, l]) => a + l, 0))
      expect(marks[marks.length - 1]).toBe(SIZE)
      if (engine === 'node') expect(marks).toEqual([SIZE])
      expect(sha(readFileSync(v2.path))).toBe(sha(RAW_BYTES))
    })

  test('abort before and during the copy is E_MIG_CANCELLED and stops reading', async () => {
    const ac = new AbortController()
    ac.abort()
    const r = memReader(RAW_BYTES)
    let err = await copyDisk(r, memVolume(SIZE), { from: 0, signal: ac.signal, ...noop }).catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
    expect(r.readBytes).toBe(0)

    const ac2 = new AbortController()
    const r2 = memReader(RAW_BYTES)
    err = await copyDisk(r2, memVolume(SIZE), {
      from: 0,
      signal: ac2.signal,
      onProgress(p) {
        if (p.bytes_done >= 8 * MiB) ac2.abort()
      },
      async onWatermark() {},
    }).catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
    expect(r2.readBytes).toBeLessThan(8 * MiB + 6 * 4 * MiB)
  })

  test('watermarks are reported only after a flush covering them; zero runs are discarded, not written', async () => {
    const v = memVolume(SIZE)
    const order: string[] = []
    const res = await copyDisk(memReader(RAW_BYTES), v, {
      from: 0,
      signal: new AbortController().signal,
      flushEveryBytes: 16 * MiB,
      writeback: false, // only the checkpoints' flushes in the log
      onProgress() {},
      async onWatermark(w) {
        order.push(`mark ${w} after ${v.log.lastIndexOf('flush') >= 0 ? 'flush' : 'nothing'}`)
        v.log.push(`mark ${w}`)
      },
    })
    expect(v.bytes.equals(RAW_BYTES)).toBe(true)
    expect(res.bytes_written).toBe(PIECES.reduce((a, [, l]) => a + l, 0))
    expect(res.bytes_zero).toBe(SIZE - res.bytes_written)
    expect(res.bytes_read).toBe(SIZE)
    // Every mark is preceded by a flush and by every write below it.
    for (let i = 0; i < v.log.length; i++) {
      const m = /^mark (\d+)$/.exec(v.log[i])
      if (!m) continue
      expect(v.log.slice(0, i).includes('flush')).toBe(true)
      const lastFlush = v.log.slice(0, i).lastIndexOf('flush')
      const w = Number(m[1])
      // Operations between that flush and the mark (the copy goes on while the fsync runs)
      // all lie at or above the mark.
      for (const op of v.log.slice(lastFlush + 1, i)) {
        const off = Number(op.split(' ')[1])
        if (op.startsWith('w ') || op.startsWith('z ')) expect(off).toBeGreaterThanOrEqual(w)
      }
    }
    expect(order[order.length - 1]).toBe(`mark ${SIZE} after flush`)
    expect(v.log.filter((x) => x.startsWith('w ')).length).toBeLessThanOrEqual(PIECES.length + 2)
  })

  test('between checkpoints the node engine flushes the volume again and again (writeback); writeback false, or a volume that asks so: only at checkpoints', async () => {
    const flushesBeforeLastWrite = async (writeback?: boolean, volumeWriteback?: () => boolean) => {
      const v = memVolume(SIZE)
      if (volumeWriteback) Object.defineProperty(v, 'writeback', { get: volumeWriteback })
      // 64 MiB in 4 MiB reads of 20 ms each: the copy takes about 0.3 s; one checkpoint, at the end.
      const r = memReader(RAW_BYTES)
      const read = r.read.bind(r)
      r.read = async (o, l, into) => (await sleep(20), read(o, l, into))
      await copyDisk(r, v, { from: 0, signal: new AbortController().signal, flushEveryBytes: 2 * SIZE, writeback, ...noop })
      expect(v.bytes.equals(RAW_BYTES)).toBe(true)
      const lastWrite = v.log.findLastIndex((l) => l.startsWith('w '))
      return { before: v.log.slice(0, lastWrite).filter((l) => l === 'flush').length, all: v.log.filter((l) => l === 'flush').length }
    }
    // A flush every 10 ms pause at least (a memory volume's flush takes no time).
    expect((await flushesBeforeLastWrite()).before).toBeGreaterThan(5)
    expect(await flushesBeforeLastWrite(false)).toEqual({ before: 0, all: 1 })
    // A volume that wants none (a block device writing O_DIRECT) gets none; the option overrides it.
    expect(await flushesBeforeLastWrite(undefined, () => false)).toEqual({ before: 0, all: 1 })
    expect((await flushesBeforeLastWrite(true, () => false)).before).toBeGreaterThan(5)
    // The volume is asked before each flush: the loop ends once it says no.
    let asked = 0
    const stopsAfterThree = await flushesBeforeLastWrite(undefined, () => ++asked <= 3)
    expect(stopsAfterThree).toEqual({ before: 3, all: 4 })
  })

  test('gaps between extents (changed areas only) are left untouched', async () => {
    const v = memVolume(SIZE)
    const areas = [
      { offset: 10 * MiB, length: MiB, zero: false },
      { offset: 40 * MiB, length: 2 * MiB, zero: false },
    ]
    const res = await copyDisk(memReader(RAW_BYTES, areas), v, { from: 0, signal: new AbortController().signal, ...noop })
    expect(res.bytes_read).toBe(3 * MiB)
    expect(v.bytes.subarray(10 * MiB, 11 * MiB).equals(RAW_BYTES.subarray(10 * MiB, 11 * MiB))).toBe(true)
    expect(v.bytes.subarray(40 * MiB, 42 * MiB).equals(RAW_BYTES.subarray(40 * MiB, 42 * MiB))).toBe(true)
    expect(v.bytes[0]).toBe(0xee)
    expect(v.bytes[20 * MiB]).toBe(0xee)
    expect(v.bytes[SIZE - 1]).toBe(0xee)
  })

  test('digest: verified over all bytes (the prefix re-read on resume); a mismatch is E_MIG_MALFORMED_ARCHIVE', async () => {
    const hex = createHash('sha256').update(RAW_BYTES).digest('hex')
    const ok = await copyDisk(memReader(RAW_BYTES), memVolume(SIZE), {
      from: 0,
      signal: new AbortController().signal,
      digest: { algorithm: 'sha256', hex },
      ...noop,
    })
    expect(ok.bytes_read).toBe(SIZE)
    const r = memReader(RAW_BYTES)
    await copyDisk(r, memVolume(SIZE), {
      from: 32 * MiB,
      signal: new AbortController().signal,
      digest: { algorithm: 'sha256', hex: hex.toUpperCase() },
      ...noop,
    })
    expect(r.readBytes).toBe(SIZE) // 32 MiB hashed again + 32 MiB copied
    const err = await copyDisk(memReader(RAW_BYTES), memVolume(SIZE), {
      from: 0,
      signal: new AbortController().signal,
      digest: { algorithm: 'sha1', hex: 'ab'.repeat(20) },
      ...noop,
    }).catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_MALFORMED_ARCHIVE')
  })

  test('a write failure surfaces as E_MIG_DISK_WRITE_FAILED and no final watermark is reported', async () => {
    const v = memVolume(SIZE)
    v.failAt = 40 * MiB + 4096
    const marks: number[] = []
    const err = await copyDisk(memReader(RAW_BYTES), v, {
      from: 0,
      signal: new AbortController().signal,
      flushEveryBytes: 8 * MiB,
      onProgress() {},
      async onWatermark(w) {
        marks.push(w)
      },
    }).catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(Math.max(0, ...marks)).toBeLessThanOrEqual(40 * MiB)
  })

  test('a read failure surfaces as E_MIG_DISK_READ_FAILED', async () => {
    const r = memReader(RAW_BYTES)
    r.read = async (offset: number) => {
      if (offset >= 16 * MiB) throw new MigError('E_MIG_DISK_READ_FAILED', `mem: read at offset ${offset} failed`)
      return Buffer.from(RAW_BYTES.subarray(offset, offset + 4 * MiB))
    }
    const err = await copyDisk(r, memVolume(SIZE), { from: 0, signal: new AbortController().signal, ...noop }).catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('16777216')
  })

  test('the file sink destination stays sparse: allocation equals the data', async () => {
    const sink = new FileSink({ dataDir: path.join(tmp.dir, 'var2') })
    const r = await openDiskReader(qcowDisk())
    const v = await sink.create('job-sparse', 'disk0', SIZE)
    const res = await copyDisk(r, v, { from: 0, signal: new AbortController().signal, ...noop })
    await v.close()
    await r.close()
    const data = PIECES.reduce((a, [, l]) => a + l, 0)
    expect(res.bytes_written).toBe(data)
    expect(statSync(v.path).blocks * 512).toBeLessThanOrEqual(data * 1.05)
  })
})

describe('copyDisk allocation', () => {
  // 512 MiB of alternating 64 KiB clusters: 4,096 data extents, written O_DIRECT (no page-cache
  // budget). Writes that reach ext4 out of disk order split its extent tree's leaves and allocate
  // more blocks than qemu-img's in-order writes (524,496 against 524,400 blocks).
  let ALT = ''
  let REF_BLOCKS = 0
  beforeAll(() => {
    ALT = path.join(tmp.dir, 'alt.raw')
    const fd = openSync(ALT, 'w')
    const cluster = randomBytes(64 * KiB)
    for (let o = 0; o < 512 * MiB; o += 128 * KiB) writeSync(fd, cluster, 0, cluster.length, o)
    closeSync(fd)
    execFileSync('truncate', ['-s', String(512 * MiB), ALT])
    const ref = path.join(tmp.dir, 'alt-ref.raw')
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'raw', ALT, ref])
    execFileSync('sync')
    REF_BLOCKS = statSync(ref).blocks
  })
  for (const engine of ['node', 'qemu-img'] as const) {
    test(`${engine} engine: the destination allocates no more blocks than qemu-img convert's, bit-exact`, async () => {
      const sink = new FileSink({ dataDir: path.join(tmp.dir, `alloc-${engine}`), pageCacheBytes: 0 })
      const disk: ManifestDisk = { ...qcowDisk(), capacity_bytes: 512 * MiB, disk_format: 'raw', source: { path: ALT } }
      const r = await openDiskReader(disk)
      const v = await sink.create('job-alloc', 'disk0', 512 * MiB)
      const res = await copyDisk(r, v, { from: 0, engine, signal: new AbortController().signal, ...noop })
      await v.close()
      await r.close()
      expect(res.bytes_written).toBe(256 * MiB)
      expect(() => execFileSync('cmp', [v.path, ALT])).not.toThrow()
      expect(REF_BLOCKS).toBeGreaterThanOrEqual((256 * MiB) / 512)
      expect(statSync(v.path).blocks).toBeLessThanOrEqual(REF_BLOCKS)
    }, 120_000)
  }
})

describe('copyDisk bandwidth cap', () => {
  test('maxBytesPerSecond holds source reads to the cap (16 MiB at 32 MiB/s takes at least 0.45 s) and the copy stays exact', async () => {
    const bytes = randomBytes(16 * MiB)
    const r = memReader(bytes)
    const v = memVolume(bytes.length)
    const t0 = performance.now()
    const res = await copyDisk(r, v, { from: 0, signal: new AbortController().signal, ...noop, maxBytesPerSecond: 32 * MiB })
    expect(performance.now() - t0).toBeGreaterThanOrEqual(450)
    expect(res.bytes_read).toBe(16 * MiB)
    expect(v.bytes.equals(bytes)).toBe(true)
  })

  test('a cancel during a throttled copy ends it at once with E_MIG_CANCELLED', async () => {
    const ac = new AbortController()
    const t0 = performance.now()
    setTimeout(() => ac.abort(), 100)
    const err = await copyDisk(memReader(randomBytes(16 * MiB)), memVolume(16 * MiB), {
      from: 0,
      signal: ac.signal,
      ...noop,
      maxBytesPerSecond: 4 * MiB,
    }).catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
    expect(performance.now() - t0).toBeLessThan(2000)
  })
})

describe('copyDisk qemu-img engine (qemu-img convert per range, the checkpoints kept here)', () => {
  /** A raw source of `size` bytes, random data over its first `data` bytes. */
  function rawSource(name: string, size: number, data: number): { path: string; bytes: Buffer } {
    const p = path.join(tmp.dir, name)
    const fd = openSync(p, 'w')
    writeSync(fd, randomBytes(data), 0, data, 0)
    closeSync(fd)
    execFileSync('truncate', ['-s', String(size), p])
    return { path: p, bytes: readFileSync(p) }
  }
  const rawDisk = (p: string, size: number): ManifestDisk => ({
    label: 'disk0',
    capacity_bytes: size,
    disk_format: 'raw',
    source: { path: p },
    controller: 'virtio',
    address: '0',
  })
  /** Pids of the processes `pgrep <args>` finds (none: an empty list). */
  const pgrep = (args: string): number[] =>
    execFileSync('sh', ['-c', `pgrep ${args} || true`], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .filter(Boolean)
      .map(Number)
  const alive = (pid: number) => {
    try {
      process.kill(pid, 0)
      return true
    } catch {
      return false
    }
  }

  /** A raw source (`size` bytes, `data` of them data) opened as a reader, and a fresh file-sink volume of the same size. */
  const rawCopy = async (name: string, size: number, data: number, pageCacheBytes?: number) => {
    const src = rawSource(`${name}.raw`, size, data)
    const sink = new FileSink({ dataDir: path.join(tmp.dir, `var-${name}`), pageCacheBytes })
    const q = await openDiskReader(rawDisk(src.path, size))
    const v = await sink.create(name, 'disk0', size)
    return { src, q, v }
  }

  /** Logs `flush` for each `volume.flush()` call into the returned array (watermarks are pushed there too). */
  const logFlushes = (v: SinkVolume): string[] => {
    const log: string[] = []
    const inner = v.flush.bind(v)
    v.flush = async () => {
      log.push('flush')
      await inner()
    }
    return log
  }

  /**
   * Copies `c` with `opts`, logging `flush` for each volume flush and `w <watermark>` for each
   * watermark; closes both sides and checks the copy is bit-exact. Returns the result, the log and
   * the watermarks in order.
   */
  const loggedCopy = async (c: Awaited<ReturnType<typeof rawCopy>>, opts: Partial<CopyDiskOptions>) => {
    const log = logFlushes(c.v)
    const res = await copyDisk(c.q, c.v, {
      engine: 'qemu-img',
      from: 0,
      signal: new AbortController().signal,
      onProgress() {},
      ...opts,
      async onWatermark(w) {
        log.push(`w ${w}`)
      },
    })
    await c.v.close()
    await c.q.close()
    expect(sha(readFileSync(c.v.path))).toBe(sha(c.src.bytes))
    const marks = log.filter((l) => l.startsWith('w ')).map((l) => Number(l.slice(2)))
    return { res, log, marks }
  }

  test('one qemu-img at a time: watermarks only after a flush, one per range of about flushEveryBytes of data; zero tail not written; progress rises to the end', async () => {
    const c = await rawCopy('q1', 48 * MiB, 24 * MiB)
    const done: number[] = []
    const { res, log, marks } = await loggedCopy(c, { flushEveryBytes: 8 * MiB, qemuProcesses: 1, onProgress: (p) => done.push(p.bytes_done) })
    // 24 MiB of data in 8 MiB ranges: 3 watermarks inside the data, then the end; each after a flush.
    expect(marks.slice(0, 3)).toEqual([8 * MiB, 16 * MiB, 24 * MiB])
    expect(marks[marks.length - 1]).toBe(48 * MiB)
    for (let i = 0; i < log.length; i++) if (log[i].startsWith('w ')) expect(log[i - 1]).toBe('flush')
    expect(done[done.length - 1]).toBe(48 * MiB)
    for (let i = 1; i < done.length; i++) expect(done[i]).toBeGreaterThanOrEqual(done[i - 1])
    // The raw reader maps the file's holes (qemu-img map): the sparse tail is never read.
    expect(res.bytes_read).toBe(24 * MiB)
    expect(res.bytes_zero).toBe(24 * MiB)
    expect(statSync(c.v.path).blocks * 512).toBeLessThanOrEqual(24 * MiB + 64 * KiB)
  })

  /**
   * A wrapper around the real qemu-img (test double for timing only: the bytes are still moved by
   * qemu-img) that logs `start <offset>` / `end <offset>` of each range to `log` and, for the range
   * at offset `slowOffset`, sleeps `slowSeconds` before copying; every other range sleeps 0.3 s.
   * It sleeps in 0.1 s steps, so a wrapper killed while it waits leaves no sleep behind for long
   * (its qemu-img never starts).
   */
  const slowQemuImg = (name: string, slowOffset: number, slowSeconds: number): { bin: string; log: string } => {
    const bin = path.join(tmp.dir, `${name}-qemu-img`)
    const log = path.join(tmp.dir, `${name}-qemu-img.log`)
    writeFileSync(
      bin,
      [
        '#!/bin/sh',
        `off=$(printf '%s' "$*" | sed -n 's/.*"offset":\\([0-9]*\\).*/\\1/p')`,
        `echo "start $off" >> ${log}`,
        `if [ "$off" = ${slowOffset} ]; then n=${Math.round(slowSeconds * 10)}; else n=3; fi`,
        'while [ "$n" -gt 0 ]; do sleep 0.1; n=$((n - 1)); done',
        'qemu-img "$@"; rc=$?',
        `echo "end $off" >> ${log}`,
        'exit $rc',
        '',
      ].join('\n'),
      { mode: 0o755 },
    )
    return { bin, log }
  }

  test('two qemu-img at once (asked for; the default into a block device on two cores): ranges overlap in time, watermarks ascend over ranges done, the copy is exact', async () => {
    const qi = slowQemuImg('qpar', -1, 0)
    const { res, log, marks } = await loggedCopy(await rawCopy('qpar', 48 * MiB, 32 * MiB), { flushEveryBytes: 8 * MiB, qemuProcesses: 2, qemuImgPath: qi.bin })
    expect(res.bytes_read).toBe(32 * MiB)
    // The second range starts before the first ends (each qemu-img takes at least 0.3 s).
    const events = readFileSync(qi.log, 'utf8').trim().split('\n')
    // (the two wrappers start at once: their lines may come in either order)
    expect(events.slice(0, 2).sort()).toEqual(['start 0', `start ${8 * MiB}`].sort())
    expect(events.filter((e) => e.startsWith('start')).length).toBe(4)
    for (let i = 1; i < marks.length; i++) expect(marks[i]).toBeGreaterThanOrEqual(marks[i - 1])
    for (const m of marks) expect(m % (8 * MiB)).toBe(0)
    expect(marks[marks.length - 1]).toBe(48 * MiB)
    for (let i = 0; i < log.length; i++) if (log[i].startsWith('w ')) expect(log[i - 1]).toBe('flush')
  })

  test('a range done while a lower one still runs moves no watermark past the lower one', async () => {
    const { src, q, v } = await rawCopy('qlag', 32 * MiB, 32 * MiB)
    // The first range's qemu-img takes 2 s; the three above it finish in that time.
    const qi = slowQemuImg('qlag', 0, 2)
    const marks: Array<{ w: number; firstDone: boolean }> = []
    await copyDisk(q, v, {
      engine: 'qemu-img',
      from: 0,
      signal: new AbortController().signal,
      flushEveryBytes: 8 * MiB,
      qemuProcesses: 2,
      qemuImgPath: qi.bin,
      onProgress() {},
      async onWatermark(w) {
        marks.push({ w, firstDone: readFileSync(qi.log, 'utf8').includes('end 0\n') })
      },
    })
    await v.close()
    await q.close()
    expect(sha(readFileSync(v.path))).toBe(sha(src.bytes))
    const events = readFileSync(qi.log, 'utf8').trim().split('\n')
    // Ranges at 8 and 16 MiB ran and ended while the one at 0 slept.
    expect(events.indexOf(`end ${16 * MiB}`)).toBeLessThan(events.indexOf('end 0'))
    // No watermark before the range at 0 was done; the first one covers the ranges done above it.
    expect(marks.length).toBeGreaterThan(0)
    for (const m of marks) expect(m.firstDone).toBe(true)
    expect(marks[0].w).toBeGreaterThanOrEqual(24 * MiB)
  })

  test('past the page-cache budget qemu-img writes the volume with -t none: none of its pages stay in the page cache', async () => {
    // No page-cache budget: every range goes -t none.
    const { src, q, v } = await rawCopy('qdirect', 16 * MiB, 8 * MiB, 0)
    await copyDisk(q, v, { from: 0, signal: new AbortController().signal, engine: 'qemu-img', ...noop })
    await q.close()
    // Bytes of the volume in the page cache (fincore, util-linux), before anything reads it back.
    expect(Number(execFileSync('fincore', ['-b', '-n', '--raw', '-o', 'RES', v.path], { encoding: 'utf8' }).trim())).toBe(0)
    await v.close()
    expect(sha(readFileSync(v.path))).toBe(sha(src.bytes))
  })

  test('while qemu-img writes a range, the volume is flushed again and again (writeback), yet watermarks come only at range ends', async () => {
    // 24 MiB of data at 16 MiB/s: one range that qemu-img writes for about 1.5 s.
    const { log } = await loggedCopy(await rawCopy('q3', 32 * MiB, 24 * MiB), { maxBytesPerSecond: 16 * MiB })
    // One range (under the 256 MiB interval): its checkpoint, the final flush, and the writeback
    // flushes during the copy before them (at least one per 10 ms pause over about 1.5 s).
    expect(log.filter((l) => l.startsWith('w '))).toEqual([`w ${32 * MiB}`, `w ${32 * MiB}`])
    expect(log.indexOf(`w ${32 * MiB}`)).toBeGreaterThan(10)
    expect(log.slice(0, log.indexOf(`w ${32 * MiB}`)).every((l) => l === 'flush')).toBe(true)
  })

  test('cancel kills the running qemu-img child at once: E_MIG_CANCELLED, no process left', async () => {
    const { q, v } = await rawCopy('q2', 64 * MiB, 64 * MiB)
    const ac = new AbortController()
    const pids: number[] = []
    const before = pgrep('-x qemu-img')
    const t0 = performance.now()
    const p = copyDisk(q, v, { engine: 'qemu-img', from: 0, signal: ac.signal, maxBytesPerSecond: 4 * MiB, onProgress() {}, async onWatermark() {} })
    // The capped qemu-img runs for seconds; find it, then cancel.
    for (let i = 0; i < 100 && pids.length === 0; i++) {
      await new Promise((res) => setTimeout(res, 20))
      const now = pgrep('-x qemu-img')
      pids.push(...now.filter((x) => !before.includes(x)))
    }
    expect(pids.length).toBeGreaterThan(0)
    ac.abort()
    const err = await p.catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
    expect(performance.now() - t0).toBeLessThan(5000)
    for (const pid of pids) expect(alive(pid)).toBe(false)
    await v.close()
    await q.close()
  })

  test('interrupted while a lower range still runs and a higher one is done: the resumed copy starts at the watermark below both, reads only above it, ends bit-exact', async () => {
    const size = 48 * MiB
    const { src, q, v } = await rawCopy('qresume', size, size)
    // The second range's qemu-img (at 8 MiB) waits 3 s before copying; the first and the third finish meanwhile.
    const qi = slowQemuImg('qresume', 8 * MiB, 3)
    const ac = new AbortController()
    let durable = 0
    const p = copyDisk(q, v, {
      engine: 'qemu-img',
      from: 0,
      signal: ac.signal,
      flushEveryBytes: 8 * MiB,
      qemuProcesses: 2,
      qemuImgPath: qi.bin,
      onProgress() {},
      async onWatermark(w) {
        durable = w
      },
    })
    // Cancel once the range above the slow one is done: its bytes are on the volume, below no watermark.
    const log = () => readFileSync(qi.log, { encoding: 'utf8', flag: 'a+' })
    for (let i = 0; i < 200 && !log().includes(`end ${16 * MiB}\n`); i++) await sleep(20)
    await sleep(100) // its checkpoint, were the engine to take one
    ac.abort()
    expect((await p.catch((e) => e)).code).toBe('E_MIG_CANCELLED')
    await v.close()
    // A qemu-img whose wrapper was killed mid-copy finishes on its own: wait for it before resuming.
    const stray = () => pgrep('-f "^qemu-img convert.*var-qresume"')
    for (let i = 0; i < 100 && stray().length > 0; i++) await sleep(50)
    expect(stray()).toEqual([])
    expect(log()).not.toContain(`end ${8 * MiB}\n`)
    expect(durable).toBe(8 * MiB)
    // A new attempt on the same volume (reopened, as a restarted worker does) from the watermark:
    // it reads exactly the data above it, and the range the slow qemu-img never wrote is filled.
    const sink = new FileSink({ dataDir: path.join(tmp.dir, 'var-qresume') })
    const v2 = await sink.create('qresume', 'disk0', size)
    const res = await copyDisk(q, v2, {
      engine: 'qemu-img',
      from: durable,
      signal: new AbortController().signal,
      flushEveryBytes: 8 * MiB,
      qemuProcesses: 2,
      ...noop,
    })
    await v2.close()
    await q.close()
    expect(sha(readFileSync(v2.path))).toBe(sha(src.bytes))
    expect(res.bytes_read).toBe(size - durable)
  })

  test('which engine auto picks: qemu-img for a qemu-nbd reader, node for a raw file (both with a qemu node), node without a digest-free qemu side', async () => {
    const sink = new FileSink({ dataDir: path.join(tmp.dir, 'var-auto') })
    const v = await sink.create('auto', 'disk0', SIZE)
    const nbd = await nbdQcow()
    const raw = await openDiskReader({ ...qcowDisk(), disk_format: 'raw', source: { path: RAW } })
    try {
      expect(nbd.preferQemuImg).toBe(true)
      expect(raw.qemuNode).toBeDefined()
      expect(usesQemuImg(nbd, v, {})).toBe(true)
      expect(usesQemuImg(raw, v, {})).toBe(false)
      expect(usesQemuImg(raw, v, { engine: 'qemu-img' })).toBe(true)
      expect(usesQemuImg(nbd, v, { engine: 'node' })).toBe(false)
      expect(usesQemuImg(nbd, v, { digest: { algorithm: 'sha256', hex: '00' } })).toBe(false)
      expect(usesQemuImg(nbd, { ...v, qemuTarget: undefined }, {})).toBe(false)
    } finally {
      await nbd.close()
      await raw.close()
      await v.close()
    }
  })

  test('qemu-img processes at once: QEMU_IMG_PROCESSES into a block device, 1 into an image file, 1 under a cap, a request wins (1..4)', () => {
    expect(QEMU_IMG_PROCESSES).toBe(Math.min(2, availableParallelism()))
    expect(qemuImgProcesses({ inOrder: false }, 0)).toBe(QEMU_IMG_PROCESSES)
    expect(qemuImgProcesses({ inOrder: true }, 0)).toBe(1)
    expect(qemuImgProcesses({ inOrder: false }, 16 * MiB)).toBe(1)
    expect(qemuImgProcesses({ inOrder: false }, 16 * MiB, 3)).toBe(1)
    expect(qemuImgProcesses({ inOrder: true }, 0, 3)).toBe(3)
    expect(qemuImgProcesses({ inOrder: true }, 0, 9)).toBe(4)
    expect(qemuImgProcesses({ inOrder: false }, 0, 0)).toBe(1)
  })

  test('cancel with two qemu-img running kills both: E_MIG_CANCELLED, no process left', async () => {
    const { q, v } = await rawCopy('qpar-cancel', 32 * MiB, 32 * MiB)
    // A qemu-img that never ends (test double: it only waits, under a name to find it by).
    const bin = path.join(tmp.dir, 'qpar-cancel-qemu-img')
    const tag = `mig-test-qemu-${process.pid}`
    writeFileSync(bin, `#!/bin/bash\nexec -a ${tag} sleep 60\n`, { mode: 0o755 })
    const ac = new AbortController()
    const p = copyDisk(q, v, { engine: 'qemu-img', from: 0, signal: ac.signal, flushEveryBytes: 8 * MiB, qemuProcesses: 2, qemuImgPath: bin, ...noop })
    const running = () => pgrep(`-f "^${tag}"`)
    let pids: number[] = []
    for (let i = 0; i < 100 && pids.length < 2; i++) {
      await new Promise((res) => setTimeout(res, 20))
      pids = running()
    }
    ac.abort()
    const err = await p.catch((e) => e)
    const left = running()
    if (left.length > 0) execFileSync('pkill', ['-KILL', '-f', `^${tag}`]) // never leave them behind, even when failing
    await v.close()
    await q.close()
    expect(pids.length).toBe(2)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
    expect(left).toEqual([])
    for (const pid of pids) expect(alive(pid)).toBe(false)
  })

  /** Copies a raw source of `bytes` of data under the cap; returns the seconds it took, after checking the copy is exact. */
  async function cappedCopy(name: string, bytes: number, rate: number, flushEveryBytes?: number): Promise<number> {
    const src = rawSource(`${name}.raw`, bytes, bytes)
    const sink = new FileSink({ dataDir: path.join(tmp.dir, `var-${name}`) })
    const q = await openDiskReader(rawDisk(src.path, bytes))
    const v = await sink.create(name, 'disk0', bytes)
    const t0 = performance.now()
    await copyDisk(q, v, {
      engine: 'qemu-img',
      from: 0,
      signal: new AbortController().signal,
      flushEveryBytes,
      maxBytesPerSecond: rate,
      onProgress() {},
      async onWatermark() {},
    })
    const sec = (performance.now() - t0) / 1000
    await v.close()
    await q.close()
    expect(sha(readFileSync(v.path))).toBe(sha(src.bytes))
    return sec
  }

  test('the bandwidth cap holds qemu-img to it (32 MiB at 16 MiB/s takes at least 1.5 s) and the copy stays exact', async () => {
    expect(await cappedCopy('q-cap', 32 * MiB, 16 * MiB)).toBeGreaterThanOrEqual(1.5)
  })

  test('the cap also holds across ranges (each qemu-img starts with a fresh budget): 8 MiB in 1 MiB ranges at 4 MiB/s takes at least 1.5 s', async () => {
    expect(await cappedCopy('q-cap2', 8 * MiB, 4 * MiB, MiB)).toBeGreaterThanOrEqual(1.5)
  })

  test('a resumed volume holding stale bytes above the watermark ends bit-exact: the zero areas of the range are discarded, not left stale', async () => {
    const src = rawSource('q-stale.raw', 16 * MiB, 4 * MiB)
    const sink = new FileSink({ dataDir: path.join(tmp.dir, 'var-q4') })
    const v0 = await sink.create('q4', 'disk0', 16 * MiB)
    await v0.write(0, randomBytes(16 * MiB)) // garbage everywhere, as a killed copy could leave
    await v0.close()
    const v = await sink.create('q4', 'disk0', 16 * MiB)
    const q = await openDiskReader(rawDisk(src.path, 16 * MiB))
    await copyDisk(q, v, { engine: 'qemu-img', from: 0, signal: new AbortController().signal, onProgress() {}, async onWatermark() {} })
    await v.close()
    await q.close()
    expect(sha(readFileSync(v.path))).toBe(sha(src.bytes))
  })
})

describe('copyDisk: reads in flight', () => {
  /** A 64 MiB reader of data (no zeros) that counts its reads in flight; `readAhead` as given. */
  function counting(readAhead?: number): DiskReader & { most: number } {
    let open = 0
    const r = {
      size: 64 * MiB,
      readAhead,
      most: 0,
      async *extents(from: number): AsyncIterable<DiskExtent> {
        yield { offset: from, length: 64 * MiB - from, zero: false }
      },
      async read(_offset: number, length: number, into?: Buffer) {
        open++
        r.most = Math.max(r.most, open)
        await sleep(5)
        open--
        return (into ?? Buffer.allocUnsafe(length)).subarray(0, length).fill(1)
      },
      async close() {},
    }
    return r
  }
  const run = (r: DiskReader, readAhead?: number) =>
    copyDisk(r, memVolume(64 * MiB), { from: 0, signal: new AbortController().signal, onProgress() {}, async onWatermark() {}, engine: 'node', readAhead })

  test("the reader's readAhead, else 4; the copy's own option wins", async () => {
    const one = counting(1)
    await run(one)
    const dflt = counting()
    await run(dflt)
    const asked = counting(1)
    await run(asked, 3)
    expect([one.most, dflt.most, asked.most]).toEqual([1, 4, 3])
  })

  test('writes of up to WRITE_DEPTH chunks are queued on the volume at once (a slow volume never waits for the loop); the copy asks fewer when told', async () => {
    /** A memory volume whose writes take 50 ms each (reads take 5 ms) and that counts its writes in flight. */
    const slow = () => {
      const v = memVolume(64 * MiB)
      let open = 0
      const most = { n: 0 }
      const write = v.write.bind(v)
      v.write = async (offset: number, buf: Buffer) => {
        open++
        most.n = Math.max(most.n, open)
        await sleep(50)
        open--
        await write(offset, buf)
      }
      return { v, most }
    }
    const dflt = slow()
    await copyDisk(counting(), dflt.v, { from: 0, signal: new AbortController().signal, onProgress() {}, async onWatermark() {}, engine: 'node' })
    const asked = slow()
    await copyDisk(counting(), asked.v, {
      from: 0,
      signal: new AbortController().signal,
      onProgress() {},
      async onWatermark() {},
      engine: 'node',
      writeDepth: 2,
    })
    // At most the depth's chunks and the one just issued while the copy waits for the oldest;
    // the default queues more than a depth of 2 allows.
    expect(asked.most.n).toBe(3)
    expect(dflt.most.n).toBeGreaterThan(3)
    expect(dflt.most.n).toBeLessThanOrEqual(WRITE_DEPTH + 1)
    expect(dflt.v.bytes.every((b) => b === 1)).toBe(true)
  })
})
