/**
 * The orchestrator's state machine (spec 1.2, 1.4, 3) on the live path, with the real store
 * (SQLite), the real copy loop and the real file sink. The source is `ScriptedLiveSource`, a TEST
 * DOUBLE of a live adapter session (the vim_api adapter is tested against the vCenter simulator
 * elsewhere): its disks are buffers in memory, every snapshot freezes a copy, and its changed
 * areas come from comparing the snapshot with the one of the previous changeId (64 KiB blocks),
 * so CBT answers are real answers about real data. A script can change the disks after each
 * snapshot. `start` and `v2v` are recording stand-ins for libvirt and virt-v2v (tested for real in
 * test/domain, test/v2v and test/engine).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import type { LiveSession, SnapshotRef } from '../../lib/adapters/types.ts'
import type { DiskArea } from '../../lib/contracts/disk-reader.ts'
import { MigError } from '../../lib/errors.ts'
import type { Job, JobState } from '../../lib/job.ts'
import type { ManifestDisk, VmManifest } from '../../lib/manifest.ts'
import { copyDisk } from '../../lib/pipeline/copy-disk.ts'
import { PROGRESS_EVERY_MS, runJob } from '../../lib/jobs/orchestrator.ts'
import type { OrchestratorDeps } from '../../lib/jobs/orchestrator-deps.ts'
import type { DiskReader } from '../../lib/contracts/disk-reader.ts'
import { FileSink } from '../../lib/sink/file.ts'
import { openStore, type Store } from '../../lib/store/index.ts'
import { tempDir } from '../helpers/tmp.ts'
import { manifest as fixtureManifest } from '../domain/fixtures.ts'
import { memReader } from '../helpers/disk-reader.ts'

const MiB = 1024 * 1024
const BLOCK = 64 * 1024
const t = tempDir('mig-orch-')
afterAll(() => t.cleanup())

/** TEST DOUBLE of a live source session (see the module comment). */
class ScriptedLiveSource implements LiveSession {
  readonly calls: string[] = []
  private readonly snaps = new Map<string, Buffer[]>()
  private seq = 0
  /** Called after each snapshot is taken with its number (0 = the first full-copy snapshot). */
  afterSnapshot: (n: number, disks: Buffer[]) => void = () => {}

  constructor(
    readonly disks: Buffer[],
    readonly opts: { warm: boolean; cbt: boolean; failSnapshot?: boolean },
  ) {}

  manifest(): VmManifest {
    // BIOS, no Secure Boot, no warnings: the fixture's; the rest is this VM's.
    return fixtureManifest({
      name: 'live-vm',
      source_format: 'vim_api',
      guest_os: { family: 'linux', id: 'otherLinux64Guest' },
      cpu: { count: 1, cores_per_socket: 1 },
      memory_bytes: 256 * MiB,
      disks: this.disks.map(
        (d, i): ManifestDisk => ({
          label: `disk${i}`,
          capacity_bytes: d.length,
          disk_format: 'raw',
          source: { path: `[ds] vm/disk${i}.vmdk` },
          controller: 'scsi',
          address: `0:${i}`,
        }),
      ),
      nics: [],
      cbt_available: this.opts.cbt,
    })
  }
  async describe() {
    return { product: 'scripted test double', version: null }
  }
  async listVms() {
    return []
  }
  async inspect() {
    return this.manifest()
  }
  async close() {
    this.calls.push('close')
  }
  supportsWarm() {
    return this.opts.warm
  }
  async enableCbt() {
    this.calls.push('enableCbt')
  }
  async createSnapshot(_vm: string, name: string): Promise<SnapshotRef> {
    if (this.opts.failSnapshot) throw new MigError('E_MIG_SNAPSHOT_FAILED', 'scripted: snapshot refused')
    const n = this.seq++
    const id = `snap-${n}`
    this.snaps.set(
      id,
      this.disks.map((d) => Buffer.from(d)),
    )
    this.calls.push(`snapshot ${name}`)
    this.afterSnapshot(n, this.disks)
    return { id, change_ids: Object.fromEntries(this.disks.map((_, i) => [`disk${i}`, id])) }
  }
  async openDisk(_vm: string, snap: SnapshotRef, disk: ManifestDisk): Promise<DiskReader> {
    return memReader(this.snaps.get(snap.id)![Number(disk.label.slice(4))]!)
  }
  /** Calls of changedAreas since a changeId (0-based, counted over all disks; `*` calls not counted) that answer as if CBT was reset. */
  resetOn = new Set<number>()
  private areaCalls = 0
  /** Calls with changeId `*` (the allocated areas), by disk label. */
  allocatedCalls: string[] = []
  async changedAreas(_vm: string, snap: SnapshotRef, disk: ManifestDisk, since: string): Promise<DiskArea[]> {
    const i = Number(disk.label.slice(4))
    if (since === '*') {
      // allocated = not all zero, in BLOCK units
      this.allocatedCalls.push(disk.label)
      const now = this.snaps.get(snap.id)![i]
      const out: DiskArea[] = []
      for (let o = 0; o < now.length; o += BLOCK)
        if (now.subarray(o, o + BLOCK).some((b) => b !== 0)) out.push({ offset: o, length: Math.min(BLOCK, now.length - o) })
      return out
    }
    if (this.resetOn.has(this.areaCalls++)) throw new MigError('E_MIG_CBT_RESET', `scripted: changeId ${since} of ${disk.label} was reset`)
    const before = this.snaps.get(since)?.[i]
    if (!before) throw new MigError('E_MIG_CBT_RESET', `scripted: changeId ${since} unknown`)
    const now = this.snaps.get(snap.id)![i]
    const out: DiskArea[] = []
    for (let o = 0; o < now.length; o += BLOCK) {
      if (!now.subarray(o, o + BLOCK).equals(before.subarray(o, o + BLOCK))) out.push({ offset: o, length: Math.min(BLOCK, now.length - o) })
    }
    return out
  }
  async removeSnapshot(_vm: string, snap: SnapshotRef) {
    this.snaps.delete(snap.id)
    this.calls.push(`remove ${snap.id}`)
  }
  async shutdown() {
    this.calls.push('shutdown')
    return true
  }
  async powerOn() {
    this.calls.push('power on')
  }
  async mark(_vm: string, note: string) {
    this.calls.push(`mark ${note}`)
  }
  async cleanup() {
    this.calls.push(`cleanup (${this.snaps.size} left)`)
    this.snaps.clear()
  }
}

/** The real copyDisk, recording the bytes each call read into `reads`. */
function countingCopy(reads: number[]): OrchestratorDeps['copyDisk'] {
  return async (r, v, o) => {
    const res = await copyDisk(r, v, o)
    reads.push(res.bytes_read)
    return res
  }
}

let n = 0
async function setup(src: ScriptedLiveSource, mode: 'Warm' | 'Cold', extra: Partial<OrchestratorDeps> = {}, plan: Record<string, unknown> = {}) {
  const dir = path.join(t.dir, `run-${++n}`)
  const store: Store = await openStore(path.join(dir, 'db.sqlite'))
  const id = `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`
  await store.jobs.create({
    id,
    plan: {
      source: { Live: 'vim_api' },
      source_ref: { kind: 'live_vm', source_id: '00000000-0000-4000-8000-000000000000', vm_id: 'vm-1' },
      mode,
      ...plan,
    } as never,
    strategy: 'live',
    effective_mode: mode,
    now: new Date().toISOString(),
  })
  const states: JobState[] = []
  const sink = new FileSink({ dataDir: dir })
  const started: string[] = []
  const v2v: string[] = []
  const deps: OrchestratorDeps = {
    jobId: id,
    jobs: store.jobs,
    watermarks: store.watermarks,
    now: () => new Date(),
    signal: new AbortController().signal,
    onJob: (j) => states.push(j.state),
    onProgress: () => {},
    prepare: async () => ({ strategy: 'live', manifest: src.manifest(), session: src, vmId: 'vm-1', close: () => src.close() }),
    sink,
    copyDisk: (r, v, o) => copyDisk(r, v, o),
    v2v: async (_j, _m, vols) => void v2v.push(...vols.map((v) => v.path)),
    start: async (j) => (started.push(j.id), 'live-vm'),
    delta: { convergeBelowBytes: 2 * BLOCK, maxPasses: 4 },
    ...extra,
  }
  return { store, deps, states, sink, started, v2v, id, dir }
}

const image = (sink: FileSink, id: string, label: string) => readFileSync(sink.volumePath(id, label))

describe('orchestrator, live path (scripted live-source TEST DOUBLE)', () => {
  test('cold: shutdown, one snapshot, full copy of every disk, Starting, Completed; the source is marked and cleaned up', async () => {
    const src = new ScriptedLiveSource([randomBytes(2 * MiB), randomBytes(MiB)], { warm: true, cbt: true })
    const { deps, states, sink, id, store } = await setup(src, 'Cold')
    const job = await runJob(deps)
    expect([job.state, job.last_error, job.domain]).toEqual(['Completed', null, 'live-vm'])
    // the second CopyingFull event records the source VM's shutdown on the job
    expect(states).toEqual(['CopyingFull', 'CopyingFull', 'Starting', 'Completed'])
    expect([typeof job.source_vm?.shut_down_at, job.source_vm?.powered_on_at]).toEqual(['string', null])
    expect(image(sink, id, 'disk0').equals(src.disks[0])).toBe(true)
    expect(image(sink, id, 'disk1').equals(src.disks[1])).toBe(true)
    expect(src.calls[0]).toBe(`mark migrating to this host, job ${id}`)
    expect(src.calls.slice(1, 3)).toEqual(['shutdown', `snapshot migrator-${id}-0`])
    expect(src.calls).toContain('cleanup (1 left)')
    expect((await store.watermarks.list(id)).map((w) => w.watermark_bytes)).toEqual([2 * MiB, MiB])
    await store.close()
  })

  test('with CBT the full pass reads only the allocated areas (changeId *); without, the whole disk', async () => {
    const thin = () => {
      const d = Buffer.alloc(2 * MiB)
      randomBytes(BLOCK).copy(d, 3 * BLOCK)
      randomBytes(BLOCK).copy(d, 20 * BLOCK)
      return d
    }
    for (const cbt of [true, false]) {
      const src = new ScriptedLiveSource([thin()], { warm: true, cbt })
      const reads: number[] = []
      const { deps, sink, id, store } = await setup(src, 'Cold', { copyDisk: countingCopy(reads) })
      const job = await runJob(deps)
      expect([cbt, job.state, job.progress.bytes_done]).toEqual([cbt, 'Completed', 2 * MiB])
      expect(image(sink, id, 'disk0').equals(src.disks[0])).toBe(true)
      expect([cbt, reads, src.allocatedCalls]).toEqual(cbt ? [cbt, [2 * BLOCK], ['disk0']] : [cbt, [2 * MiB], []])
      await store.close()
    }
  })

  test('warm: the source changes between passes; two delta passes copy only changed blocks, then the cutover; images equal the final disks', async () => {
    const src = new ScriptedLiveSource([randomBytes(2 * MiB), randomBytes(MiB)], { warm: true, cbt: true })
    // After the full-copy snapshot: 16 blocks change; after the 1st delta: 1 block (below 2 blocks
    // = converged); after the 2nd (the cutover's final delta follows the shutdown): 1 more block.
    src.afterSnapshot = (k, disks) => {
      if (k === 0) {
        for (let b = 0; b < 8; b++) {
          randomBytes(BLOCK).copy(disks[0], 2 * b * BLOCK)
          randomBytes(BLOCK).copy(disks[1], (2 * b + 1) * BLOCK)
        }
      }
      if (k === 1 || k === 2) randomBytes(100).copy(disks[0], 5 * BLOCK + 17)
    }
    const reads: number[] = []
    const { deps, states, sink, id } = await setup(src, 'Warm', { copyDisk: countingCopy(reads) })
    const job = await runJob(deps)
    expect([job.state, job.last_error]).toEqual(['Completed', null])
    expect(states).toEqual(['CopyingFull', 'DeltaSyncing', 'CuttingOver', 'CuttingOver', 'Starting', 'Completed'])
    expect(image(sink, id, 'disk0').equals(src.disks[0])).toBe(true)
    expect(image(sink, id, 'disk1').equals(src.disks[1])).toBe(true)
    // full copies (2 disks) then per pass one read per disk: 16 changed blocks, then 1, then 1.
    expect(reads.slice(0, 2)).toEqual([2 * MiB, MiB])
    expect(reads[2] + reads[3]).toBe(16 * BLOCK)
    expect(reads[4] + reads[5]).toBe(BLOCK)
    expect(reads[6] + reads[7]).toBe(BLOCK)
    expect(src.calls.filter((c) => c === 'shutdown')).toHaveLength(1)
    expect(src.calls.indexOf('shutdown')).toBeGreaterThan(src.calls.indexOf(`snapshot migrator-${id}-1`))
    expect(src.calls).toContain('enableCbt')
    expect(src.calls.at(-2)).toBe('cleanup (1 left)')
  })

  test('a changeId reset (E_MIG_CBT_RESET) is answered once with a full copy of that disk; the job completes bit-exact', async () => {
    const src = new ScriptedLiveSource([randomBytes(2 * MiB)], { warm: true, cbt: true })
    src.afterSnapshot = (k, disks) => {
      if (k <= 1) randomBytes(BLOCK).copy(disks[0], 3 * BLOCK)
    }
    src.resetOn = new Set([0])
    const reads: number[] = []
    const { deps, sink, id } = await setup(src, 'Warm', {
      copyDisk: async (r, v, o) => {
        const res = await copyDisk(r, v, o)
        reads.push(res.bytes_read)
        return res
      },
    })
    const job = await runJob(deps)
    expect([job.state, job.last_error]).toEqual(['Completed', null])
    expect(reads[0]).toBe(2 * MiB) // first full copy
    expect(reads[1]).toBe(2 * MiB) // the reset pass: the whole disk again
    expect(reads.slice(2).every((n) => n <= BLOCK)).toBe(true)
    expect(image(sink, id, 'disk0').equals(src.disks[0])).toBe(true)
  })

  test('a second changeId reset in the same job fails it with E_MIG_CBT_RESET; its snapshots are cleaned up', async () => {
    const src = new ScriptedLiveSource([randomBytes(MiB)], { warm: true, cbt: true })
    src.afterSnapshot = (_k, disks) => randomBytes(8 * BLOCK).copy(disks[0], 0)
    src.resetOn = new Set([0, 1])
    const { deps } = await setup(src, 'Warm')
    const job = await runJob(deps)
    expect([job.state, job.last_error?.code]).toEqual(['Failed', 'E_MIG_CBT_RESET'])
    // The previous and the new snapshot both still exist when the pass fails: cleanup removes them.
    expect(src.calls.at(-2)).toBe('cleanup (2 left)')
  })

  test('warm without CBT is downgraded to cold: non-fatal E_MIG_CBT_UNSUPPORTED on last_error, Completed', async () => {
    const src = new ScriptedLiveSource([randomBytes(MiB)], { warm: true, cbt: false })
    const { deps, states, sink, id } = await setup(src, 'Warm')
    const job = await runJob(deps)
    expect(job.state).toBe('Completed')
    expect(job.effective_mode).toBe('Cold')
    expect(job.last_error).toEqual({
      code: 'E_MIG_CBT_UNSUPPORTED',
      message: 'warm migration downgraded to cold: changed block tracking is not available on this VM',
      fatal: false,
    })
    expect(states).toEqual(['CopyingFull', 'CopyingFull', 'CopyingFull', 'Starting', 'Completed'])
    expect(image(sink, id, 'disk0').equals(src.disks[0])).toBe(true)
    expect(src.calls).toContain('shutdown')
  })

  test('an adapter without warm support downgrades too, naming the adapter as the reason', async () => {
    const src = new ScriptedLiveSource([randomBytes(MiB)], { warm: false, cbt: true })
    const { deps } = await setup(src, 'Warm')
    const job = await runJob(deps)
    expect(job.state).toBe('Completed')
    expect(job.last_error?.message).toBe('warm migration downgraded to cold: the source adapter does not support warm migration')
  })

  test('a delta that never converges ends E_MIG_DELTA_TOO_LARGE after the configured passes; every snapshot is cleaned up', async () => {
    const src = new ScriptedLiveSource([randomBytes(2 * MiB)], { warm: true, cbt: true })
    src.afterSnapshot = (_k, disks) => randomBytes(8 * BLOCK).copy(disks[0], 0)
    const { deps, states } = await setup(src, 'Warm')
    const job = await runJob(deps)
    expect([job.state, job.last_error?.code, job.last_error?.fatal]).toEqual(['Failed', 'E_MIG_DELTA_TOO_LARGE', true])
    expect(job.last_error?.message).toBe(`deltas did not fall below ${2 * BLOCK} bytes in 4 passes`)
    expect(states.at(-1)).toBe('Failed')
    expect(src.calls.filter((c) => c.startsWith('snapshot'))).toHaveLength(5)
    expect(src.calls.at(-2)).toBe('cleanup (1 left)')
    expect(src.calls).not.toContain('shutdown')
  })

  test('a refused snapshot fails the job E_MIG_SNAPSHOT_FAILED before anything is copied', async () => {
    const src = new ScriptedLiveSource([randomBytes(MiB)], { warm: true, cbt: true, failSnapshot: true })
    const { deps, store, id } = await setup(src, 'Cold')
    const job = await runJob(deps)
    expect([job.state, job.last_error?.code]).toEqual(['Failed', 'E_MIG_SNAPSHOT_FAILED'])
    expect((await store.watermarks.list(id)).filter((w) => w.watermark_bytes > 0)).toEqual([])
    expect(src.calls).toContain('cleanup (0 left)')
  })

  test('cancel during the copy ends Cancelled with E_MIG_CANCELLED, removes the volumes and the watermarks', async () => {
    const src = new ScriptedLiveSource([randomBytes(8 * MiB)], { warm: true, cbt: true })
    const ac = new AbortController()
    const { deps, sink, id, store } = await setup(src, 'Cold', {
      signal: ac.signal,
      copyDisk: (r, v, o) => copyDisk(r, v, { ...o, maxBytesPerSecond: 8 * MiB, flushEveryBytes: MiB }),
    })
    setTimeout(() => ac.abort(), 300)
    const job = await runJob(deps)
    expect([job.state, job.last_error?.code]).toEqual(['Cancelled', 'E_MIG_CANCELLED'])
    expect(existsSync(sink.jobDir(id))).toBe(false)
    expect(await store.watermarks.list(id)).toEqual([])
  })

  test('progress: an update inside the throttle interval goes out when the interval ends, to the job and to listeners', async () => {
    const src = new ScriptedLiveSource([randomBytes(2 * MiB)], { warm: false, cbt: false })
    const sent: number[] = []
    let duringPause: { sent: number[]; stored: number | undefined } | null = null
    const { deps, store, id } = await setup(src, 'Cold', {
      onProgress: (p) => sent.push(p.progress.bytes_done),
      // Two updates at once and a pause (as under a bandwidth cap): the second must not wait for
      // the copy's end. Then the real copy, its own updates silenced.
      copyDisk: async (r, v, o) => {
        o.onProgress({ bytes_done: MiB, bytes_zero: 0, watermark: 0 })
        o.onProgress({ bytes_done: MiB + 4096, bytes_zero: 0, watermark: 0 })
        await Bun.sleep(PROGRESS_EVERY_MS + 300)
        duringPause = { sent: [...sent], stored: (await store.jobs.get(id)).progress?.bytes_done }
        return copyDisk(r, v, { ...o, onProgress: () => {} })
      },
    })
    const job = await runJob(deps)
    expect(job.state).toBe('Completed')
    expect(duringPause!.sent).toEqual([MiB, MiB + 4096])
    expect(duringPause!.stored).toBe(MiB + 4096)
    await store.close()
  })

  test('Windows guests (plan guest_os) go through V2vProcessing between the copy and Starting', async () => {
    const src = new ScriptedLiveSource([randomBytes(MiB)], { warm: true, cbt: true })
    const { deps, states, v2v, sink, id } = await setup(src, 'Cold', {}, { guest_os: 'windows' })
    const job = await runJob(deps)
    expect(job.state).toBe('Completed')
    expect(states).toEqual(['CopyingFull', 'CopyingFull', 'V2vProcessing', 'Starting', 'Completed'])
    expect(v2v).toEqual([sink.volumePath(id, 'disk0')])
  })

  test('plan restore_point: the backup runs before any volume exists and is recorded; a failing backup stops the job with nothing written', async () => {
    const point = {
      backup_job_id: '11111111-2222-4333-8444-555555555555',
      run_id: 'run-9',
      restore_point_id: 'rp-9',
      quiesced: true,
      created_at: '2026-11-22T00:00:00Z',
    }
    const plan = { restore_point: { backup_job_id: point.backup_job_id } }
    const src = new ScriptedLiveSource([randomBytes(MiB)], { warm: true, cbt: true })
    let volumesAtBackup: boolean | null = null
    const ok = await setup(src, 'Cold', { takeRestorePoint: async (j: Job) => ((volumesAtBackup = existsSync(ok.sink.jobDir(j.id))), point) }, plan)
    const job = await runJob(ok.deps)
    expect([job.state, job.restore_point]).toEqual(['Completed', point])
    expect(volumesAtBackup as boolean | null).toBe(false)

    const bad = await setup(
      new ScriptedLiveSource([randomBytes(MiB)], { warm: true, cbt: true }),
      'Cold',
      {
        takeRestorePoint: async () => {
          throw new MigError('E_MIG_SNAPSHOT_FAILED', 'backup run run-10 failed: the host backup job ended in error')
        },
      },
      plan,
    )
    const failed = await runJob(bad.deps)
    expect([failed.state, failed.last_error?.code, failed.restore_point]).toEqual(['Failed', 'E_MIG_SNAPSHOT_FAILED', null])
    expect(existsSync(bad.sink.jobDir(bad.id))).toBe(false)
  })
})

describe('orchestrator, offline path: the first reader opens while the pre-copy checks run', () => {
  /** A reader over `data` in memory (TEST DOUBLE of an image reader), recording its close. */
  function memoryReader(data: Buffer, log: string[], name: string): DiskReader {
    return {
      size: data.length,
      async *extents(from: number) {
        yield { offset: from, length: data.length - from, zero: false }
      },
      async read(offset: number, length: number) {
        return data.subarray(offset, offset + length)
      },
      async close() {
        log.push(`close ${name}`)
      },
    }
  }
  const manifest = (disks: Buffer[]): VmManifest => ({
    ...new ScriptedLiveSource(disks, { warm: false, cbt: false }).manifest(),
    source_format: 'qcow2',
  })
  /** An offline source whose `openReader` is slow (20 ms, like qemu-nbd's start) and logged. */
  function offline(disks: Buffer[], log: string[], failOpen?: MigError) {
    return async () => ({
      strategy: 'offline' as const,
      manifest: manifest(disks),
      openReader: async (d: ManifestDisk) => {
        log.push(`open ${d.label}`)
        await new Promise((r) => setTimeout(r, 20))
        if (failOpen) throw failOpen
        log.push(`opened ${d.label}`)
        return memoryReader(disks[Number(d.label.slice(4))]!, log, d.label)
      },
      close: async () => void log.push('source closed'),
    })
  }

  test('disk0 opens during preflight, is used by the copy (one open per disk), both images bit-exact', async () => {
    const disks = [randomBytes(2 * MiB), randomBytes(MiB)]
    const log: string[] = []
    const s = await setup(new ScriptedLiveSource([], { warm: false, cbt: false }), 'Cold', {
      prepare: offline(disks, log) as OrchestratorDeps['prepare'],
      preflight: async () => {
        log.push('preflight')
        await new Promise((r) => setTimeout(r, 40))
        log.push('preflight done')
      },
    })
    const job = await runJob(s.deps)
    expect(job.state).toBe('Completed')
    expect(log.indexOf('opened disk0')).toBeLessThan(log.indexOf('preflight done'))
    expect(log.filter((l) => l.startsWith('open '))).toEqual(['open disk0', 'open disk1'])
    expect(log.filter((l) => l.startsWith('close '))).toEqual(['close disk0', 'close disk1'])
    expect(image(s.sink, s.id, 'disk0').equals(disks[0]!)).toBe(true)
    expect(image(s.sink, s.id, 'disk1').equals(disks[1]!)).toBe(true)
  })

  test("a preflight refusal wins over the early open and closes the opened reader; an open failure is the copy's error", async () => {
    const disks = [randomBytes(MiB)]
    const log: string[] = []
    const refused = await setup(new ScriptedLiveSource([], { warm: false, cbt: false }), 'Cold', {
      prepare: offline(disks, log) as OrchestratorDeps['prepare'],
      preflight: async () => {
        await new Promise((r) => setTimeout(r, 40))
        throw new MigError('E_MIG_DISK_WRITE_FAILED', 'scripted: not enough space for the disks')
      },
    })
    const job = await runJob(refused.deps)
    expect([job.state, job.last_error?.code]).toEqual(['Failed', 'E_MIG_DISK_WRITE_FAILED'])
    expect(log).toContain('close disk0')
    expect(log.indexOf('close disk0')).toBeLessThan(log.indexOf('source closed'))

    const log2: string[] = []
    const broken = await setup(new ScriptedLiveSource([], { warm: false, cbt: false }), 'Cold', {
      prepare: offline(disks, log2, new MigError('E_MIG_DISK_READ_FAILED', 'scripted: qemu-nbd refused')) as OrchestratorDeps['prepare'],
    })
    const failed = await runJob(broken.deps)
    expect([failed.state, failed.last_error?.code]).toEqual(['Failed', 'E_MIG_DISK_READ_FAILED'])
    expect(broken.states).toContain('CopyingFull')
  })
})
