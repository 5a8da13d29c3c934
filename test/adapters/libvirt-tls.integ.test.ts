/**
 * The `libvirt_remote` adapter over `qemu+tls://` against a libvirtd of the test's own
 * (test/helpers/libvirtd-tls.ts: its own CA and certificates, in a private mount namespace so the
 * shared libvirtd is never touched): connect with the CA and a client certificate, list and
 * inspect a domain defined over TLS (`lvtls-src`, never started); a server certificate from a CA
 * the source does not trust is `E_MIG_AUTH_FAILED` (`tls`); a disk copy asks for `qemu+ssh://`
 * (the data plane is SSH only).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { createLibvirtAdapter, type LibvirtSession } from '../../lib/adapters/libvirt/adapter.ts'
import { thrown } from '../helpers/env.ts'
import { makeQcow2 } from '../helpers/libvirt-source.ts'
import { startTlsLibvirtd, type RunningTlsLibvirtd } from '../helpers/libvirtd-tls.ts'
import { tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024

describe('libvirt_remote over qemu+tls:// (a libvirtd of the test, its own CA)', () => {
  const t = tempDir('mig-lvtls-')
  let d: RunningTlsLibvirtd
  const connect = (caPem = d.caPem) =>
    createLibvirtAdapter().connect({
      endpoint: d.uri,
      username: 'migrator',
      password: d.clientKeyPem,
      tls: { ca_pem: caPem, client_cert_pem: d.clientCertPem },
    }) as Promise<LibvirtSession>

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    d = await startTlsLibvirtd(path.join(t.dir, 'libvirtd'))
  }, 60_000)

  afterAll(async () => {
    await d?.stop()
    t.cleanup()
  }, 30_000)

  test('connect with the CA and a client certificate, list and inspect; an untrusted server certificate: E_MIG_AUTH_FAILED (tls)', async () => {
    const q = makeQcow2(path.join(t.dir, 'src.qcow2'), 'MIGRATOR-LVTLS', 8 * MiB)
    const xml = path.join(t.dir, 'src.xml')
    writeFileSync(
      xml,
      `<domain type='qemu'><name>lvtls-src</name><memory unit='MiB'>64</memory><vcpu>2</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='${q}'/><target dev='vda' bus='virtio'/></disk>
    <interface type='user'><mac address='52:54:00:4c:54:01'/><model type='virtio'/></interface>
  </devices></domain>`,
    )
    d.virsh('define', '--file', xml)
    const uuid = d.virsh('domuuid', '--domain', 'lvtls-src')
    const s = await connect()
    try {
      expect((await s.describe()).product).toMatch(/^libvirt \d+\.\d+\.\d+ \(QEMU [\d.]+\) at qemu\+tls:\/\/127\.0\.0\.1:\d+\/system$/)
      const vms = await s.listVms()
      // the daemon's own domains only: the shared libvirtd's are not there
      expect(vms.map((v) => [v.vm_id, v.name, v.power_state, v.cpu_count, v.disks?.[0]?.format, v.nics?.[0]?.mac])).toEqual([
        [uuid, 'lvtls-src', 'off', 2, 'qcow2', '52:54:00:4c:54:01'],
      ])
      const m = await s.inspect(uuid)
      expect([m.source_format, m.disks[0]!.label, m.disks[0]!.capacity_bytes, m.cbt_available, m.nics[0]!.mac]).toEqual([
        'libvirt_remote',
        'vda',
        8 * MiB,
        true,
        '52:54:00:4c:54:01',
      ])
      // the data plane is SSH only: named, with the fix
      const copy = await thrown(() => s.t.forward('/var/lib/libvirt/qemu/x.sock', 'x'))
      expect([copy.code, /register the host with a qemu\+ssh:\/\/ endpoint/.test(copy.message)]).toEqual(['E_MIG_DISK_READ_FAILED', true])
    } finally {
      await s.close()
    }
    const untrusted = await thrown(() => connect(d.otherCaPem))
    expect([untrusted.code, untrusted.details?.reason]).toEqual(['E_MIG_AUTH_FAILED', 'tls'])
  }, 60_000)
})
