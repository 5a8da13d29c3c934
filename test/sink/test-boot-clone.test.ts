/**
 * The sinks' test boot clones (docs/test-boot.md):
 * - file sink: real qcow2 overlays made with qemu-img over the raw images; a write into the
 *   overlay (qemu-io) never reaches the raw image; `remove` deletes them;
 * - zvol sink: ZFS cannot be installed here, so `zfs` is a test double named as such
 *   (`zfs-test-double`: records its argv; `clone` links the clone's device path to a file, `destroy
 *   -r` of the clone parent removes the links), which checks the exact zfs commands: one recursive
 *   snapshot (every volume at the same instant), one clone per volume, the removal in dependency
 *   order (clones before their snapshot), and that nothing there to remove is fine.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { FileSink } from '../../lib/sink/file.ts'
import { ZvolSink } from '../../lib/sink/zvol.ts'
import { tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-i48-clone-')
afterAll(() => tmp.cleanup())

describe('FileSink.testBootClone', () => {
  test('qcow2 overlays backed by the raw images; the clone writes only the overlay; remove deletes them', async () => {
    const sink = new FileSink({ dataDir: tmp.dir })
    const v = await sink.create('job-a', 'Hard disk 1', 4 * MiB)
    await v.write(0, Buffer.alloc(MiB, 0x5a))
    await v.flush()
    await v.close()
    const clone = sink.testBootClone('job-a')
    expect(clone.holdsWrites).toBe(true)
    const disks = await clone.take(['Hard disk 1'])
    expect(disks).toEqual([
      {
        label: 'Hard disk 1',
        path: path.join(sink.jobDir('job-a'), '.testboot', 'Hard_disk_1.qcow2'),
        format: 'qcow2',
        backing: sink.volumePath('job-a', 'Hard disk 1'),
      },
    ])
    const info = JSON.parse(execFileSync('qemu-img', ['info', '--output=json', disks[0]!.path], { encoding: 'utf8' }))
    expect([info.format, info['backing-filename'], info['backing-filename-format'], info['virtual-size']]).toEqual([
      'qcow2',
      sink.volumePath('job-a', 'Hard disk 1'),
      'raw',
      4 * MiB,
    ])
    const raw = readFileSync(sink.volumePath('job-a', 'Hard disk 1'))
    execFileSync('qemu-io', ['-f', 'qcow2', '-c', 'write -P 0x11 0 65536', disks[0]!.path])
    expect(readFileSync(sink.volumePath('job-a', 'Hard disk 1')).equals(raw)).toBe(true)
    // the clone reads its backing where it did not write
    const read = execFileSync('qemu-io', ['-f', 'qcow2', '-c', 'read -P 0x5a 65536 65536', '-c', 'read -P 0x11 0 65536', disks[0]!.path], { encoding: 'utf8' })
    expect(read).not.toContain('Pattern verification failed')
    await clone.remove()
    expect(existsSync(path.join(sink.jobDir('job-a'), '.testboot'))).toBe(false)
    await clone.remove() // idempotent
    await sink.remove('job-a')
  })

  test('a missing volume: E_MIG_DISK_WRITE_FAILED naming the overlay', async () => {
    const sink = new FileSink({ dataDir: tmp.dir })
    await sink.create('job-b', 'd0', MiB).then((v) => v.close())
    const err = await sink
      .testBootClone('job-b')
      .take(['nope'])
      .catch((e) => e)
    expect(err.code).toBe('E_MIG_DISK_WRITE_FAILED')
    expect(err.message).toContain('nope.qcow2')
  })
})

describe('ZvolSink.testBootClone (zfs-test-double)', () => {
  const root = path.join(tmp.dir, 'zvol')
  const log = path.join(root, 'zfs.log')
  const dev = path.join(root, 'dev', 'zvol')
  const zfsDouble = path.join(root, 'zfs-test-double')
  mkdirSync(root, { recursive: true })
  writeFileSync(path.join(root, 'target'), '')
  writeFileSync(
    zfsDouble,
    `#!/bin/sh
printf '%s\\n' "$*" >> ${JSON.stringify(log)}
for last in "$@"; do :; done
case "$1" in
  clone) mkdir -p "${dev}/$(dirname "$last")" && ln -s ${JSON.stringify(path.join(root, 'target'))} "${dev}/$last";;
  destroy)
    case "$last" in *@*) [ -e ${JSON.stringify(path.join(root, 'snap'))} ] || { echo "could not find any snapshots to destroy; check snapshot names." >&2; exit 1; }; rm -f ${JSON.stringify(path.join(root, 'snap'))}; exit 0;; esac
    [ -e "${dev}/$last" ] || { echo "cannot open '$last': dataset does not exist" >&2; exit 1; }
    rm -rf "${dev}/$last";;
  snapshot) touch ${JSON.stringify(path.join(root, 'snap'))};;
esac
`,
    { mode: 0o755 },
  )
  const calls = () => readFileSync(log, 'utf8').trim().split('\n')

  test('one recursive snapshot, a clone per volume, removal clones first; nothing to remove is fine', async () => {
    const sink = new ZvolSink({ pool: 'tank', appliance: 'migrator', zfsPath: zfsDouble, devPrefix: dev })
    const clone = sink.testBootClone('job-z')
    expect(clone.holdsWrites).toBe(false)
    const disks = await clone.take(['Hard disk 1', 'Hard disk 2'])
    expect(disks.map((d) => [d.path, d.format, d.backing])).toEqual([
      [path.join(dev, 'tank/migrator/migrations/job-z-testboot/Hard_disk_1'), 'raw', null],
      [path.join(dev, 'tank/migrator/migrations/job-z-testboot/Hard_disk_2'), 'raw', null],
    ])
    await clone.remove()
    await clone.remove()
    expect(calls()).toEqual([
      // a stale clone of a crash is removed first (none here)
      'destroy -r tank/migrator/migrations/job-z-testboot',
      'destroy -r tank/migrator/migrations/job-z@testboot',
      'snapshot -r tank/migrator/migrations/job-z@testboot',
      'clone -p tank/migrator/migrations/job-z/Hard_disk_1@testboot tank/migrator/migrations/job-z-testboot/Hard_disk_1',
      'clone -p tank/migrator/migrations/job-z/Hard_disk_2@testboot tank/migrator/migrations/job-z-testboot/Hard_disk_2',
      'destroy -r tank/migrator/migrations/job-z-testboot',
      'destroy -r tank/migrator/migrations/job-z@testboot',
      'destroy -r tank/migrator/migrations/job-z-testboot',
      'destroy -r tank/migrator/migrations/job-z@testboot',
    ])
    expect(existsSync(path.join(dev, 'tank/migrator/migrations/job-z-testboot'))).toBe(false)
  })
})
