/**
 * The same server under Node 20 (compiled with tsc, `npm run start:node`): its supervisor forks
 * workers with Node, and a job runs end to end: an OVA with two disks imported into the file
 * sink, bit-exact, the domain started on libvirt (TCG) with its marker on the serial console; a
 * warm vim_api migration from the vCenter simulator (SOAP, datastore HTTP and snapshot delta
 * chains in a Node worker); and a cancel mid-copy that removes the destination.
 */
import { describe, expect, test } from 'bun:test'
import { existsSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { buildInput, fileSha256, makeRawImage } from '../helpers/inputs.ts'
import { bootCheckEnv, call, livePlan, offlinePlan, submit, volumePath, waitJob, workerPid } from '../helpers/jobs.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { startServer } from '../helpers/server.ts'
import { putVmdk, registerVcsim, startVcsim } from '../helpers/vcsim.ts'
import { execFileSync } from 'node:child_process'

const PREFIX = 'mignode-'
const MARKER = 'MIGRATOR-NODE-BOOT-9043'
const MiB = 1024 * 1024

describe('jobs under the Node server and Node workers', () => {
  // Each test's domains and destination disks go when it ends, passed or failed.
  const node = { runtime: 'node', traversable: true, cleanEach: true, timeoutMs: 120_000 } as const
  const { t, srv } = serverSuite({ prefix: PREFIX, tmpPrefix: 'mig-node-engine-', env: bootCheckEnv(MARKER), ...node })
  const importRoot = path.join(t.dir, 'imports')

  test('an OVA with two disks: Completed, images bit-exact, the domain runs and printed its marker; the worker was Node, with --expose-gc', async () => {
    const boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 16 * MiB).path
    const data = makeRawImage(path.join(t.dir, 'data.raw'), 12 * MiB, 5)
    buildInput('ova_archive', importRoot, 'vm', [boot, data])
    const job = await submit(srv.base, offlinePlan('ova_archive', 'vm.ova', { name: `${PREFIX}ova` }))
    let sawNode = false
    const done = await waitJob(srv.base, job.id, (j) => {
      const pid = workerPid(t.dir, job.id)
      // The compiled worker, run with --expose-gc: its threads collect their heap when they
      // forget the copy's buffers (lib/script-thread.ts).
      const args = pid ? readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0') : []
      sawNode ||= args.some((a) => a.endsWith('worker.js')) && args.includes('--expose-gc')
      return ['completed', 'failed', 'cancelled'].includes(j.status)
    })
    expect([done.state, done.last_error, done.domain]).toEqual(['Completed', null, `${PREFIX}ova`])
    expect(sawNode).toBe(true)
    expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(fileSha256(boot))
    expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[1].label))).toBe(fileSha256(data))
    expect(readFileSync(path.join(t.dir, 'logs', `${job.id}.serial.log`), 'utf8')).toContain(MARKER)
  }, 120_000)

  test('a warm vim_api migration under Node workers (vCenter simulator, snapshots as delta chains): a delta pass and the cutover, bit-exact', async () => {
    const v = await startVcsim({ cbtPage: 4 * MiB })
    try {
      const raw = makeRawImage(path.join(t.dir, 'live.raw'), 8 * MiB, 11)
      const file = await putVmdk(v, 'nodevm', 'nodevm', raw, 'flat')
      const vmId = await v.createVm({
        name: 'nodevm',
        guest_id: 'debian10_64Guest',
        cbt: true,
        delta_snapshots: true,
        power_on: true,
        disks: [{ file, capacity_bytes: 8 * MiB }],
      })
      // before the delta pass (below the default 64 MiB threshold: converged), then before the cutover's final snapshot
      await v.scheduleWrites(vmId, [
        { before_snapshot: 1, file, offset: 2 * MiB, length: 2 * MiB, pattern: 0x21 },
        { before_snapshot: 2, file, offset: 64 * 1024, length: 64 * 1024, pattern: 0x31 },
      ])
      const srcId = await registerVcsim(srv.base, v, 'vcsim-node') // 201 with the source's id, or it throws
      const job = await submit(srv.base, livePlan(srcId, vmId, 'Warm', { name: `${PREFIX}live`, start: false }))
      let sawNode = false
      const done = await waitJob(srv.base, job.id, (j) => {
        const pid = workerPid(t.dir, job.id)
        if (pid) sawNode ||= readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('worker.js')
        return ['completed', 'failed', 'cancelled'].includes(j.status)
      })
      expect([done.status, done.effective_mode, done.last_error]).toEqual(['completed', 'Warm', null])
      expect(sawNode).toBe(true)
      const state = await v.vm(vmId)
      // the full copy's snapshot, the delta pass's, the cutover's: the last two read through delta chains
      expect([state.snapshots_taken, state.delta_disks, state.snapshots]).toEqual([3, 2, []])
      const now = path.join(t.dir, 'live-now.raw')
      execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'raw', path.join(v.datastore.dir, file), now])
      expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(fileSha256(now))
    } finally {
      await v.stop()
    }
  }, 180_000)

  test('cancel mid-copy under Node: Cancelled, destination removed, no worker left', async () => {
    const big = makeRawImage(path.join(t.dir, 'big.raw'), 256 * MiB, 9)
    buildInput('qcow2', importRoot, 'slow', [big])
    const s2 = await startServer('node', path.join(t.dir, 'second'), {
      MIGRATOR_IMPORT_ROOT: importRoot,
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(MiB),
      MIGRATOR_FLUSH_EVERY_BYTES: String(MiB),
    })
    try {
      const job = await submit(s2.base, offlinePlan('qcow2', 'slow/slow.qcow2', { name: `${PREFIX}cancel`, start: false }))
      await waitJob(s2.base, job.id, (j) => j.state === 'CopyingFull' && j.progress.bytes_done > 0, 60_000)
      expect((await call(s2.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
      const done = await waitJob(s2.base, job.id)
      expect([done.state, done.last_error.code]).toEqual(['Cancelled', 'E_MIG_CANCELLED'])
      expect(existsSync(path.join(t.dir, 'second', 'volumes', 'migrations', job.id))).toBe(false)
      // The worker exits right after reporting the terminal state.
      for (let i = 0; i < 50 && workerPid(path.join(t.dir, 'second'), job.id) !== null; i++) await new Promise((r) => setTimeout(r, 100))
      expect(workerPid(path.join(t.dir, 'second'), job.id)).toBeNull()
    } finally {
      await s2.stop()
    }
  }, 120_000)
})
