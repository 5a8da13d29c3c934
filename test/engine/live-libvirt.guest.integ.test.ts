/**
 * A real Debian 12 guest (fixtures/guest-image.ts, `generic` variant, converted to qcow2) migrated
 * cold from this machine's libvirtd reached as a remote host over a real sshd
 * (`qemu+ssh://root@127.0.0.1:<port>/system`): once without starting, the destination compared
 * byte for byte with `qemu-img convert` of the source; once started, the boot check (the guest's
 * marker on its serial console, TCG) verifying it booted. Source `lvg-src`, destinations `lvg-dst-*`.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync, spawnSync } from 'node:child_process'
import { chmodSync, existsSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { GUEST_MARKER, GUEST_TEST_BOOT_TIMEOUT_S, guestCacheDir, guestImages } from '../../fixtures/guest-image.ts'
import { call, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { defineSource, removeTestDomains, virsh } from '../helpers/libvirt-source.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { startSshd, type RunningSshd } from '../helpers/sshd.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'lvg-'

describe('a real Debian guest from a remote libvirt host (TCG)', () => {
  const t = tempDir('mig-lvg-')
  let sshd: RunningSshd
  let srv: RunningServer
  let sourceId = ''
  let uuid = ''
  let qcow2 = ''

  beforeAll(async () => {
    const cached = path.join(guestCacheDir(), 'generic.raw')
    const generic = existsSync(cached) ? cached : guestImages().generic.path
    chmodSync(t.dir, 0o755)
    qcow2 = path.join(t.dir, 'debian.qcow2')
    execFileSync('qemu-img', ['convert', '-O', 'qcow2', generic, qcow2])
    chmodSync(qcow2, 0o644)
    await ensureLibvirt()
    removeTestDomains(PREFIX)
    // the destination gets the source's memory: enough for the Debian kernel and initramfs
    uuid = defineSource(`${PREFIX}src`, [{ file: qcow2, format: 'qcow2' }], '52:54:00:4c:47:01', 768)
    sshd = await startSshd(path.join(t.dir, 'sshd'))
    srv = await startServer('bun', t.dir, {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: String(GUEST_TEST_BOOT_TIMEOUT_S),
    })
    const s = await call(srv.base, 'POST', '/sources', {
      name: 'kvm-local',
      kind: 'libvirt_remote',
      endpoint: `qemu+ssh://root@127.0.0.1:${sshd.port}/system`,
      username: 'root',
      private_key: sshd.privateKey,
      known_hosts: sshd.knownHosts,
    })
    expect(s.status).toBe(201)
    sourceId = s.body.id
  }, 40 * 60_000)

  afterAll(async () => {
    await srv?.stop()
    removeTestDomains(PREFIX)
    await cleanupDomains(PREFIX)
    await sshd?.stop()
    t.cleanup()
  }, 120_000)

  const plan = (name: string, start: boolean) => ({
    source: { Live: 'libvirt_remote' },
    source_ref: { kind: 'live_vm', source_id: sourceId, vm_id: uuid },
    mode: 'Cold',
    name,
    start,
  })

  test(
    'cold, not started: the destination is the source disk byte for byte, zeros skipped',
    async () => {
      const job = await submit(srv.base, plan(`${PREFIX}dst-copy`, false))
      const done = await waitJob(srv.base, job.id, undefined, 20 * 60_000)
      expect([done.status, done.last_error]).toEqual(['completed', null])
      expect(done.progress.bytes_zero).toBeGreaterThan(512 * 1024 * 1024)
      const ref = path.join(t.dir, 'source.raw')
      execFileSync('qemu-img', ['convert', '-U', '-O', 'raw', qcow2, ref])
      const cmp = spawnSync('cmp', [ref, volumePath(t.dir, job.id, 'vda')], { encoding: 'utf8' })
      expect([cmp.status, cmp.stdout.trim()]).toEqual([0, ''])
      expect(virsh('domstate', '--domain', uuid)).toBe('shut off')
      expect(virsh('checkpoint-list', '--domain', uuid, '--name')).toBe('')
    },
    20 * 60_000,
  )

  test(
    'cold, started: the migrated Debian guest boots (its marker on the serial console)',
    async () => {
      const job = await submit(srv.base, plan(`${PREFIX}dst-boot`, true))
      const done = await waitJob(srv.base, job.id, undefined, 30 * 60_000)
      expect([done.status, done.last_error]).toEqual(['completed', null])
      expect(done.hardware.boot.verified).toBe(true)
      expect(readFileSync(path.join(t.dir, 'logs', `${job.id}.serial.log`), 'latin1')).toContain(GUEST_MARKER)
      expect(virsh('dumpxml', '--domain', `${PREFIX}dst-boot`)).toContain('52:54:00:4c:47:01')
      virsh('destroy', '--domain', `${PREFIX}dst-boot`)
    },
    30 * 60_000,
  )
})
