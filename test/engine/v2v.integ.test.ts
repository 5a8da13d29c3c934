/**
 * V2vProcessing in the job (spec 1.5): a plan with `guest_os: "windows"` runs the V2V
 * tool over the destination volumes between CopyingFull and Starting, with a snapshot of the
 * volumes taken first; a failing tool rolls the volumes back and ends the job E_MIG_V2V_FAILED.
 *
 * The tool here is a TEST DOUBLE of `virt-v2v-in-place` (a shell script): injecting virtio
 * drivers needs a real Windows guest image, which this machine cannot have. The real tool runs
 * against a Linux-less disk in test/v2v/real-tool.integ.test.ts. The double records its command line
 * and VIRTIO_WIN, and fails (after scribbling over the disk, so the rollback shows) when the
 * disk's first bytes say `V2V-FAIL`.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { buildInput, fileSha256, makeRawImage } from '../helpers/inputs.ts'
import { bootCheckEnv, offlinePlan, openStream, streamSaw, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { domainsWithPrefix } from '../helpers/libvirt.ts'
import { serverSuite } from '../helpers/server-suite.ts'

const PREFIX = 'migv2v-'
const MARKER = 'MIGRATOR-V2V-BOOT-5521'
const MiB = 1024 * 1024

describe('Windows guests go through V2vProcessing (virt-v2v-in-place TEST DOUBLE)', () => {
  // Each test's domains and destination disks go when it ends, passed or failed.
  const { t, srv } = serverSuite({
    prefix: PREFIX,
    tmpPrefix: 'mig-v2v-job-',
    traversable: true,
    env: () => ({ ...bootCheckEnv(MARKER), MIGRATOR_V2V_BINARY: double, MIGRATOR_VIRTIO_WIN_ISO: iso }),
    cleanEach: true,
  })
  const importRoot = path.join(t.dir, 'imports')
  const record = path.join(t.dir, 'v2v-calls.log')
  const iso = path.join(t.dir, 'virtio-win.iso')
  const double = path.join(t.dir, 'virt-v2v-in-place-test-double')

  beforeAll(() => {
    mkdirSync(importRoot, { recursive: true })
    writeFileSync(iso, 'not really an ISO: the test double never opens it')
    writeFileSync(
      double,
      `#!/bin/bash
# TEST DOUBLE of virt-v2v-in-place: records the call; fails for a disk starting with V2V-FAIL.
disk="\${@: -1}"
echo "argv: $*" >> ${JSON.stringify(record)}
echo "VIRTIO_WIN=$VIRTIO_WIN" >> ${JSON.stringify(record)}
echo "[   0.0] Opening the source"
if head -c 8 "$disk" | grep -q V2V-FAIL; then
  dd if=/dev/urandom of="$disk" bs=4096 count=1 conv=notrunc status=none
  echo "virt-v2v-in-place: error: inspection could not detect the source guest (test double)" >&2
  exit 1
fi
echo "[   1.0] Finishing off"
exit 0
`,
      { mode: 0o755 },
    )
  }, 60_000)

  test('guest_os windows: Queued -> CopyingFull -> V2vProcessing -> Starting -> Completed; the tool got the volume and the ISO; its snapshot is released', async () => {
    const boot = makeBootDisk(path.join(t.dir, 'win.raw'), MARKER, 16 * MiB).path
    const input = buildInput('qcow2', importRoot, 'win', [boot])
    const stream = openStream(srv.base)
    await stream.ready
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: `${PREFIX}win`, guest_os: 'windows' }))
    const done = await waitJob(srv.base, job.id)
    await streamSaw(stream, job.id, 'Completed')
    stream.close()
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    const states = stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id).map((e) => e.data.state)
    expect(states).toEqual(['Queued', 'CopyingFull', 'V2vProcessing', 'Starting', 'Completed'])
    const img = volumePath(t.dir, job.id, done.progress.disks[0].label)
    const calls = readFileSync(record, 'utf8')
    expect(calls).toContain(`argv: -i disk -if raw --root first --machine-readable ${img}`)
    expect(calls).toContain(`VIRTIO_WIN=${path.join(t.dir, 'virtio-win.iso')}`)
    expect(existsSync(path.join(path.dirname(img), '.pre-v2v'))).toBe(false)
    expect(await domainsWithPrefix(`${PREFIX}win`)).toEqual([`${PREFIX}win`])
  }, 120_000)

  test('a failing V2V rolls the volume back (bit-exact with the source again) and ends E_MIG_V2V_FAILED with the tool error; no domain is defined', async () => {
    const raw = makeRawImage(path.join(t.dir, 'fail.raw'), 8 * MiB, 3)
    const fd = openSync(raw, 'r+')
    writeSync(fd, Buffer.from('V2V-FAIL'), 0, 8, 0)
    closeSync(fd)
    const input = buildInput('qcow2', importRoot, 'winfail', [raw])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: `${PREFIX}fail`, guest_os: 'windows' }))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error.code, done.last_error.fatal]).toEqual(['Failed', 'E_MIG_V2V_FAILED', true])
    expect(done.last_error.message).toContain('inspection could not detect the source guest')
    expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(fileSha256(raw))
    expect(await domainsWithPrefix(`${PREFIX}fail`)).toEqual([])
  }, 120_000)
})
