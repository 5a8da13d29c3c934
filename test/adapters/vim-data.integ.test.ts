/**
 * The vim_api data plane against the vCenter simulator harness (test/vcsim), called through the
 * adapter: snapshot reads over the datastore HTTP interface for every VMDK layout qemu-img makes
 * (monolithicFlat, monolithicSparse, twoGbMaxExtentSparse, twoGbMaxExtentFlat) bit-exact with
 * zero extents skipped, reads that ignore later writes to the active disk, QueryChangedDiskAreas
 * paging, invalid and reset changeIds (E_MIG_CBT_RESET), a refused snapshot
 * (E_MIG_SNAPSHOT_FAILED), cleanup of the migrator's snapshots only, and hostile descriptors.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { open, readFile } from 'node:fs/promises'
import * as path from 'node:path'
import { createVimAdapter, type VimSession } from '../../lib/adapters/vim/adapter.ts'
import type { VmManifest } from '../../lib/manifest.ts'
import { readAll } from '../helpers/disk-reader.ts'
import { makeRawImage } from '../helpers/inputs.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'
import { qemuImg, startVcsim, type Vcsim } from '../helpers/vcsim.ts'

const MiB = 1024 * 1024
const t = tempDir('mig-vim-data-')
let v: Vcsim
let s: VimSession
let vmId = ''
let manifest: VmManifest
const raws: string[] = []

beforeAll(async () => {
  v = await startVcsim({ cbtPage: MiB })
  const layouts = ['monolithicFlat', 'monolithicSparse', 'twoGbMaxExtentSparse', 'twoGbMaxExtentFlat']
  const files: string[] = []
  for (const [i, sub] of layouts.entries()) {
    raws.push(makeRawImage(path.join(t.dir, `d${i}.raw`), 6 * MiB, i + 3))
    const rel = `data01/disk${i}.vmdk`
    execFileSync('mkdir', ['-p', path.join(v.datastore.dir, 'data01')])
    await qemuImg('convert', '-f', 'raw', '-O', 'vmdk', '-o', `subformat=${sub}`, raws[i], path.join(v.datastore.dir, rel))
    files.push(rel)
  }
  vmId = await v.createVm({
    name: 'data01',
    guest_id: 'centos7_64Guest',
    cbt: true,
    power_on: true,
    disks: files.map((file) => ({ file, capacity_bytes: 6 * MiB })),
  })
  s = (await createVimAdapter({ shutdownTimeoutMs: 2000, pollMs: 100 }).connect({
    endpoint: v.url,
    username: v.username,
    password: v.password,
    tls: { ca_pem: v.certPem },
  })) as VimSession
  manifest = await s.inspect(vmId)
}, 120_000)

afterAll(async () => {
  await s?.close()
  await v?.stop()
  t.cleanup()
})

describe('vim_api data plane', () => {
  test('every qemu-img VMDK layout reads bit-exact from the snapshot; unallocated sparse grains are zero extents', async () => {
    const snap = await s.createSnapshot(vmId, 'migrator-data-0')
    expect(Object.keys(snap.change_ids).sort()).toEqual(manifest.disks.map((d) => d.label).sort())
    // the guest keeps writing to the active disks: the snapshot must not see it
    for (const rel of ['data01/disk0-flat.vmdk']) {
      const fh = await open(path.join(v.datastore.dir, rel), 'r+')
      await fh.write(Buffer.alloc(MiB, 0xee), 0, MiB, 0)
      await fh.close()
    }
    for (const [i, d] of manifest.disks.entries()) {
      const r = await s.openDisk(vmId, snap, d)
      expect(r.size).toBe(6 * MiB)
      const { data, zeroBytes } = await readAll(r)
      expect([d.label, data.equals(await readFile(raws[i]))]).toEqual([d.label, true])
      if (i === 1 || i === 2) expect(zeroBytes).toBeGreaterThan(2 * MiB) // sparse: holes are never fetched
      await r.close()
    }
    await s.removeSnapshot(vmId, snap)
    expect((await v.vm(vmId)).snapshots).toEqual([])
  })

  test('QueryChangedDiskAreas is paged until the capacity is covered and reports exactly the written areas', async () => {
    const disk = manifest.disks[1]
    const before = await s.createSnapshot(vmId, 'migrator-cbt-1')
    // the guest writes three areas in different 1 MiB answer windows
    for (const [off, len] of [
      [64 * 1024, 4096],
      [2 * MiB + 128 * 1024, 200 * 1024],
      [6 * MiB - 64 * 1024, 64 * 1024],
    ]) {
      execFileSync('qemu-io', ['-f', 'vmdk', '-c', `write -P 0x5a ${off} ${len}`, path.join(v.datastore.dir, 'data01/disk1.vmdk')])
    }
    const after = await s.createSnapshot(vmId, 'migrator-cbt-2')
    const areas = await s.changedAreas(vmId, after, disk, before.change_ids[disk.label])
    expect(areas).toEqual([
      { offset: 64 * 1024, length: 64 * 1024 },
      { offset: 2 * MiB + 128 * 1024, length: 256 * 1024 },
      { offset: 6 * MiB - 64 * 1024, length: 64 * 1024 },
    ])
    expect(await s.changedAreas(vmId, after, manifest.disks[2], before.change_ids[manifest.disks[2].label])).toEqual([])
    // a changeId the source does not know, and every changeId after a CBT reset: E_MIG_CBT_RESET
    expect((await thrown(() => s.changedAreas(vmId, after, disk, '52 00 00 00 00 00 00 00-00 00 00/9999'))).code).toBe('E_MIG_CBT_RESET')
    await v.resetCbt(vmId)
    expect((await thrown(() => s.changedAreas(vmId, after, disk, before.change_ids[disk.label]))).code).toBe('E_MIG_CBT_RESET')
    await s.cleanup(vmId)
  })

  test('cleanup removes the migrator snapshots only; a refused snapshot is E_MIG_SNAPSHOT_FAILED; mark and shutdown', async () => {
    const other = (await createVimAdapter().connect({ endpoint: v.url, username: v.username, password: v.password, tls: { insecure: true } })) as VimSession
    await other.createSnapshot(vmId, 'nightly-backup')
    await other.close()
    await s.createSnapshot(vmId, 'migrator-job-0')
    await s.createSnapshot(vmId, 'migrator-job-1')
    expect((await v.vm(vmId)).snapshots.map((x) => x.name)).toEqual(['nightly-backup', 'migrator-job-0', 'migrator-job-1'])
    await s.cleanup(vmId)
    expect((await v.vm(vmId)).snapshots.map((x) => x.name)).toEqual(['nightly-backup'])

    await s.mark(vmId, 'migrating to this host, job 1234')
    await s.mark(vmId, 'migrating to this host, job 5678')
    const ann = (await v.vm(vmId)).annotation
    expect(ann).toContain('job 5678')
    expect(ann).not.toContain('job 1234') // the mark is replaced, not piled up
    await s.shutdown(vmId)
    expect((await v.vm(vmId)).power_state).toBe('poweredOff')
    await s.shutdown(vmId) // already off: nothing to do

    await v.disableMethod(vmId, 'CreateSnapshot_Task')
    const e = await thrown(() => s.createSnapshot(vmId, 'migrator-job-2'))
    expect(e.code).toBe('E_MIG_SNAPSHOT_FAILED')
  })
})
