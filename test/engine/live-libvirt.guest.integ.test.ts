/**
 * Real Debian 12 guests (fixtures/guest-image.ts, converted to qcow2) migrated from this
 * machine's libvirtd reached as a remote host over a real sshd
 * (`qemu+ssh://root@127.0.0.1:<port>/system`):
 * - cold, not started (`generic`): the destination compared byte for byte with `qemu-img
 *   convert` of the source;
 * - warm, UEFI (`uefi-distro`: GRUB only at \EFI\debian\grubx64.efi, no removable-path loader,
 *   so only the boot entry in its NVRAM boots it; the source's variable store made with
 *   test/helpers/ovmf-vars.ts): the source boots and runs during the full pass, writing its boot
 *   record (`/var/lib/migrator-test/boots`) while the delta passes run, the cutover shuts it down, the
 *   carried NVRAM boots the destination (the boot check: the guest's marker on its serial
 *   console, TCG) with nothing written to its ESP, and the source's record line is read on the
 *   destination volume. The cold start path is covered by test/engine/live-libvirt.integ.test.ts.
 * Source domains `lvg-src`, `lvg-uefi`; destinations `lvg-dst-*`.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { chmodSync, existsSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { GUEST_MARKER, GUEST_TEST_BOOT_TIMEOUT_S, guestCacheDir, guestImages, readGuestRecord } from '../../fixtures/guest-image.ts'
import { call, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { defineSource, removeTestDomains, virsh } from '../helpers/libvirt-source.ts'
import { bootVariables, writeVarsWithBootEntry } from '../helpers/ovmf-vars.ts'
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
  let uefiUuid = ''
  let uefiQcow2 = ''
  const uefiVars = () => path.join(t.dir, 'lvg-uefi_VARS.fd')
  const uefiSerial = () => path.join(t.dir, 'lvg-uefi.serial.log')

  beforeAll(async () => {
    const image = (v: 'generic' | 'uefi-distro') => {
      const cached = path.join(guestCacheDir(), `${v}.raw`)
      return existsSync(cached) ? cached : guestImages()[v].path
    }
    chmodSync(t.dir, 0o755)
    qcow2 = path.join(t.dir, 'debian.qcow2')
    execFileSync('qemu-img', ['convert', '-O', 'qcow2', image('generic'), qcow2])
    chmodSync(qcow2, 0o644)
    uefiQcow2 = path.join(t.dir, 'debian-uefi.qcow2')
    execFileSync('qemu-img', ['convert', '-O', 'qcow2', image('uefi-distro'), uefiQcow2])
    chmodSync(uefiQcow2, 0o644)
    // the guest's only way to boot: Boot0001 -> \EFI\debian\grubx64.efi in its variable store
    writeVarsWithBootEntry('/usr/share/OVMF/OVMF_VARS_4M.fd', uefiVars(), '\\EFI\\debian\\grubx64.efi')
    await ensureLibvirt()
    removeTestDomains(PREFIX)
    // the destination gets the source's memory: enough for the Debian kernel and initramfs
    uuid = defineSource(`${PREFIX}src`, [{ file: qcow2, format: 'qcow2' }], '52:54:00:4c:47:01', 768)
    uefiUuid = defineSource(`${PREFIX}uefi`, [{ file: uefiQcow2, format: 'qcow2' }], '52:54:00:4c:47:02', 768, { nvram: uefiVars(), serial: uefiSerial() })
    sshd = await startSshd(path.join(t.dir, 'sshd'))
    srv = await startServer('bun', t.dir, {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: String(GUEST_TEST_BOOT_TIMEOUT_S),
      // the cutover's guest shutdown: this minimal guest ignores the ACPI power button, so the
      // adapter destroys it after this wait (its boot record is synced when written)
      MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: '15',
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

  const plan = (name: string, start: boolean, vmId = uuid, extra: Record<string, unknown> = { mode: 'Cold' }) => ({
    source: { Live: 'libvirt_remote' },
    source_ref: { kind: 'live_vm', source_id: sourceId, vm_id: vmId },
    name,
    start,
    ...extra,
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
    'warm, UEFI: the running guest writes between passes, cutover on command, the carried NVRAM boots it (no loader written), its record arrived, no checkpoint left',
    async () => {
      virsh('start', '--domain', uefiUuid)
      const job = await submit(srv.base, plan(`${PREFIX}dst-uefi`, true, uefiUuid, { mode: 'Warm', cutover: { mode: 'manual' }, precopy_interval_seconds: 15 }))
      // the full pass runs while the source boots; the passes go on until its boot is recorded
      const ended = (j: any) => ['completed', 'failed', 'cancelled'].includes(j.status)
      const serial = () => (existsSync(uefiSerial()) ? readFileSync(uefiSerial(), 'latin1') : '')
      await waitJob(srv.base, job.id, (j) => ended(j) || (j.state === 'DeltaSyncing' && /login:/.test(serial())), 20 * 60_000)
      expect(serial()).toContain(GUEST_MARKER)
      // a delta pass carried what the booting guest wrote after the full pass
      const running = await waitJob(srv.base, job.id, (j) => ended(j) || j.cutover?.passes.some((p: any) => p.pass >= 1 && p.changed_bytes > 0), 5 * 60_000)
      expect(running.cutover.passes.some((p: any) => p.pass >= 1 && p.changed_bytes > 0)).toBe(true)
      const cutoverAt = new Date().toISOString()
      expect((await call(srv.base, 'POST', `/migrations/${job.id}/cutover`)).status).toBe(202)
      const done = await waitJob(srv.base, job.id, undefined, 30 * 60_000)
      expect([done.status, done.effective_mode, done.last_error]).toEqual(['completed', 'Warm', null])
      expect(done.hardware.boot.verified).toBe(true)
      expect(readFileSync(path.join(t.dir, 'logs', `${job.id}.serial.log`), 'latin1')).toContain(GUEST_MARKER)
      const s = (a: string, b: string) => Math.round((Date.parse(b) - Date.parse(a)) / 1000)
      console.log(
        `warm UEFI: passes ${done.cutover.passes_total}, cutover to source off ${s(done.cutover.started_at, done.source_vm.shut_down_at)} s, ` +
          `cutover to completed ${s(done.cutover.started_at, done.finished_at)} s, boot check ${done.hardware.boot.waited_seconds} s`,
      )
      // the source's variable store, as the source left it, is the destination's NVRAM
      const sourceVars = readFileSync(uefiVars())
      expect(done.hardware.nvram).toMatchObject({
        carried: true,
        source_path: uefiVars(),
        bytes: sourceVars.length,
        sha256: createHash('sha256').update(sourceVars).digest('hex'),
      })
      expect(done.hardware.uefi_boot.method).toBe('nvram-carried')
      expect(virsh('dumpxml', '--domain', `${PREFIX}dst-uefi`)).toContain(done.hardware.nvram.path)
      expect(bootVariables(done.hardware.nvram.path)).toContain('Boot0001')
      virsh('destroy', '--domain', `${PREFIX}dst-uefi`)
      const vol = volumePath(t.dir, job.id, 'vda')
      // nothing made the guest bootable on the ESP (p2 at sector 4096): no removable-path loader
      const esp = execFileSync('mdir', ['-i', `${vol}@@${4096 * 512}`, '-/', '-b', '::/EFI'], {
        encoding: 'utf8',
        env: { ...process.env, MTOOLS_SKIP_CHECK: '1' },
      })
      expect([/grubx64\.efi/i.test(esp), /BOOTX64\.EFI/i.test(esp)]).toEqual([true, false])
      // the guest's own record on the destination volume: the source's boot line came over
      const lines = readGuestRecord([vol])
        .split('\n')
        .filter((l) => /multi-user\.target=/.test(l))
      expect(lines.length).toBeGreaterThanOrEqual(1)
      expect([lines[0]!.split(' ')[0]! < cutoverAt, /multi-user\.target=active/.test(lines[0]!)]).toEqual([true, true])
      // the source: shut down by the cutover, no checkpoint, no bitmap left
      expect(virsh('domstate', '--domain', uefiUuid)).toBe('shut off')
      expect(virsh('checkpoint-list', '--domain', uefiUuid, '--name')).toBe('')
      expect(execFileSync('qemu-img', ['info', '-U', '--output=json', uefiQcow2], { encoding: 'utf8' })).not.toContain('migrator-')
    },
    45 * 60_000,
  )
})
