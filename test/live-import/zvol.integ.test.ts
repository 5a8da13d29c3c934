/**
 * Live import into the zvol sink's block path: the boot-sector guest of boot-disk.integ (a 64 MiB
 * disk, 48 MiB of random data behind the boot sector, packed as qcow2) imported through the HTTP
 * API with `MIGRATOR_SINK=zvol`, real libvirt + qemu (TCG), the copy capped so it outlasts the
 * boot check. ZFS cannot be installed here, so `zfs` is a test double named as such
 * (`zfs-test-double`, first on the server's PATH: `create` links `/dev/zvol/<dataset>` to a real
 * loop device, `destroy -r` removes the links), while everything past it runs for real on that
 * loop device: the sink's device writes, the libvirt block copy with `--blockdev` into the block
 * device, the pivot.
 * - the boot is verified while the job still copies;
 * - at Completed the domain runs, in the same qemu process, on the block device (a `<disk
 *   type='block'>` naming the zvol path, no backing store, no NBD), the live directory gone, and
 *   the loop device holds the source's bytes.
 * The loop device and the `/dev/zvol/<pool>` links are removed at the end.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import {
  chmodSync,
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  readSync,
  readdirSync,
  rmdirSync,
  rmSync,
  writeFileSync,
  writeSync,
} from 'node:fs'
import * as path from 'node:path'
import { buildInput } from '../../fixtures/inputs.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { bootCheckEnv, offlinePlan, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, qemuPid, virshText } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'liz-'
const MARKER = 'MIGRATOR-LIVE-ZVOL-BOOT-5521'
const MiB = 1024 * 1024
const SIZE = 64 * MiB
/** A pool name of this test run's own: its links live under /dev/zvol/<pool>. */
const POOL = `migliz${process.pid}`

describe('live import into the zvol sink (a loop device stands in for the zvol)', () => {
  const t = tempDir('mig-liz-')
  let srv: RunningServer
  let loop = ''
  const importRoot = path.join(t.dir, 'imports')

  beforeAll(async () => {
    execFileSync('chmod', ['755', t.dir])
    mkdirSync(importRoot, { recursive: true })
    const backing = path.join(t.dir, 'zvol-backing.img')
    execFileSync('truncate', ['-s', String(SIZE), backing])
    loop = execFileSync('losetup', ['-f', '--show', backing], { encoding: 'utf8' }).trim()
    const bin = path.join(t.dir, 'bin')
    mkdirSync(bin)
    // zfs-test-double, installed as `zfs`: `create ... <dataset>` links the dataset's device to the
    // loop device; `destroy -r <dataset>` removes the links below it (snapshots: nothing to do);
    // `list -H -p -o avail|name,avail <pool>` answers 100 GiB available (the pre-flight checks).
    writeFileSync(
      path.join(bin, 'zfs'),
      `#!/bin/sh
# zfs-test-double (ZFS cannot be installed here): the zvol is the loop device ${loop}
for last in "$@"; do :; done
case "$1" in
  create) mkdir -p "/dev/zvol/$(dirname "$last")" && ln -sfn ${JSON.stringify(loop)} "/dev/zvol/$last";;
  destroy) case "$last" in *@*) exit 0;; esac; rm -rf "/dev/zvol/$last";;
  list) case "$5" in
    avail) echo 107374182400;;
    name,avail) printf '%s\\t%s\\n' "$last" 107374182400;;
    *) echo "cannot open '$last': dataset does not exist" >&2; exit 1;;
  esac;;
esac
`,
    )
    chmodSync(path.join(bin, 'zfs'), 0o755)
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir, {
      ...bootCheckEnv(MARKER),
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(2 * MiB),
      MIGRATOR_SINK: 'zvol',
      MIGRATOR_ZFS_POOL: POOL,
      PATH: `${bin}:${process.env.PATH}`,
    })
  }, 120_000)

  afterAll(async () => {
    await srv?.stop()
    await cleanupDomains(PREFIX)
    rmSync(`/dev/zvol/${POOL}`, { recursive: true, force: true })
    // /dev/zvol itself when this test made it (no other pool's links in it)
    if (existsSync('/dev/zvol') && readdirSync('/dev/zvol').length === 0) rmdirSync('/dev/zvol')
    if (loop) execFileSync('losetup', ['-d', loop])
    t.cleanup()
  }, 60_000)

  test('boot verified while copying; Completed on the block device, no backing chain, its bytes the source', async () => {
    const boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, SIZE).path
    const fd = openSync(boot, 'r+')
    for (let off = 8 * MiB; off < 56 * MiB; off += MiB) writeSync(fd, randomBytes(MiB), 0, MiB, off)
    closeSync(fd)
    const input = buildInput('qcow2', importRoot, 'liz-one', [boot])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: 'liz-one', live_import: true }))
    const live = await waitJob(srv.base, job.id, (j) => j.hardware?.boot?.verified === true || ['completed', 'failed', 'cancelled'].includes(j.status), 120_000)
    expect([live.state, live.status, live.domain, live.last_error]).toEqual(['CopyingFull', 'running', 'liz-one', null])
    expect(live.progress.bytes_done).toBeLessThan(live.progress.bytes_total)
    const pid = qemuPid('liz-one')
    const done = await waitJob(srv.base, job.id, undefined, 240_000)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    const dev = `/dev/zvol/${POOL}/migrator/migrations/${job.id}/${done.progress.disks[0].label}`
    expect(existsSync(dev)).toBe(true)
    expect(qemuPid('liz-one')).toBe(pid)
    expect(virshText('domblklist', 'liz-one')).toContain(dev)
    const xml = virshText('dumpxml', 'liz-one')
    expect(xml).toContain("<disk type='block' device='disk'>")
    expect(xml).not.toMatch(/<backingStore type=|nbd/)
    expect(virshText('dumpxml', '--inactive', 'liz-one')).toContain(dev)
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    // the guest never writes its disk: the block device holds the source's bytes
    const got = Buffer.alloc(SIZE)
    const lfd = openSync(loop, 'r')
    readSync(lfd, got, 0, SIZE, 0)
    closeSync(lfd)
    expect(got.equals(readFileSync(boot))).toBe(true)
    await cleanupDomains('liz-one')
  }, 300_000)
})
