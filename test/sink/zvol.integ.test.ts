/**
 * Zvol sink. ZFS cannot be installed here, so `zfs` is replaced by a test double named as such
 * (`zfs-test-double`: records its argv, and for `create` links `<root>/dev/zvol/<dataset>` to a
 * real loop device), while the block-device path (positioned writes, blkdiscard, zero-fill
 * fallback, fsync) runs for real on that loop device.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, existsSync, lstatSync, openSync, readFileSync, readSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { copyDisk } from '../../lib/pipeline/copy-disk.ts'
import { ZvolSink } from '../../lib/sink/zvol.ts'
import { tempDir } from '../helpers/tmp.ts'
import { memReader } from '../helpers/disk-reader.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-zvol-')
const root = tmp.dir
const zfsLog = path.join(root, 'zfs.log')
const discardLog = path.join(root, 'blkdiscard.log')
const zfsDouble = path.join(root, 'zfs-test-double')
const failingDiscard = path.join(root, 'blkdiscard-test-double')
let loop = ''

beforeAll(() => {
  const backing = path.join(root, 'backing.img')
  execFileSync('truncate', ['-s', '64M', backing])
  loop = execFileSync('losetup', ['-f', '--show', backing], { encoding: 'utf8' }).trim()
  // zfs-test-double: logs argv (one JSON array per line); `create ... <dataset>` links the
  // dataset's device to the loop device; `destroy -r <dataset>` removes the links below it.
  writeFileSync(
    zfsDouble,
    `#!/bin/sh
log=${JSON.stringify(zfsLog)}
dev=${JSON.stringify(path.join(root, 'dev', 'zvol'))}
printf '[' >> "$log"; sep=''; for a in "$@"; do printf '%s"%s"' "$sep" "$a" >> "$log"; sep=','; done; printf ']\\n' >> "$log"
for last in "$@"; do :; done
case "$1" in
  create)
    case "$last" in *fail*) echo "cannot create '$last': out of space" >&2; exit 1;; esac
    mkdir -p "$dev/$(dirname "$last")" && ln -s ${JSON.stringify(loop)} "$dev/$last";;
  destroy)
    case "$last" in *@*) exit 0;; esac
    [ -e "$dev/$last" ] || { echo "cannot open '$last': dataset does not exist" >&2; exit 1; }
    rm -rf "$dev/$last";;
  snapshot)
    case "$last" in *fail*) echo "cannot create snapshot '$last': out of space" >&2; exit 1;; esac;;
  list)
    echo "$last/disk0"; echo "$last/disk1";;
esac
`,
    { mode: 0o755 },
  )
  writeFileSync(
    failingDiscard,
    `#!/bin/sh\necho "$@" >> ${JSON.stringify(discardLog)}\necho 'blkdiscard: BLKDISCARD ioctl failed: Operation not supported' >&2\nexit 1\n`,
    { mode: 0o755 },
  )
})

afterAll(() => {
  if (loop) execFileSync('losetup', ['-d', loop])
  tmp.cleanup()
})

const zfsCalls = (): string[][] =>
  existsSync(zfsLog)
    ? readFileSync(zfsLog, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l))
    : []
function readDev(offset: number, length: number): Buffer {
  const fd = openSync(loop, 'r')
  const b = Buffer.alloc(length)
  readSync(fd, b, 0, length, offset)
  closeSync(fd)
  return b
}

describe('ZvolSink', () => {
  const sink = () => new ZvolSink({ pool: 'tank', appliance: 'migrator', zfsPath: zfsDouble, devPrefix: path.join(root, 'dev', 'zvol') })

  test('create runs the exact zfs create argv, waits for the device and writes the block device', async () => {
    const s = sink()
    const v = await s.create('job-1', 'Hard disk 1', 10 * MiB + 1)
    expect(zfsCalls()).toEqual([
      ['create', '-p', '-s', '-V', String(10 * MiB + 65536), '-o', 'volblocksize=64K', '-o', 'compression=lz4', 'tank/migrator/migrations/job-1/Hard_disk_1'],
    ])
    expect(v.path).toBe(path.join(root, 'dev', 'zvol', 'tank/migrator/migrations/job-1/Hard_disk_1'))
    expect(lstatSync(v.path).isSymbolicLink()).toBe(true)
    expect(v.blockSize).toBe(65536)
    // A block device: back-to-back writeback flushes only while its writes go through the page cache.
    expect(v.writeback).toBe(true)
    // A real copy through the loop device: 8 MiB with a zero stretch in the middle.
    const src = Buffer.concat([randomBytes(3 * MiB), Buffer.alloc(2 * MiB), randomBytes(3 * MiB)])
    const res = await copyDisk(memReader(src), v, { from: 0, signal: new AbortController().signal, onProgress() {}, async onWatermark() {} })
    await v.close()
    expect(res.bytes_written).toBe(6 * MiB)
    expect(res.bytes_zero).toBe(2 * MiB)
    expect(readDev(0, 8 * MiB).equals(src)).toBe(true)
  })

  test('past its page-cache budget a block device wants no more writeback flushes (its writes go O_DIRECT)', async () => {
    const s = new ZvolSink({ pool: 'tank', appliance: 'migrator', zfsPath: zfsDouble, devPrefix: path.join(root, 'dev', 'zvol'), pageCacheBytes: 4 * MiB })
    const v = await s.create('job-wb', 'd', 16 * MiB)
    await v.write(0, randomBytes(2 * MiB))
    expect(v.writeback).toBe(true)
    await v.write(2 * MiB, randomBytes(2 * MiB))
    expect(v.writeback).toBe(false)
    await v.close()
    await s.remove('job-wb')
  })

  test('a resumed job reuses the existing zvol; zero runs over old data are discarded with blkdiscard', async () => {
    const s = sink()
    const before = zfsCalls().length
    const v = await s.create('job-1', 'Hard disk 1', 10 * MiB + 1)
    expect(zfsCalls().length).toBe(before) // device exists: no second zfs create
    expect(readDev(0, 16).equals(Buffer.alloc(16))).toBe(false)
    await v.zero(0, 2 * MiB + 100) // 64 KiB aligned middle discarded, tail zero-filled
    await v.flush()
    await v.close()
    expect(s.discardFailed).toBe(false)
    expect(readDev(0, 2 * MiB + 100).equals(Buffer.alloc(2 * MiB + 100))).toBe(true)
  })

  test('when blkdiscard fails the sink zero-fills, and remembers not to try again', async () => {
    const s = new ZvolSink({
      pool: 'tank',
      appliance: 'migrator',
      zfsPath: zfsDouble,
      devPrefix: path.join(root, 'dev', 'zvol'),
      blkdiscardPath: failingDiscard,
    })
    const v = await s.create('job-1', 'Hard disk 1', 10 * MiB + 1)
    await v.write(4 * MiB, randomBytes(4 * MiB))
    await v.zero(4 * MiB, 2 * MiB)
    expect(s.discardFailed).toBe(true)
    await v.zero(6 * MiB, 2 * MiB)
    await v.flush()
    await v.close()
    expect(readFileSync(discardLog, 'utf8').trim().split('\n')).toEqual([`--offset ${4 * MiB} --length ${2 * MiB} ${v.path}`])
    expect(readDev(4 * MiB, 4 * MiB).equals(Buffer.alloc(4 * MiB))).toBe(true)
  })

  test('a device smaller than the capacity is E_MIG_DISK_WRITE_FAILED', async () => {
    const err = await sink()
      .create('job-2', 'big', 128 * MiB)
      .catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(err.message).toContain('less than the capacity')
  })

  test('a failing zfs create is E_MIG_DISK_WRITE_FAILED carrying its stderr', async () => {
    const err = await sink()
      .create('job-3', 'fail', MiB)
      .catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(err.message).toContain('out of space')
  })

  test('remove runs zfs destroy -r on the job dataset; a job with nothing left is fine', async () => {
    const s = sink()
    await s.remove('job-1')
    expect(zfsCalls().at(-1)).toEqual(['destroy', '-r', 'tank/migrator/migrations/job-1'])
    expect(existsSync(path.join(root, 'dev', 'zvol', 'tank/migrator/migrations/job-1'))).toBe(false)
    await s.remove('job-1')
    expect(zfsCalls().at(-1)).toEqual(['destroy', '-r', 'tank/migrator/migrations/job-1'])
  })

  test('the pre-V2V snapshot: zfs snapshot -r, rollback of every volume, destroy of the snapshot', async () => {
    const snap = sink().snapshot('job-snap')
    const before = zfsCalls().length
    await snap.take()
    await snap.rollback()
    await snap.release()
    const ds = 'tank/migrator/migrations/job-snap'
    expect(zfsCalls().slice(before)).toEqual([
      ['snapshot', '-r', `${ds}@pre-v2v`],
      ['list', '-H', '-o', 'name', '-t', 'volume', '-r', ds],
      ['rollback', '-r', `${ds}/disk0@pre-v2v`],
      ['rollback', '-r', `${ds}/disk1@pre-v2v`],
      ['destroy', '-r', `${ds}@pre-v2v`],
    ])
    const err = await sink()
      .snapshot('job-fail')
      .take()
      .catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(err.message).toContain('out of space')
  })

  test('pool and appliance names that could be options are refused', () => {
    expect(() => new ZvolSink({ pool: '-o', appliance: 'migrator' })).toThrow(MigError)
    expect(() => new ZvolSink({ pool: 'tank', appliance: 'a b' })).toThrow(MigError)
  })
})
