/**
 * The `libvirt_remote` adapter against this machine's real libvirtd reached as a remote host:
 * `qemu+ssh://root@127.0.0.1:<port>/system` through a real OpenSSH server the test starts
 * (test/helpers/sshd.ts: its own host key and a test key pair). Source domains `lvsrc-*` are
 * defined by the test over qcow2 (and one raw) disks holding the bootable test disk of
 * fixtures/bootdisk.ts; they run under TCG when a test needs them running.
 *
 * Guest writes between passes are made by QEMU's own block layer (HMP `qemu-io` on the disk's
 * device: the same path a guest write takes, so the dirty bitmaps of the checkpoints see them):
 * the boot-sector guest does not write by itself.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { createLibvirtAdapter, MAX_NVRAM_BYTES, type LibvirtSession } from '../../lib/adapters/libvirt/adapter.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { thrown } from '../helpers/env.ts'
import { ensureLibvirt } from '../helpers/libvirt.ts'
import { defineSource, makeQcow2, qemuWrite, rawOf, removeTestDomains, virsh, virshOk } from '../helpers/libvirt-source.ts'
import { writeVarsWithBootEntry } from '../helpers/ovmf-vars.ts'
import { startSshd, type RunningSshd } from '../helpers/sshd.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'lvsrc-'
const MARKER = 'MIGRATOR-LVSRC-BOOT-7310'
const MiB = 1024 * 1024

async function readAll(s: LibvirtSession, vmId: string, snap: { id: string; change_ids: Record<string, string> }, disk: ManifestDisk) {
  const r = await s.openDisk(vmId, snap, disk)
  const out = Buffer.alloc(r.size)
  let zero = 0
  try {
    for await (const e of r.extents(0)) {
      if (e.zero) {
        zero += e.length
        continue
      }
      for (let o = e.offset; o < e.offset + e.length; o += 4 * MiB) {
        const n = Math.min(4 * MiB, e.offset + e.length - o)
        ;(await r.read(o, n)).copy(out, o)
      }
    }
  } finally {
    await r.close()
  }
  return { data: out, zero }
}

describe('libvirt_remote adapter against the real libvirtd over a real sshd', () => {
  const t = tempDir('mig-lvsrc-')
  let sshd: RunningSshd
  const endpoint = () => `qemu+ssh://root@127.0.0.1:${sshd.port}/system`
  const connect = (over: Record<string, unknown> = {}, opts = {}) =>
    createLibvirtAdapter({ shutdownTimeoutMs: 5000, pollMs: 200, readBackoffMs: 200, ...opts }).connect({
      endpoint: endpoint(),
      username: 'root',
      password: sshd.privateKey,
      tls: { known_hosts: sshd.knownHosts },
      ...over,
    }) as Promise<LibvirtSession>

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    await ensureLibvirt()
    removeTestDomains(PREFIX)
    sshd = await startSshd(path.join(t.dir, 'sshd'))
  }, 60_000)

  afterAll(async () => {
    removeTestDomains(PREFIX)
    await sshd?.stop()
    t.cleanup()
  }, 60_000)

  test('connect, describe, list (disks with format and sizes, NICs with MAC) and inspect into a manifest', async () => {
    const q = makeQcow2(path.join(t.dir, 'list-a.qcow2'), MARKER, 16 * MiB)
    const raw = path.join(t.dir, 'list-b.raw')
    makeBootDisk(raw, MARKER, 8 * MiB)
    const uuid = defineSource(`${PREFIX}list`, [
      { file: q, format: 'qcow2' },
      { file: raw, format: 'raw' },
    ])
    const s = await connect()
    try {
      const about = await s.describe()
      expect(about.product).toMatch(/^libvirt \d+\.\d+\.\d+ \(QEMU /)
      const vm = (await s.listVms()).find((v) => v.name === `${PREFIX}list`)!
      expect(vm).toMatchObject({
        vm_id: uuid,
        power_state: 'off',
        cpu_count: 1,
        memory_bytes: 64 * MiB,
        firmware: 'bios',
        guest_id: 'http://debian.org/debian/12',
      })
      expect(vm.disks!.map((d) => [d.label, d.format, d.capacity_bytes, d.bus, d.path])).toEqual([
        ['vda', 'qcow2', 16 * MiB, 'virtio', q],
        ['vdb', 'raw', 8 * MiB, 'virtio', raw],
      ])
      expect(vm.disks![0]!.allocated_bytes).toBeGreaterThan(0)
      expect(vm.nics).toEqual([{ mac: '52:54:00:4c:56:01', model: 'virtio', network: null }])
      const m = await s.inspect(uuid)
      expect(m).toMatchObject({ name: `${PREFIX}list`, source_format: 'libvirt_remote', firmware: 'bios', memory_bytes: 64 * MiB, cbt_available: false })
      expect(m.guest_os).toEqual({ family: 'linux', id: 'http://debian.org/debian/12' })
      expect(m.disks.map((d) => [d.label, d.disk_format, d.capacity_bytes, d.controller])).toEqual([
        ['vda', 'qcow2', 16 * MiB, 'virtio'],
        ['vdb', 'raw', 8 * MiB, 'virtio'],
      ])
      expect(m.nics[0]!.mac).toBe('52:54:00:4c:56:01')
      // the raw disk: reported, and the VM offered cold only
      expect(m.warnings.some((w) => /vdb is raw: libvirt checkpoints need qcow2/.test(w))).toBe(true)
      const e = await thrown(() => s.enableCbt(uuid))
      expect([e.code, /vdb is raw/.test(e.message)]).toEqual(['E_MIG_CBT_UNSUPPORTED', true])
      // by name too; an unknown domain is E_MIG_VM_NOT_FOUND
      expect((await s.inspect(`${PREFIX}list`)).name).toBe(`${PREFIX}list`)
      expect((await thrown(() => s.inspect(`${PREFIX}nosuch`))).code).toBe('E_MIG_VM_NOT_FOUND')
      expect((await thrown(() => s.inspect('--all'))).code).toBe('E_MIG_VM_NOT_FOUND')
    } finally {
      await s.close()
    }
    // the connection's private key directory is gone with the connection
    expect(existsSync(s.t.dir)).toBe(false)
  }, 60_000)

  test('wrong key: E_MIG_AUTH_FAILED; host key mismatch: E_MIG_AUTH_FAILED (host_key_mismatch); nothing listening: E_MIG_SOURCE_UNREACHABLE', async () => {
    const wrongKey = await thrown(() => connect({ password: sshd.otherKey }))
    expect([wrongKey.code, wrongKey.details.reason]).toEqual(['E_MIG_AUTH_FAILED', 'login_refused'])
    const mitm = await thrown(() => connect({ tls: { known_hosts: sshd.wrongKnownHosts } }))
    expect([mitm.code, mitm.details.reason, /host key verification failed/.test(mitm.message)]).toEqual(['E_MIG_AUTH_FAILED', 'host_key_mismatch', true])
    // no pinned key at all is a mismatch too; insecure skips the check only by choice
    expect((await thrown(() => connect({ tls: {} }))).details.reason).toBe('host_key_mismatch')
    const insecure = await connect({ tls: { insecure: true } })
    expect((await insecure.describe()).version).toMatch(/^\d+\.\d+/)
    await insecure.close()
    const down = await thrown(() =>
      createLibvirtAdapter().connect({
        endpoint: 'qemu+ssh://root@127.0.0.1:1/system',
        username: 'root',
        password: sshd.privateKey,
        tls: { known_hosts: sshd.knownHosts },
      }),
    )
    expect(down.code).toBe('E_MIG_SOURCE_UNREACHABLE')
    for (const bad of ['qemu+tcp://127.0.0.1/system', 'qemu+ssh://127.0.0.1/system?keyfile=/etc/shadow', 'qemu+ssh://127.0.0.1/other'])
      expect([bad, (await thrown(() => connect({ endpoint: bad }))).code]).toEqual([bad, 'E_MIG_BAD_REQUEST'])
  }, 60_000)

  test('cold: a shut-off domain is started paused for a full pull backup, read bit-exact with zeros skipped, then destroyed; nothing left', async () => {
    const q = makeQcow2(path.join(t.dir, 'cold.qcow2'), MARKER, 32 * MiB)
    const uuid = defineSource(`${PREFIX}cold`, [{ file: q, format: 'qcow2' }])
    const expected = rawOf(q, t.dir)
    const s = await connect()
    try {
      const m = await s.inspect(uuid)
      expect(await s.shutdown(uuid)).toBe(false)
      const snap = await s.createSnapshot(uuid, 'migrator-coldjob-0')
      expect(snap).toEqual({ id: 'migrator-coldjob-0', change_ids: {} })
      expect(virsh('domstate', '--domain', uuid)).toBe('paused')
      const { data, zero } = await readAll(s, uuid, snap, m.disks[0]!)
      expect(data.equals(expected)).toBe(true)
      // the sparse test disk is mostly zeros: those were never read
      expect(zero).toBeGreaterThan(24 * MiB)
      await s.removeSnapshot(uuid, snap)
      await s.cleanup(uuid)
      expect(virsh('domstate', '--domain', uuid)).toBe('shut off')
      expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toBe('')
    } finally {
      await s.close()
    }
  }, 120_000)

  test('warm: checkpoints and incremental pull backups give exactly the written areas; cleanup leaves no checkpoint', async () => {
    const q = makeQcow2(path.join(t.dir, 'warm.qcow2'), MARKER, 32 * MiB)
    const uuid = defineSource(`${PREFIX}warm`, [{ file: q, format: 'qcow2' }])
    virsh('start', '--domain', uuid)
    const s = await connect()
    try {
      const m = await s.inspect(uuid)
      expect(m.cbt_available).toBe(true)
      await s.enableCbt(uuid)
      const s0 = await s.createSnapshot(uuid, 'migrator-warmjob-0')
      expect(s0.change_ids).toEqual({ vda: 'migrator-warmjob-0' })
      const full = await readAll(s, uuid, s0, m.disks[0]!)
      qemuWrite(`${PREFIX}warm`, 'vda', 3 * MiB, MiB, 0x5a)
      qemuWrite(`${PREFIX}warm`, 'vda', 20 * MiB, 64 * 1024, 0x6b)
      const s1 = await s.createSnapshot(uuid, 'migrator-warmjob-1')
      const areas = await s.changedAreas(uuid, s1, m.disks[0]!, 'migrator-warmjob-0')
      expect(areas).toEqual([
        { offset: 3 * MiB, length: MiB },
        { offset: 20 * MiB, length: 64 * 1024 },
      ])
      // a changed area read from the new backup carries the write; the full pass did not
      const r = await s.openDisk(uuid, s1, m.disks[0]!)
      expect((await r.read(3 * MiB, 4096)).every((b) => b === 0x5a)).toBe(true)
      await r.close()
      expect(full.data[3 * MiB]).not.toBe(0x5a)
      // a changeId that is not this backup's base: E_MIG_CBT_RESET
      expect((await thrown(() => s.changedAreas(uuid, s1, m.disks[0]!, 'migrator-other-0'))).code).toBe('E_MIG_CBT_RESET')
      await s.removeSnapshot(uuid, s0)
      expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toBe('migrator-warmjob-1')
      await s.mark(uuid, 'migrating to this host, job warmjob')
      expect(virsh('metadata', '--domain', uuid, '--uri', 'https://vm-migrator.invalid/libvirt-source/mark', '--config')).toContain('job warmjob')
      await s.cleanup(uuid)
      expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toBe('')
      // the running source was not stopped by the cleanup (the migrator did not start it)
      expect(virsh('domstate', '--domain', uuid)).toBe('running')
      expect(await s.shutdown(uuid)).toBe(true)
      expect(virsh('domstate', '--domain', uuid)).toBe('shut off')
    } finally {
      await s.close()
    }
  }, 180_000)

  test('a disk converted or resized since inspection: E_MIG_DISK_READ_FAILED naming the change', async () => {
    const q = makeQcow2(path.join(t.dir, 'change.qcow2'), MARKER, 16 * MiB)
    const name = `${PREFIX}change`
    const uuid = defineSource(name, [{ file: q, format: 'qcow2' }])
    const s = await connect()
    try {
      const before = await s.inspect(uuid)
      // resized: the export is larger than the manifest says
      execFileSync('qemu-img', ['resize', '-q', q, `${32 * MiB}`])
      let snap = await s.createSnapshot(uuid, 'migrator-changejob-0')
      const resized = await thrown(() => s.openDisk(uuid, snap, before.disks[0]!))
      expect([resized.code, /resized/.test(resized.message)]).toEqual(['E_MIG_DISK_READ_FAILED', true])
      await s.cleanup(uuid)
      // converted: the domain now names a raw disk
      const raw = path.join(t.dir, 'change.raw')
      execFileSync('qemu-img', ['convert', '-O', 'raw', q, raw])
      chmodSync(raw, 0o644)
      writeFileSync(`${raw}.xml`, virsh('dumpxml', '--domain', name, '--inactive').replace("type='qcow2'", "type='raw'").replace(q, raw))
      virsh('define', '--file', `${raw}.xml`)
      snap = await s.createSnapshot(uuid, 'migrator-changejob-1')
      const converted = await thrown(() => s.openDisk(uuid, snap, before.disks[0]!))
      expect([converted.code, /raw on the source now, qcow2 at inspection/.test(converted.message)]).toEqual(['E_MIG_DISK_READ_FAILED', true])
      await s.cleanup(uuid)
      expect(virsh('domstate', '--domain', uuid)).toBe('shut off')
    } finally {
      await s.close()
    }
  }, 120_000)

  test('a restarted worker: cleanup on a new connection ends the backup job, removes the checkpoints and stops the domain a dead one started paused', async () => {
    const q = makeQcow2(path.join(t.dir, 'dead.qcow2'), MARKER, 16 * MiB)
    const uuid = defineSource(`${PREFIX}dead`, [{ file: q, format: 'qcow2' }])
    const dead = await connect()
    await dead.enableCbt(uuid)
    await dead.createSnapshot(uuid, 'migrator-deadjob-0')
    await dead.createSnapshot(uuid, 'migrator-deadjob-1')
    // the worker dies: its connection's files and forwards go, libvirt keeps the backup job,
    // the checkpoints and the domain it started paused
    dead.t.close()
    expect(virsh('checkpoint-list', '--domain', uuid, '--name').split('\n')).toEqual(['migrator-deadjob-0', 'migrator-deadjob-1'])
    expect(virsh('domstate', '--domain', uuid)).toBe('paused')
    expect(virsh('domjobinfo', '--domain', uuid)).toMatch(/Backup/)
    const s = await connect()
    try {
      await s.cleanup(uuid)
      expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toBe('')
      expect(virsh('domstate', '--domain', uuid)).toBe('shut off')
      // the checkpoints' bitmaps are gone from the qcow2 image too
      expect(execFileSync('qemu-img', ['info', '-U', '--output=json', q], { encoding: 'utf8' })).not.toContain('migrator-deadjob')
      expect(readdirSync('/var/lib/libvirt/qemu').filter((f) => f.startsWith('migrator-deadjob'))).toEqual([])
    } finally {
      await s.close()
    }
  }, 120_000)

  test('the UEFI variable store: read over SSH byte for byte (a hostile file name quoted); a device, an oversize and a missing file refused by name', async () => {
    const q = makeQcow2(path.join(t.dir, 'uefi.qcow2'), MARKER, 8 * MiB)
    const vars = path.join(t.dir, "odd 'name' $(touch pwned).fd")
    writeVarsWithBootEntry('/usr/share/OVMF/OVMF_VARS_4M.fd', vars, '\\EFI\\debian\\grubx64.efi')
    const uuid = defineSource(`${PREFIX}uefi`, [{ file: q, format: 'qcow2' }], '52:54:00:4c:56:09', 64, { nvram: vars })
    const s = await connect()
    try {
      const m = await s.inspect(uuid)
      expect([m.firmware, m.warnings.some((w) => /variable store/.test(w))]).toEqual(['efi', false])
      const got = await s.readNvram(uuid)
      expect(got?.source_path).toBe(vars)
      expect(got?.bytes.equals(readFileSync(vars))).toBe(true)
      expect(existsSync(path.join(t.dir, 'pwned'))).toBe(false)
      const what = 'the UEFI variable store'
      const dev = await thrown(() => s.t.readRemoteFile('/dev/zero', MAX_NVRAM_BYTES, what))
      expect([dev.code, /not a regular file/.test(dev.message), dev.message.includes('/dev/zero')]).toEqual(['E_MIG_DISK_READ_FAILED', true, true])
      const big = path.join(t.dir, 'big.fd')
      execFileSync('truncate', ['-s', String(MAX_NVRAM_BYTES + 1), big])
      const large = await thrown(() => s.t.readRemoteFile(big, MAX_NVRAM_BYTES, what))
      expect([large.code, /more than the 8388608 accepted/.test(large.message)]).toEqual(['E_MIG_DISK_READ_FAILED', true])
      const missing = await thrown(() => s.t.readRemoteFile(path.join(t.dir, 'nosuch.fd'), MAX_NVRAM_BYTES, what))
      expect([missing.code, /cannot be read/.test(missing.message), missing.details.file]).toEqual([
        'E_MIG_DISK_READ_FAILED',
        true,
        path.join(t.dir, 'nosuch.fd'),
      ])
      // a BIOS domain has none
      const bios = defineSource(`${PREFIX}bios`, [{ file: q, format: 'qcow2' }], '52:54:00:4c:56:0a')
      expect(await s.readNvram(bios)).toBeNull()
    } finally {
      await s.close()
    }
  }, 60_000)

  test('the SSH connection cut mid-copy: reads reconnect and go on; with sshd gone they fail naming the offset', async () => {
    const q = makeQcow2(path.join(t.dir, 'cut.qcow2'), MARKER, 32 * MiB)
    const uuid = defineSource(`${PREFIX}cut`, [{ file: q, format: 'qcow2' }])
    const expected = rawOf(q, t.dir)
    const s = await connect({}, { readAttempts: 2, readBackoffMs: 200 })
    try {
      const m = await s.inspect(uuid)
      const snap = await s.createSnapshot(uuid, 'migrator-cutjob-0')
      const r = await s.openDisk(uuid, snap, m.disks[0]!)
      const first = await r.read(0, MiB)
      expect(first.equals(expected.subarray(0, MiB))).toBe(true)
      // every SSH connection to the host is cut (the forward's ssh exits)
      sshd.cutConnections()
      const again = await r.read(MiB, 8 * MiB)
      expect(again.equals(expected.subarray(MiB, 9 * MiB))).toBe(true)
      await sshd.stop()
      const e = await thrown(async () => {
        sshd.cutConnections()
        await r.read(16 * MiB, MiB)
      })
      expect([e.code, e.details.offset, /offset 16777216/.test(e.message)]).toEqual(['E_MIG_DISK_READ_FAILED', 16 * MiB, true])
      await r.close()
    } finally {
      await s.close()
      // the backup job (libvirt removes its socket and scratch file) and the paused qemu
      virshOk('domjobabort', '--domain', uuid)
      virshOk('destroy', '--domain', uuid)
      sshd = await startSshd(path.join(t.dir, 'sshd2'))
    }
  }, 120_000)
})
