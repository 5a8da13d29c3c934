/**
 * A failed fsync, for real: a loop device over a sparse 16 MiB file on a 2 MiB tmpfs takes
 * buffered writes, and its writeback fails (the backing file system is full), so fsync returns
 * EIO once; the kernel's next fsync of the same file returns success although those pages never
 * reached the device. The volume must keep failing its flushes (a checkpoint after a failed
 * writeback flush would otherwise move the watermark over lost data), and a copy into it must
 * fail without a watermark over bytes the device does not hold.
 */
import { afterAll, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs'
import { open } from 'node:fs/promises'
import * as path from 'node:path'
import { copyDisk } from '../../lib/pipeline/copy-disk.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { HandleVolume } from '../../lib/sink/volume.ts'
import { manifestDisk } from '../helpers/reader-fixtures.ts'
import { migErrorOf } from '../helpers/mig-error.ts'
import { tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-fsync-failure-')
const mounts: string[] = []
const loops: string[] = []
const volumes: HandleVolume[] = []

afterAll(async () => {
  // Volumes a failed assertion left open, then the devices (detached once closed) and the
  // tmpfs mounts (lazily: the loop driver lets go of its backing file as it detaches).
  for (const v of volumes) await v.close()
  for (const l of loops) execFileSync('losetup', ['-d', l])
  for (const m of mounts) execFileSync('umount', ['-l', m])
  tmp.cleanup()
})

/**
 * A loop device of `deviceBytes` over a sparse file on a tmpfs of its own of `roomBytes`: the
 * writeback of anything past `roomBytes` fails. Returns the device and its backing file.
 */
function failingDevice(name: string, roomBytes: number, deviceBytes: number): { dev: string; backing: string } {
  const mnt = path.join(tmp.dir, name)
  mkdirSync(mnt)
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${roomBytes}`, 'tmpfs', mnt])
  mounts.push(mnt)
  const backing = path.join(mnt, 'device.img')
  execFileSync('truncate', ['-s', String(deviceBytes), backing])
  const dev = execFileSync('losetup', ['-f', '--show', backing], { encoding: 'utf8' }).trim()
  loops.push(dev)
  return { dev, backing }
}

/** A volume over `dev` as the zvol sink opens a block device (page cache first, fresh). */
async function volumeOn(dev: string, size: number): Promise<HandleVolume> {
  const v = new HandleVolume(await open(dev, 'r+'), dev, size, 64 * 1024, { fresh: true })
  volumes.push(v)
  return v
}

test('once an fsync failed with EIO, every later flush fails too, though the kernel reports success again', async () => {
  const { dev } = failingDevice('sticky', 2 * MiB, 16 * MiB)
  const v = await volumeOn(dev, 16 * MiB)
  await v.write(4 * MiB, randomBytes(4 * MiB))
  const first = await migErrorOf(v.flush())
  expect(first.code).toBe('E_MIG_DISK_WRITE_FAILED')
  expect(first.message).toContain(dev)
  expect(first.message).toContain('fsync')
  const again = await migErrorOf(v.flush())
  expect(again.code).toBe('E_MIG_DISK_WRITE_FAILED')
  expect(again.message).toBe(first.message)
  // What a volume without the rule would have believed: the kernel's next fsync succeeds.
  const fd = openSync(dev, 'r+')
  fsyncSync(fd)
  closeSync(fd)
  await v.close()
})

test('two flushes called at once over a failed writeback both fail (the kernel tells only one of two fsyncs at once)', async () => {
  const { dev } = failingDevice('twice', 2 * MiB, 16 * MiB)
  const v = await volumeOn(dev, 16 * MiB)
  await v.write(4 * MiB, randomBytes(8 * MiB))
  const both = await Promise.allSettled([v.flush(), v.flush()])
  expect(both.map((r) => r.status)).toEqual(['rejected', 'rejected'])
  await v.close()
})

test('a copy into a device whose writeback fails stops with E_MIG_DISK_WRITE_FAILED; every watermark it reported is on the device', async () => {
  // Room for 40 MiB: the first checkpoints (every 4 MiB chunk; at most seven chunks are ahead
  // of one) reach the device, a later writeback or checkpoint flush fails.
  const size = 128 * MiB
  const { dev, backing } = failingDevice('copy', 40 * MiB, size)
  const src = path.join(tmp.dir, 'src.raw')
  const data = randomBytes(size)
  writeFileSync(src, data)
  const reader = await openDiskReader(manifestDisk('raw', { path: src }, size))
  const v = await volumeOn(dev, size)
  const marks: number[] = []
  const err = await migErrorOf(
    copyDisk(reader, v, {
      from: 0,
      signal: new AbortController().signal,
      engine: 'node',
      flushEveryBytes: MiB,
      onProgress() {},
      async onWatermark(w) {
        marks.push(w)
      },
    }),
  )
  await v.close()
  await reader.close()
  expect(err.code).toBe('E_MIG_DISK_WRITE_FAILED')
  expect(marks.length).toBeGreaterThan(0)
  expect(marks[marks.length - 1]).toBeLessThanOrEqual(40 * MiB)
  // The backing file is what reached the device: everything below each watermark is there.
  const onDevice = readFileSync(backing)
  for (const w of marks) expect(onDevice.subarray(0, w).equals(data.subarray(0, w))).toBe(true)
})
