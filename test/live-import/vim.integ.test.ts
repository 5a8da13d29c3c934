/**
 * Live import of a VM of a live adapter (`vim_api`, cold) through the HTTP API, against govmomi's
 * vCenter simulator (test/vcsim: a named test double of ESXi and vCenter), real libvirt + qemu
 * (TCG), file sink, the copy capped (MIGRATOR_COPY_MAX_BYTES_PER_SECOND). The VM's boot disk is a
 * boot sector that prints a marker on the serial console (the server's
 * MIGRATOR_BOOT_SERIAL_PATTERN makes it the boot evidence) with 40 MiB of unique data behind it,
 * its second disk a 2 MiB sparse VMDK:
 * - the source VM is shut down and one snapshot taken before the guest starts here; the guest's
 *   boot is verified while the job copies, its disks qcow2 overlays over NBD exports of the
 *   snapshot's disks read over the datastore interface;
 * - at Completed the domain runs on the plain volumes in the same qemu process, both volumes
 *   bit-exact with the VM's disks, the snapshot removed, the VM left powered off and marked.
 */
import { describe, expect, test } from 'bun:test'
import { existsSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeDataBootDisk } from '../helpers/bootdisk.ts'
import { bootCheckEnv, livePlan, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { qemuPid, virshText } from '../helpers/libvirt.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { createTwoDiskVm, datastoreRaw, registerVcsim, startVcsim, type Vcsim } from '../helpers/vcsim.ts'

const MARKER = 'MIGRATOR-LIVE-IMPORT-VIM-4410'
const MiB = 1024 * 1024
const NAME = 'liv-cold'

describe('live import of a vim_api VM (vCenter simulator)', () => {
  let v: Vcsim
  let sourceId = ''
  const { t, srv } = serverSuite({
    prefix: NAME,
    tmpPrefix: 'mig-liv-',
    traversable: true,
    setUp: async () => {
      v = await startVcsim({ cbtPage: 4 * MiB })
    },
    env: { ...bootCheckEnv(MARKER), MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(2 * MiB) },
    ready: async (s) => {
      sourceId = await registerVcsim(s.base, v)
    },
    stop: (s) => [s, v],
    timeoutMs: 300_000,
  })

  test('cold: VM shut down and snapshotted, the guest boots here while copying, Completed on the plain volumes bit-exact, snapshot removed', async () => {
    const boot = makeDataBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 40)
    const vm = await createTwoDiskVm(v, t.dir, NAME, boot)
    const job = await submit(srv.base, livePlan(sourceId, vm.id, 'Cold', { name: NAME, live_import: true }))
    const live = await waitJob(srv.base, job.id, (j) => j.hardware?.boot?.verified === true || ['completed', 'failed', 'cancelled'].includes(j.status), 120_000)
    expect([live.state, live.status, live.domain]).toEqual(['CopyingFull', 'running', NAME])
    expect(live.hardware.boot.evidence).toContain(MARKER)
    expect(live.progress.bytes_done).toBeLessThan(live.progress.bytes_total)
    expect(live.source_vm.shut_down_at).toBeTruthy()
    const during = await v.vm(vm.id)
    expect([during.power_state, during.snapshots.map((s) => s.name)]).toEqual(['poweredOff', [`migrator-${job.id}-live`]])
    const xml = virshText('dumpxml', NAME)
    expect(xml).toContain(`${path.join(t.dir, 'live', job.id)}/1.qcow2`)
    expect(xml).toContain("protocol='nbd'")
    const pid = qemuPid(NAME)

    const done = await waitJob(srv.base, job.id, undefined, 240_000)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect(virshText('domstate', NAME)).toBe('running')
    expect(qemuPid(NAME)).toBe(pid)
    expect(virshText('dumpxml', NAME)).not.toMatch(/<backingStore type=|nbd/)
    for (const f of vm.files) {
      const label = path.basename(f, '.vmdk')
      const vol = volumePath(t.dir, job.id, label)
      expect(virshText('domblklist', NAME)).toContain(vol)
      expect([label, readFileSync(vol).equals(datastoreRaw(v, f, t.dir))]).toEqual([label, true])
    }
    expect(existsSync(path.join(t.dir, 'live', job.id))).toBe(false)
    const after = await v.vm(vm.id)
    expect([after.power_state, after.snapshots, after.snapshots_taken]).toEqual(['poweredOff', [], 1])
    expect(after.annotation).toContain(job.id)
    expect(done.source_vm.powered_on_at).toBeNull()
  }, 300_000)
})
