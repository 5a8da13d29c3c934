/**
 * End to end through the HTTP API: an input of each of the eight
 * non-passthrough offline kinds, built with real tools around a bootable disk (a hand-written
 * boot sector that prints a marker on COM1) and, where the format allows, a second data disk, is
 * imported by the real server into the file sink and started on real libvirt + qemu (TCG); OVF
 * packages also with their files gzip-compressed and/or in chunks (staged at copy time).
 * Checks: the job goes Queued -> CopyingFull -> Starting -> Completed (seen on the SSE stream, in
 * order, with progress events), every destination image is bit-exact with `qemu-img convert -O raw`
 * of its source and allocates at most its non-zero data + 5%, the domain runs and its serial log
 * shows the marker. Then the failure ends of Starting: a disk that does not boot, and a domain
 * libvirt refuses to define.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeBadBootDisk, makeBootDisk } from '../helpers/bootdisk.ts'
import { buildInput, fileSha256, makeRawImage, rawSha256, type InputPacking } from '../helpers/inputs.ts'
import { allocatedBytes, bootCheckEnv, call, nonZeroBytes, offlinePlan, openStream, streamSaw, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { domstate } from '../helpers/libvirt.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { execFileSync } from 'node:child_process'

const PREFIX = 'mige2e-'
const MARKER = 'MIGRATOR-E2E-BOOT-7781'
const MiB = 1024 * 1024
const KINDS: Array<{ kind: string; disks: 1 | 2; format?: string; packing?: InputPacking; how?: string }> = [
  { kind: 'ova_archive', disks: 2 },
  { kind: 'ovf_folder', disks: 2 },
  // OVF files stored gzip-compressed and/or in chunks, staged at copy time
  { kind: 'ova_archive', disks: 2, packing: { gzip: true }, how: 'gzip-compressed files' },
  { kind: 'ovf_folder', disks: 2, packing: { chunkSize: MiB }, how: '1 MiB chunks' },
  { kind: 'ova_archive', disks: 2, packing: { gzip: true, chunkSize: 256 * 1024 }, how: 'gzip-compressed 256 KiB chunks' },
  { kind: 'vmx_folder', disks: 2 },
  { kind: 'vhdx', disks: 1, format: 'vhdx' },
  { kind: 'vhdx', disks: 1, format: 'vpc', packing: { vhd: true }, how: 'a dynamic VHD' },
  { kind: 'qcow2', disks: 1, format: 'qcow2' },
  { kind: 'vmdk', disks: 1, format: 'vmdk' },
  { kind: 'vbox_folder', disks: 2 },
  { kind: 'xva_archive', disks: 2 },
]

describe('offline import of every kind, end to end on libvirt (TCG)', () => {
  // Each test's domains and destination disks go when it ends, passed or failed.
  const { t, srv } = serverSuite({ prefix: PREFIX, tmpPrefix: 'mig-e2e-', traversable: true, env: bootCheckEnv(MARKER), cleanEach: true })
  const importRoot = path.join(t.dir, 'imports')
  let boot = ''
  let data = ''

  beforeAll(async () => {
    mkdirSync(importRoot, { recursive: true })
    boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 32 * MiB).path
    data = makeRawImage(path.join(t.dir, 'data.raw'), 24 * MiB, 7)
  }, 60_000)

  for (const [n, { kind, disks, format, packing, how }] of KINDS.entries()) {
    test(`${kind}${how ? ` (${how})` : ''}: Completed, ${disks} image(s) bit-exact and sparse, domain running with the marker on its serial console`, async () => {
      const raws = disks === 2 ? [boot, data] : [boot]
      const input = buildInput(kind, importRoot, `in-${n}-${kind}`, raws, packing)
      const stream = openStream(srv.base)
      await stream.ready
      const job = await submit(srv.base, offlinePlan(kind, path.relative(importRoot, input.path), { name: `${PREFIX}${n}-${kind.replace('_', '-')}` }))
      expect(job.state).toBe('Queued')
      const done = await waitJob(srv.base, job.id)
      await streamSaw(stream, job.id, 'Completed')
      stream.close()
      expect([done.state, done.last_error]).toEqual(['Completed', null])

      // SSE: every state of the job in order, and progress events while copying.
      const mine = stream.events.filter((e) => e.data.id === job.id)
      const states = mine.filter((e) => e.event === 'migration').map((e) => e.data.state)
      expect(states).toEqual(['Queued', 'CopyingFull', 'Starting', 'Completed'])
      expect(mine.some((e) => e.event === 'progress' && e.data.progress.bytes_total === input.disks.reduce((s, d) => s + d.capacity, 0))).toBe(true)
      const ids = mine.map((e) => e.id)
      expect(ids).toEqual([...ids].sort((a, b) => a - b))

      // Destination images: bit-exact with the source, no larger than its data + 5%.
      expect(done.progress.disks.length).toBe(disks)
      for (const [i, d] of done.progress.disks.entries()) {
        const img = volumePath(t.dir, job.id, d.label)
        expect(fileSha256(img)).toBe(fileSha256(raws[i]))
        // + one 4 KiB block: ext4 counts the extent-tree block of a file with over four extents in st_blocks.
        expect(allocatedBytes(img)).toBeLessThanOrEqual(Math.ceil(nonZeroBytes(raws[i]) * 1.05) + 4096)
      }
      if (format) expect(rawSha256(input.path, format, t.dir)).toBe(fileSha256(boot))
      expect(done.progress.bytes_done).toBe(done.progress.bytes_total)
      // nothing staged is left behind
      expect(existsSync(path.join(t.dir, 'tmp', 'staging', job.id)) && readdirSync(path.join(t.dir, 'tmp', 'staging', job.id)).length > 0).toBe(false)

      // The domain runs and printed the marker.
      const name = `${PREFIX}${n}-${kind.replace('_', '-')}`
      expect(done.domain).toBe(name)
      expect(domstate(name)).toBe('running')
      expect(readFileSync(path.join(t.dir, 'logs', `${job.id}.serial.log`), 'utf8')).toContain(MARKER)
      execFileSync('virsh', ['-c', 'qemu:///system', 'destroy', name], { stdio: 'ignore' })
    }, 120_000)
  }

  test('SSE replay: reconnecting with Last-Event-ID gets every later event of a job, in order, with the same ids', async () => {
    const input = buildInput('qcow2', importRoot, 'replay', [boot])
    const live = openStream(srv.base)
    await live.ready
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: `${PREFIX}replay`, start: false }))
    await waitJob(srv.base, job.id)
    await streamSaw(live, job.id, 'Completed')
    live.close()
    const mine = live.events.filter((e) => e.data.id === job.id)
    expect(mine.length).toBeGreaterThanOrEqual(4)
    // A client that saw only the first event (Queued) reconnects.
    const replay = openStream(srv.base, mine[0].id)
    await replay.ready
    await streamSaw(replay, job.id, 'Completed')
    replay.close()
    const replayed = replay.events.filter((e) => e.data.id === job.id)
    expect(replayed.map((e) => [e.id, e.event, e.data.state])).toEqual(mine.slice(1).map((e) => [e.id, e.event, e.data.state]))
    expect(replay.events.every((e) => e.id > mine[0].id)).toBe(true)
  }, 120_000)

  test('a disk that does not boot ends in E_MIG_GUEST_BOOT_FAILED with the serial tail; the domain is left defined and stopped', async () => {
    const bad = makeBadBootDisk(path.join(t.dir, 'bad.raw'), 8 * MiB).path
    const input = buildInput('qcow2', importRoot, 'nonboot', [bad])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(importRoot, input.path), { name: `${PREFIX}nonboot` }))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error.code, done.last_error.fatal]).toEqual(['Failed', 'E_MIG_GUEST_BOOT_FAILED', true])
    // Caught by evidence (SeaBIOS's own message on the serial console), not by the operator's
    // pattern running out: the reason names the firmware, and it comes before the 20 s timeout.
    expect(done.last_error.message).toContain('did not boot: the firmware found no bootable disk')
    expect(done.last_error.message).toContain('No bootable device')
    expect(done.last_error.message).not.toContain('did not match')
    expect(Number(/after ([\d.]+) s/.exec(done.last_error.message)?.[1])).toBeLessThan(20)
    expect(done.domain).toBe(`${PREFIX}nonboot`)
    expect(domstate(`${PREFIX}nonboot`)).toBe('shut off')
  }, 120_000)

  test('a domain libvirt refuses to define (512 vCPUs on q35, limit 288) ends in E_MIG_DOMAIN_DEFINE_FAILED with libvirt message', async () => {
    const input = buildInput('vmx_folder', importRoot, 'bigcpu', [boot])
    const vmx = path.join(input.path, 'bigcpu.vmx')
    writeFileSync(vmx, readFileSync(vmx, 'utf8').replace('numvcpus = "2"', 'numvcpus = "512"'))
    const job = await submit(srv.base, offlinePlan('vmx_folder', 'bigcpu', { name: `${PREFIX}bigcpu` }))
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_DOMAIN_DEFINE_FAILED'])
    expect(done.last_error.message).toContain('Maximum CPUs greater than specified machine type limit')
    expect(domstate(`${PREFIX}bigcpu`)).toBe('absent')
    expect(done.domain).toBeNull()
  }, 120_000)

  test('the upload path: a local OVA uploaded, then imported from the upload id', async () => {
    const input = buildInput('ova_archive', path.join(t.dir, 'outside'), 'up', [boot])
    const fd = new FormData()
    fd.append('file', new Blob([readFileSync(input.path)]), 'up.ova')
    const up = await (await fetch(`${srv.base}/uploads?sha256=${fileSha256(input.path)}`, { method: 'POST', body: fd })).json()
    expect(up.status).toBe('ready')
    const job = await submit(srv.base, {
      source: { Offline: 'ova_archive' },
      source_ref: { kind: 'upload', upload_id: up.id },
      mode: 'Cold',
      name: `${PREFIX}upload`,
    })
    const done = await waitJob(srv.base, job.id)
    expect(done.state).toBe('Completed')
    expect(fileSha256(volumePath(t.dir, job.id, done.progress.disks[0].label))).toBe(fileSha256(boot))
    expect(existsSync(path.join(importRoot, '.uploads', up.id))).toBe(true)
    expect((await call(srv.base, 'GET', `/migrations/${job.id}`)).body.plan.source_ref.upload_id).toBe(up.id)
  }, 120_000)
})
