// The libvirt_remote adapter's pure parts: endpoint rules, known_hosts/private key checks, the
// domain XML and `domblkinfo --all` readers, the manifest (no libvirt here: see
// libvirt-source.integ.test.ts for the real one).
import { describe, expect, test } from 'bun:test'
import { manifestOf } from '../../lib/adapters/libvirt/adapter.ts'
import { parseDomainXml, parseDomblkinfoAll, powerStateOf } from '../../lib/adapters/libvirt/domain.ts'
import { classifyFailure, sweepStaleConnections } from '../../lib/adapters/libvirt/transport.ts'
import { knownHostsProblem, parseLibvirtEndpoint, privateKeyProblem } from '../../lib/adapters/libvirt/uri.ts'
import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, symlinkSync } from 'node:fs'
import * as path from 'node:path'
import { tempDir, thrown } from '../helpers/env.ts'

const XML = `<domain type='kvm'>
  <name>web01</name>
  <uuid>8A0C7E2E-1C52-4C0B-9E7E-000000000001</uuid>
  <metadata><libosinfo:libosinfo xmlns:libosinfo="http://libosinfo.org/xmlns/libvirt/domain/1.0"><libosinfo:os id="http://debian.org/debian/12"/></libosinfo:libosinfo></metadata>
  <memory unit='KiB'>2097152</memory>
  <currentMemory unit='KiB'>1048576</currentMemory>
  <vcpu placement='static'>4</vcpu>
  <os firmware='efi'>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
    <firmware><feature enabled='yes' name='secure-boot'/></firmware>
    <loader readonly='yes' secure='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.ms.fd</loader>
    <nvram>/var/lib/libvirt/qemu/nvram/web01_VARS.fd</nvram>
  </os>
  <cpu mode='host-passthrough'><topology sockets='1' dies='1' cores='2' threads='2'/></cpu>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/var/lib/libvirt/images/web01.qcow2'/>
      <backingStore type='file'><format type='qcow2'/><source file='/var/lib/libvirt/images/base.qcow2'/></backingStore>
      <target dev='vda' bus='virtio'/></disk>
    <disk type='block' device='disk'><driver name='qemu' type='raw'/><source dev='/dev/vg0/web01-data'/><target dev='sda' bus='scsi'/></disk>
    <disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file='/iso/debian.iso'/><target dev='sdb' bus='sata'/><readonly/></disk>
    <disk type='network' device='disk'><driver name='qemu' type='raw'/><source protocol='rbd' name='pool/img'/><target dev='vdb' bus='virtio'/></disk>
    <interface type='network'><mac address='52:54:00:AB:CD:01'/><source network='default'/><model type='virtio'/></interface>
    <interface type='bridge'><mac address='52:54:00:ab:cd:02'/><source bridge='br0'/><model type='e1000e'/></interface>
  </devices>
</domain>`

describe('libvirt_remote: endpoints and credentials', () => {
  test('qemu+ssh and qemu+tls URIs with their default ports; everything else E_MIG_BAD_REQUEST', async () => {
    expect(parseLibvirtEndpoint('qemu+ssh://root@kvm1/system')).toMatchObject({
      transport: 'ssh',
      user: 'root',
      host: 'kvm1',
      port: 22,
      url: 'qemu+ssh://root@kvm1:22/system',
    })
    expect(parseLibvirtEndpoint('qemu+tls://[fd00::1]:16515/system/')).toMatchObject({
      transport: 'tls',
      host: 'fd00::1',
      port: 16515,
      url: 'qemu+tls://[fd00::1]:16515/system',
    })
    for (const bad of [
      'qemu+tcp://kvm1/system',
      'qemu+libssh2://root@kvm1/system',
      'qemu:///system',
      'qemu+ssh://kvm1/',
      'qemu+ssh://kvm1/system?keyfile=/etc/shadow',
      'qemu+ssh://root;rm@kvm1/system',
      'qemu+ssh://-oProxyCommand=x@kvm1/system',
      'qemu+tls://user@kvm1/system',
      'qemu+ssh://kvm1:0/system',
      'https://kvm1/system',
    ]) {
      const e = await thrown(async () => parseLibvirtEndpoint(bad))
      expect([bad, e.code]).toEqual([bad, 'E_MIG_BAD_REQUEST'])
    }
  })

  test('known_hosts lines as ssh-keyscan prints them; private keys without a passphrase', () => {
    expect(knownHostsProblem('[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH3k\n# comment\nkvm1 ecdsa-sha2-nistp256 AAAAE2VjZHNh=\n')).toBeNull()
    expect(knownHostsProblem('')).toMatch(/no host key line/)
    expect(knownHostsProblem('kvm1 ssh-ed25519')).toMatch(/line 1/)
    expect(privateKeyProblem('-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n')).toBeNull()
    expect(privateKeyProblem('ssh-ed25519 AAAA user@host')).toMatch(/OpenSSH or PEM private key/)
    expect(privateKeyProblem('-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nabc\n-----END RSA PRIVATE KEY-----')).toMatch(/passphrase/)
  })

  test('failures of ssh and virsh map to the spec codes', () => {
    const f = (stderr: string, timedOut = false) => classifyFailure('libvirt_remote x', { code: 1, stdout: '', stderr, timedOut }, 'E_MIG_INTERNAL', 'listing')
    expect(f('error: Cannot recv data: Host key verification failed.: Connection reset by peer').details?.reason).toBe('host_key_mismatch')
    expect(f('error: Cannot recv data: root@h: Permission denied (publickey).').code).toBe('E_MIG_AUTH_FAILED')
    expect(f('error: Cannot recv data: ssh: connect to host h port 22: Connection refused').code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(f('', true).code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(f('error: operation failed: something else').code).toBe('E_MIG_INTERNAL')
  })
})

describe('libvirt_remote: domain XML into the listing and the manifest', () => {
  test('identity, firmware, NVRAM, disks (file and block; CD-ROM and network disks skipped), NICs', () => {
    const d = parseDomainXml(XML, 'web01')
    expect(d).toMatchObject({
      name: 'web01',
      uuid: '8a0c7e2e-1c52-4c0b-9e7e-000000000001',
      vcpus: 4,
      memoryBytes: 1024 * 1024 * 1024,
      firmware: 'efi',
      secureBoot: true,
    })
    expect(d.nvram).toBe('/var/lib/libvirt/qemu/nvram/web01_VARS.fd')
    expect(d.disks.map((x) => [x.target, x.bus, x.format, x.type, x.source, x.hasBacking])).toEqual([
      ['vda', 'virtio', 'qcow2', 'file', '/var/lib/libvirt/images/web01.qcow2', true],
      ['sda', 'scsi', 'raw', 'block', '/dev/vg0/web01-data', false],
    ])
    expect(d.xmlDiskTargets).toEqual(['vda', 'sda', 'vdb'])
    expect(d.skipped).toHaveLength(2)
    expect(d.nics).toEqual([
      { mac: '52:54:00:ab:cd:01', model: 'virtio', type: 'network', network: 'default' },
      { mac: '52:54:00:ab:cd:02', model: 'e1000e', type: 'bridge', network: 'br0' },
    ])
    const blk = parseDomblkinfoAll(
      ' vda      21474836480   1073741824   1074003968\n sda      10737418240   10737418240  10737418240\n sdb      -             -            -\n',
    )
    expect(blk.get('vda')).toEqual({ capacity: 21474836480, allocation: 1073741824 })
    expect(blk.get('sdb')).toEqual({ capacity: null, allocation: null })
    const m = manifestOf(d, XML, blk)
    expect(m).toMatchObject({
      name: 'web01',
      source_format: 'libvirt_remote',
      firmware: 'efi',
      secure_boot: true,
      cbt_available: false,
      cpu: { count: 4, cores_per_socket: 2 },
    })
    expect(m.guest_os).toEqual({ family: 'linux', id: 'http://debian.org/debian/12' })
    expect(m.disks.map((x) => [x.label, x.disk_format, x.capacity_bytes, x.allocated_bytes, x.controller])).toEqual([
      ['vda', 'qcow2', 21474836480, 1073741824, 'virtio'],
      ['sda', 'raw', 10737418240, 10737418240, 'scsi'],
    ])
    // what does not travel or changes is said
    expect(m.warnings.join('\n')).toMatch(/sda is raw: libvirt checkpoints need qcow2/)
    expect(m.warnings.join('\n')).toMatch(/backing chain is read flattened/)
    // the variable store travels (readNvram at the copy): no warning about it
    expect(m.warnings.join('\n')).not.toMatch(/VARS|variable store/)
  })

  test('not a domain, not XML: E_MIG_SOURCE_UNREACHABLE; states', async () => {
    expect((await thrown(async () => parseDomainXml('<network/>', 'x'))).code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect((await thrown(async () => parseDomainXml('<domain', 'x'))).code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(['running', 'shut off', 'paused', 'pmsuspended', 'crashed', 'dying'].map(powerStateOf)).toEqual([
      'on',
      'off',
      'suspended',
      'suspended',
      'off',
      'unknown',
    ])
  })
})

describe('libvirt_remote: what a killed worker left', () => {
  test("a dead process's private directory (its key) and its orphaned ssh forward are removed; a live one's kept", async () => {
    const t = tempDir('mig-lvsweep-')
    try {
      const deadPid = spawnSync('true').pid!
      const stale = path.join(t.dir, `migrator-libvirt-${deadPid}-abc123`)
      const live = path.join(t.dir, `migrator-libvirt-${process.pid}-def456`)
      for (const d of [stale, live]) mkdirSync(d)
      // an "ssh" whose command line names the stale directory, as a forward's does
      symlinkSync('/bin/sleep', path.join(stale, 'ssh'))
      const orphan = spawn(path.join(stale, 'ssh'), ['60'], { stdio: 'ignore' })
      const exited = new Promise((r) => orphan.once('exit', r))
      await Bun.sleep(100)
      sweepStaleConnections(t.dir)
      await exited
      expect([existsSync(stale), existsSync(live), orphan.signalCode]).toEqual([false, true, 'SIGTERM'])
    } finally {
      t.cleanup()
    }
  })
})
