/**
 * Live vim_api migrations end to end through the HTTP API: the real server (Bun) and its worker
 * migrate VMs of govmomi's vCenter simulator (test/vcsim harness: snapshots freeze disk copies,
 * CBT compares real disk contents between changeIds, guest writes are applied with qemu-io to
 * the active disk between snapshots) into the file sink, then define (and for the cold job start
 * and boot-check) a libvirt domain under TCG.
 *
 * Cold: two disks (a bootable monolithicFlat disk and a monolithicSparse data disk), bit-exact
 * images, the VM shut down, marked with the job id and this host, no migrator snapshot left.
 * With CBT on, the full pass reads only the allocated areas (QueryChangedDiskAreas with changeId
 * `*`), counted in bytes the datastore interface served; without CBT, the whole disk.
 * Warm: guest writes between passes give two delta passes (the first above the converge
 * threshold), then cutover; bit-exact with the final disks; once with snapshots as frozen copies,
 * once as ESXi-style delta chains (each snapshot's disk a delta over the previous one's, read
 * through the chain vSphere reports in the backing's parent). A VM without CBT: downgraded to cold
 * with the non-fatal E_MIG_CBT_UNSUPPORTED. A guest that keeps writing: E_MIG_DELTA_TOO_LARGE,
 * snapshots removed.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { readdirSync, readFileSync } from 'node:fs'
import { hostname } from 'node:os'
import * as path from 'node:path'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { makeRawImage } from '../helpers/inputs.ts'
import { bootCheckEnv, livePlan, openStream, streamSaw, submit, volumePath, waitJob, workerPid } from '../helpers/jobs.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { startServer } from '../helpers/server.ts'
import { datastoreRaw, putVmdk, registerVcsim, startVcsim, type Vcsim, SMALL_LINUX_VM } from '../helpers/vcsim.ts'

const PREFIX = 'migvim-'
const MARKER = 'MIGRATOR-VIM-BOOT-5521'
const MiB = 1024 * 1024

describe('live vim_api migrations through the HTTP API', () => {
  let v: Vcsim
  const { t, srv } = serverSuite({
    prefix: PREFIX,
    tmpPrefix: 'mig-live-vim-',
    traversable: true,
    env: { ...bootCheckEnv(MARKER), MIGRATOR_DELTA_CONVERGE_BYTES: String(MiB), MIGRATOR_DELTA_MAX_PASSES: '3' },
    stop: (s) => [s, v],
  })
  let sourceId = ''

  /** Creates a VM with a bootable flat disk (16 MiB) and a sparse data disk (8 MiB). */
  async function makeVm(name: string, cbt: boolean, deltaSnapshots = false): Promise<{ id: string; files: string[] }> {
    const boot = makeBootDisk(path.join(t.dir, `${name}-boot.raw`), MARKER, 16 * MiB).path
    const data = makeRawImage(path.join(t.dir, `${name}-data.raw`), 8 * MiB, name.length)
    const files = [await putVmdk(v, name, `${name}`, boot, 'flat'), await putVmdk(v, name, `${name}_1`, data, 'sparse')]
    const id = await v.createVm({
      name,
      ...SMALL_LINUX_VM,
      cbt,
      delta_snapshots: deltaSnapshots,
      power_on: true,
      disks: [
        { file: files[0], capacity_bytes: 16 * MiB },
        { file: files[1], capacity_bytes: 8 * MiB },
      ],
      nics: [{ mac: '00:50:56:01:02:03' }],
    })
    return { id, files }
  }

  function expectBitExact(jobId: string, files: string[]): void {
    for (const f of files) {
      const label = path.basename(f, '.vmdk')
      const dest = readFileSync(volumePath(t.dir, jobId, label))
      expect([label, dest.equals(datastoreRaw(v, f, t.dir))]).toEqual([label, true])
    }
  }

  const planFor = (vmId: string, mode: 'Cold' | 'Warm', name: string, start = false) => livePlan(sourceId, vmId, mode, { name, start })

  beforeAll(async () => {
    v = await startVcsim({ cbtPage: 4 * MiB })
    sourceId = await registerVcsim(srv.base, v) // 201 with the source's id, or it throws
  }, 120_000)

  test('cold: two disks copied bit-exact from the snapshot, the domain boots, the VM is shut down and marked, no snapshot left', async () => {
    const vm = await makeVm('migvim-cold', true)
    const servedBefore = await v.folderBytes()
    const job = await submit(srv.base, planFor(vm.id, 'Cold', 'migvim-cold', true))
    const done = await waitJob(srv.base, job.id)
    // CBT is on: only the allocated areas (changeId "*") came over the datastore interface, not
    // the 16 MiB flat boot disk whole
    expect((await v.folderBytes()) - servedBefore).toBeLessThan(8 * MiB)
    expect([done.status, done.state, done.effective_mode, done.last_error]).toEqual(['completed', 'Completed', 'Cold', null])
    expect(done.domain).toBe('migvim-cold')
    expect(done.progress.bytes_total).toBe(24 * MiB)
    expectBitExact(job.id, vm.files)
    const state = await v.vm(vm.id)
    expect(state.power_state).toBe('poweredOff')
    expect(state.annotation).toContain(job.id)
    expect(state.annotation).toContain(hostname())
    expect(state.snapshots).toEqual([])
    expect(state.snapshots_taken).toBe(1)
    const serial = readFileSync(path.join(t.dir, 'logs', `${job.id}.serial.log`), 'utf8')
    expect(serial).toContain(MARKER)
  })

  for (const chain of [false, true]) {
    const name = chain ? 'migvim-warmchain' : 'migvim-warm'
    const how = chain ? 'snapshots as ESXi delta chains (each a delta over the previous, consolidated on removal)' : 'snapshots as frozen copies'
    test(`warm, ${how}: guest writes between snapshots give two delta passes, then cutover; bit-exact with the final disks`, async () => {
      const vm = await makeVm(name, true, chain)
      await v.scheduleWrites(vm.id, [
        // before delta pass 1: 2.5 MiB changed (above the 1 MiB threshold: not converged)
        { before_snapshot: 1, file: vm.files[0], offset: 2 * MiB, length: 2 * MiB, pattern: 0x41 },
        { before_snapshot: 1, file: vm.files[1], offset: 5 * MiB, length: 512 * 1024, pattern: 0x51 },
        // before delta pass 2: 128 KiB (converged)
        { before_snapshot: 2, file: vm.files[1], offset: 64 * 1024, length: 128 * 1024, pattern: 0x61 },
        // while cutting over (the last writes before shutdown): 64 KiB
        { before_snapshot: 3, file: vm.files[0], offset: 15 * MiB, length: 64 * 1024, pattern: 0x71 },
      ])
      const stream = openStream(srv.base)
      await stream.ready
      const servedBefore = await v.folderBytes()
      const job = await submit(srv.base, planFor(vm.id, 'Warm', name))
      const done = await waitJob(srv.base, job.id)
      await streamSaw(stream, job.id, 'Completed')
      stream.close()
      // the full pass read the allocated areas only, the delta passes the changed ones: far less
      // than the 24 MiB of the two disks
      expect((await v.folderBytes()) - servedBefore).toBeLessThan(12 * MiB)
      expect([done.status, done.state, done.effective_mode, done.last_error]).toEqual(['completed', 'Completed', 'Warm', null])
      const states = stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id).map((e) => e.data.state)
      expect(states.filter((s, i) => s !== states[i - 1])).toEqual(['Queued', 'CopyingFull', 'DeltaSyncing', 'CuttingOver', 'Starting', 'Completed'])
      const state = await v.vm(vm.id)
      // snapshot 0 (full copy), passes 1 and 2, the final delta after shutdown
      expect(state.snapshots_taken).toBe(4)
      // with chains, snapshots 1-3 of both disks were read through a delta over the previous snapshot's disk
      expect(state.delta_disks).toBe(chain ? 6 : 0)
      expect(state.snapshots).toEqual([])
      expect(state.power_state).toBe('poweredOff')
      expectBitExact(job.id, vm.files)
      // the destination has every guest write, including the one before the final snapshot
      const boot = readFileSync(volumePath(t.dir, job.id, name))
      expect([boot[2 * MiB], boot[15 * MiB]]).toEqual([(0x41 + 1) & 0xff, (0x71 + 3) & 0xff])
      // no frozen or delta file is left in the VM's datastore directory
      expect(readdirSync(path.join(v.datastore.dir, name)).filter((f) => /snapshot/.test(f))).toEqual([])
    })
  }

  test('warm plan for a VM without CBT: downgraded to cold with the non-fatal E_MIG_CBT_UNSUPPORTED, still completes bit-exact', async () => {
    const vm = await makeVm('migvim-nocbt', false)
    const servedBefore = await v.folderBytes()
    const job = await submit(srv.base, planFor(vm.id, 'Warm', 'migvim-nocbt'))
    const done = await waitJob(srv.base, job.id)
    expect([done.status, done.effective_mode, done.last_error?.code, done.last_error?.fatal]).toEqual(['completed', 'Cold', 'E_MIG_CBT_UNSUPPORTED', false])
    // without CBT nothing tells the allocated areas: the flat boot disk is read whole
    expect((await v.folderBytes()) - servedBefore).toBeGreaterThanOrEqual(16 * MiB)
    expectBitExact(job.id, vm.files)
    const state = await v.vm(vm.id)
    expect([state.snapshots, state.snapshots_taken, state.power_state]).toEqual([[], 1, 'poweredOff'])
  })

  test('a guest that keeps writing more than the threshold: E_MIG_DELTA_TOO_LARGE, every snapshot removed', async () => {
    const vm = await makeVm('migvim-busy', true)
    await v.scheduleWrites(vm.id, [{ before_snapshot: 1, every: true, file: vm.files[0], offset: 4 * MiB, length: 2 * MiB, pattern: 0x10 }])
    const job = await submit(srv.base, planFor(vm.id, 'Warm', 'migvim-busy'))
    const done = await waitJob(srv.base, job.id)
    expect([done.status, done.state, done.last_error?.code, done.last_error?.fatal]).toEqual(['failed', 'Failed', 'E_MIG_DELTA_TOO_LARGE', true])
    const state = await v.vm(vm.id)
    expect(state.snapshots_taken).toBe(4) // the full copy's and three delta passes
    expect(state.snapshots).toEqual([])
    // warm never shut the guest down
    expect(state.power_state).toBe('poweredOn')
  })

  test('a worker killed on its last attempt: the job is given up (E_MIG_INTERNAL) and the supervisor removes its snapshot from the VM', async () => {
    const vm = await makeVm('migvim-crash', true)
    const s2 = await startServer('bun', path.join(t.dir, 'crash-server'), {
      MIGRATOR_MAX_ATTEMPTS: '1',
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(256 * 1024),
    })
    try {
      const sourceId2 = await registerVcsim(s2.base, v) // 201 with the source's id, or it throws
      const job = await submit(s2.base, livePlan(sourceId2, vm.id, 'Cold', { name: 'migvim-crash', start: false }))
      await waitJob(s2.base, job.id, (j) => j.state === 'CopyingFull' && j.progress.bytes_done > 0, 60_000)
      expect((await v.vm(vm.id)).snapshots.length).toBe(1)
      process.kill(workerPid(path.join(t.dir, 'crash-server'), job.id)!, 'SIGKILL')
      const done = await waitJob(s2.base, job.id)
      expect([done.status, done.last_error.code, /giving up/.test(done.last_error.message)]).toEqual(['failed', 'E_MIG_INTERNAL', true])
      let left = (await v.vm(vm.id)).snapshots
      for (let i = 0; i < 100 && left.length > 0; i++) {
        await new Promise((r) => setTimeout(r, 100))
        left = (await v.vm(vm.id)).snapshots
      }
      expect(left).toEqual([])
    } finally {
      await s2.stop()
    }
  }, 120_000)
})
