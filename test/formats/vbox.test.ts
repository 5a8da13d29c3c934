/**
 * VirtualBox `.vbox` reader and `vbox_folder` importer: the dissect.hypervisor corpus file
 * (GOAD-DC01.vbox, values read by hand), a generated VM folder with real images made by qemu-img
 * (VDI base, VHD, VMDK base + VMDK differencing child), and hostile settings files.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import type { MigError } from '../../lib/errors.ts'
import { VmManifest } from '../../lib/manifest.ts'
import { parseVbox, vboxMediumChain, vboxToManifest } from '../../lib/formats/vbox.ts'
import { parseXmlDocument } from '../../lib/formats/xml.ts'
import { importer } from '../../lib/importers/vbox-folder.ts'
import { importRootFor, qemuImg } from '../helpers/import-root.ts'
import { CORPUS, thrown } from '../helpers/tmp.ts'
import { caught, expectMig } from '../helpers/mig-error.ts'

const MiB = 1024 * 1024
const GOAD = path.join(CORPUS, 'dissect.hypervisor/GOAD-DC01.vbox')

const { root, ctx } = importRootFor('mig-vbox-')

const U = {
  vdi: '11111111-1111-4111-8111-111111111111',
  vhd: '22222222-2222-4222-8222-222222222222',
  vmdkBase: '33333333-3333-4333-8333-333333333333',
  vmdkChild: '44444444-4444-4444-8444-444444444444',
  iso: '55555555-5555-4555-8555-555555555555',
}

/** A settings file in the layout VirtualBox 7 writes (settings 1.19). */
function vboxXml(opts: { vmdkLocation?: string; extraHardDisk?: string; doctype?: string } = {}): string {
  return `<?xml version="1.0"?>
${opts.doctype ?? ''}<VirtualBox xmlns="http://www.virtualbox.org/" version="1.19-linux">
  <Machine uuid="{aaaaaaaa-0000-4000-8000-000000000001}" name="Gen &amp; Test" OSType="Ubuntu_64" snapshotFolder="Snapshots">
    <MediaRegistry>
      <HardDisks>
        <HardDisk uuid="{${U.vdi}}" location="base.vdi" format="VDI" type="Normal"/>
        <HardDisk uuid="{${U.vhd}}" location="legacy.vhd" format="VHD" type="Normal"/>
        <HardDisk uuid="{${U.vmdkBase}}" location="${opts.vmdkLocation ?? 'data.vmdk'}" format="VMDK" type="Normal">
          <HardDisk uuid="{${U.vmdkChild}}" location="Snapshots/{${U.vmdkChild}}.vmdk" format="VMDK"/>
        </HardDisk>${opts.extraHardDisk ?? ''}
      </HardDisks>
      <DVDImages>
        <Image uuid="{${U.iso}}" location="install.iso"/>
      </DVDImages>
    </MediaRegistry>
    <Snapshot uuid="{bbbbbbbb-0000-4000-8000-000000000001}" name="before">
      <Hardware>
        <CPU count="8"/>
        <Memory RAMSize="9999"/>
        <StorageControllers>
          <StorageController name="SCSI" type="LsiLogic" PortCount="16">
            <AttachedDevice type="HardDisk" port="0" device="0"><Image uuid="{${U.vmdkBase}}"/></AttachedDevice>
          </StorageController>
        </StorageControllers>
      </Hardware>
    </Snapshot>
    <Hardware>
      <CPU count="4"><PAE enabled="true"/><LongMode enabled="true"/></CPU>
      <Memory RAMSize="2048"/>
      <Firmware type="EFI"/>
      <Network>
        <Adapter slot="2" enabled="true" MACAddress="080027AABBCC" type="Am79C973">
          <InternalNetwork name="intnet"/>
        </Adapter>
        <Adapter slot="0" enabled="true" MACAddress="080027010203" type="virtio">
          <DisabledModes><NAT/></DisabledModes>
          <BridgedInterface name="eth0"/>
        </Adapter>
        <Adapter slot="1" enabled="false" MACAddress="080027FFFFFF" type="82540EM"/>
      </Network>
      <StorageControllers>
        <StorageController name="IDE" type="PIIX4" PortCount="2">
          <AttachedDevice passthrough="false" type="DVD" port="0" device="0"><Image uuid="{${U.iso}}"/></AttachedDevice>
          <AttachedDevice type="HardDisk" port="1" device="0"><Image uuid="{${U.vhd}}"/></AttachedDevice>
        </StorageController>
        <StorageController name="SATA" type="AHCI" PortCount="30">
          <AttachedDevice type="HardDisk" port="0" device="0"><Image uuid="{${U.vdi}}"/></AttachedDevice>
        </StorageController>
        <StorageController name="SCSI" type="LsiLogic" PortCount="16">
          <AttachedDevice type="HardDisk" port="0" device="0"><Image uuid="{${U.vmdkChild}}"/></AttachedDevice>
        </StorageController>
      </StorageControllers>
    </Hardware>
  </Machine>
</VirtualBox>
`
}

let vmDir: string

beforeAll(() => {
  vmDir = path.join(root, 'GenVM')
  mkdirSync(path.join(vmDir, 'Snapshots'), { recursive: true })
  qemuImg(vmDir, 'create', '-q', '-f', 'vdi', 'base.vdi', '64M')
  qemuImg(vmDir, 'create', '-q', '-f', 'vpc', '-o', 'subformat=dynamic,force_size=on', 'legacy.vhd', '16M')
  qemuImg(vmDir, 'create', '-q', '-f', 'vmdk', 'data.vmdk', '32M')
  // qemu cannot create a differencing VDI; a VMDK child with a backing file stands in for it.
  qemuImg(path.join(vmDir, 'Snapshots'), 'create', '-q', '-f', 'vmdk', '-b', '../data.vmdk', '-F', 'vmdk', `{${U.vmdkChild}}.vmdk`)
  writeFileSync(path.join(vmDir, 'GenVM.vbox'), vboxXml())
  writeFileSync(path.join(vmDir, 'install.iso'), Buffer.alloc(2048))
})

describe('parseVbox on the corpus (GOAD-DC01.vbox, VirtualBox 7.2, settings 1.19)', () => {
  const m = parseVbox(readFileSync(GOAD), 'GOAD-DC01.vbox')

  test('machine identity, CPU, memory, firmware', () => {
    expect(m.settingsVersion).toBe('1.19-linux')
    expect(m.name).toBe('GOAD-DC01')
    expect(m.uuid).toBe('a6277950-3d1b-45d3-b2fd-dc1f385027e1')
    expect(m.osType).toBe('Windows2016_64')
    expect(m.cpuCount).toBe(2)
    expect(m.memoryMiB).toBe(3000)
    expect(m.firmware).toBe('BIOS') // <Firmware/> without type
    expect(m.warnings).toEqual([])
  })

  test('two NICs with their MACs and attachments; DisabledModes ignored', () => {
    expect(m.adapters).toEqual([
      { slot: 0, enabled: true, mac: '08:00:27:7a:a2:fc', type: '82540EM', model: 'e1000', attachment: 'NAT', network: 'NAT' },
      { slot: 1, enabled: true, mac: '08:00:27:8c:c8:21', type: '82540EM', model: 'e1000', attachment: 'HostOnlyInterface', network: 'vboxnet0' },
    ])
  })

  test('media registry: the differencing tree with its hand-added branch', () => {
    expect(m.media.size).toBe(5)
    expect(m.media.get('0898f36f-01c3-4b43-8aeb-36ba7adaef95')).toEqual({
      uuid: '0898f36f-01c3-4b43-8aeb-36ba7adaef95',
      location: 'WindowsServer2019-disk001.vmdk',
      format: 'VMDK',
      type: 'Normal',
      parent: null,
    })
    expect(m.media.get('706a96fe-0e11-4985-af32-7561d26612d4')!.parent).toBe('35bf5129-1caa-4117-b20a-d73868d9d5d2')
    expect(m.media.get('35bf5129-1caa-4117-b20a-d73868d9d5d2')!.parent).toBe('0898f36f-01c3-4b43-8aeb-36ba7adaef95')
  })

  test('current state attaches the deepest child {e6800503}, chain down to the base (snapshots ignored)', () => {
    expect(m.controllers).toEqual([
      { name: 'IDE Controller', type: 'PIIX4', bus: 'ide', attachments: [{ port: 0, device: 0, imageUuid: 'e6800503-8273-4f16-b584-c7ba2c1df698' }] },
    ])
    expect(vboxMediumChain(m, 'e6800503-8273-4f16-b584-c7ba2c1df698').map((x) => x.location)).toEqual([
      'Snapshots/{e6800503-8273-4f16-b584-c7ba2c1df698}.vmdk',
      'Snapshots/{3c72ec80-dc73-4448-a63e-97970cdd87e5}.vmdk',
      'WindowsServer2019-disk001.vmdk',
    ])
    expect(vboxMediumChain(m, '706a96fe-0e11-4985-af32-7561d26612d4').map((x) => x.uuid)).toEqual([
      '706a96fe-0e11-4985-af32-7561d26612d4',
      '35bf5129-1caa-4117-b20a-d73868d9d5d2',
      '0898f36f-01c3-4b43-8aeb-36ba7adaef95',
    ])
  })

  test('manifest of the corpus file alone: the attached image is missing -> E_MIG_MALFORMED_ARCHIVE naming file and uuid', async () => {
    const err = await thrown(() => vboxToManifest(m, { vboxPath: GOAD, importRoot: path.dirname(GOAD) }))
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('Snapshots/{e6800503-8273-4f16-b584-c7ba2c1df698}.vmdk')
    expect(err.message).toContain('{e6800503-8273-4f16-b584-c7ba2c1df698}')
    expect(err.details).toEqual({ uuid: 'e6800503-8273-4f16-b584-c7ba2c1df698', file: 'Snapshots/{e6800503-8273-4f16-b584-c7ba2c1df698}.vmdk' })
  })
})

describe('vbox_folder importer on a generated VM folder', () => {
  test('folder: disks in controller then port order, chain, capacities, NICs, firmware; snapshot hardware ignored', async () => {
    const man = VmManifest.parse(await importer.inspect(vmDir, ctx()))
    expect(man.name).toBe('Gen & Test')
    expect(man.source_format).toBe('vbox_folder')
    expect(man.guest_os).toEqual({ family: 'linux', id: 'Ubuntu_64' })
    expect(man.cpu).toEqual({ count: 4, cores_per_socket: 1 })
    expect(man.memory_bytes).toBe(2048 * MiB)
    expect(man.firmware).toBe('efi')
    expect(man.secure_boot).toBe(false)
    expect(man.cbt_available).toBe(false)
    expect(man.disks.map((d) => [d.label, d.disk_format, d.controller, d.address, d.capacity_bytes])).toEqual([
      ['legacy', 'vpc', 'ide', '0:1:0', 16 * MiB],
      ['base', 'vdi', 'sata', '1:0:0', 64 * MiB],
      ['data', 'vmdk', 'scsi', '2:0:0', 32 * MiB],
    ])
    const child = man.disks[2]!
    expect(child.source.path).toBe(path.join(vmDir, 'Snapshots', `{${U.vmdkChild}}.vmdk`))
    expect(child.backing_chain).toEqual([path.join(vmDir, 'data.vmdk')])
    expect(man.disks[1]!.backing_chain).toBeUndefined()
    for (const d of man.disks) expect(d.allocated_bytes).toBeGreaterThan(0)
    expect(man.nics).toEqual([
      { label: 'nic0', mac: '08:00:27:01:02:03', model: 'virtio', network: 'eth0' },
      { label: 'nic2', mac: '08:00:27:aa:bb:cc', model: 'pcnet', network: 'intnet' },
    ])
    expect(man.warnings.some((w) => w.includes('differencing image over 1 parent'))).toBe(true)
  })

  test('the .vbox file itself as input gives the same manifest', async () => {
    const a = await importer.inspect(vmDir, ctx())
    const b = await importer.inspect(path.join(vmDir, 'GenVM.vbox'), ctx())
    expect(b).toEqual(a)
  })
})

describe('hostile and broken settings', () => {
  async function inspectWith(name: string, xml: string): Promise<unknown> {
    const dir = path.join(root, name)
    mkdirSync(dir, { recursive: true })
    writeFileSync(path.join(dir, 'vm.vbox'), xml)
    for (const f of ['base.vdi', 'legacy.vhd', 'data.vmdk']) writeFileSync(path.join(dir, f), readFileSync(path.join(vmDir, f)))
    mkdirSync(path.join(dir, 'Snapshots'), { recursive: true })
    writeFileSync(path.join(dir, 'Snapshots', `{${U.vmdkChild}}.vmdk`), readFileSync(path.join(vmDir, 'Snapshots', `{${U.vmdkChild}}.vmdk`)))
    return thrown(() => importer.inspect(dir, ctx()))
  }

  test('DOCTYPE with entities is refused before parsing', async () => {
    const err = await inspectWith(
      'doctype',
      vboxXml({ doctype: '<!DOCTYPE VirtualBox [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>\n' }).replace('name="Gen &amp; Test"', 'name="&b;"'),
    )
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect((err as Error).message).toContain('DOCTYPE')
  })

  test('a location "../../etc/passwd" -> E_MIG_HOST_PATH_REJECTED', async () => {
    const err = await inspectWith('escape', vboxXml({ vmdkLocation: '../../etc/passwd' }))
    expectMig(err, 'E_MIG_HOST_PATH_REJECTED')
  })

  test('an absolute location outside the root -> E_MIG_HOST_PATH_REJECTED', async () => {
    expectMig(await inspectWith('absolute', vboxXml({ vmdkLocation: '/etc/passwd' })), 'E_MIG_HOST_PATH_REJECTED')
  })

  test('a missing parent image -> E_MIG_MALFORMED_ARCHIVE naming the file and the uuid', async () => {
    const err = (await inspectWith('missing', vboxXml({ vmdkLocation: 'gone.vmdk' }))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('"gone.vmdk"')
    expect(err.message).toContain(`{${U.vmdkBase}}`)
  })

  test('an attached image absent from the media registry -> E_MIG_MALFORMED_ARCHIVE naming the uuid', async () => {
    const err = (await inspectWith(
      'unregistered',
      vboxXml().replace(`<Image uuid="{${U.vdi}}"/>`, '<Image uuid="{99999999-9999-4999-8999-999999999999}"/>'),
    )) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('{99999999-9999-4999-8999-999999999999}')
  })

  test('an image whose bytes do not match its declared format -> E_MIG_MALFORMED_ARCHIVE', async () => {
    const err = await inspectWith('wrongfmt', vboxXml().replace('location="base.vdi" format="VDI"', 'location="legacy.vhd" format="VDI"'))
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
  })

  test('a format qemu cannot read here -> E_MIG_UNSUPPORTED_FORMAT', async () => {
    expectMig(
      await inspectWith('parallels', vboxXml().replace('location="base.vdi" format="VDI"', 'location="base.vdi" format="Parallels"')),
      'E_MIG_UNSUPPORTED_FORMAT',
    )
  })

  test('not well-formed, non-numeric RAMSize, bad uuid -> E_MIG_MALFORMED_ARCHIVE', () => {
    for (const xml of [
      vboxXml().replace('</Machine>', ''),
      vboxXml().replace('RAMSize="2048"', 'RAMSize="2e3"'),
      vboxXml().replace('RAMSize="2048"', 'RAMSize="99999999999"'),
      vboxXml().replace(`<Image uuid="{${U.vdi}}"/>`, '<Image uuid="not-a-uuid"/>'),
      vboxXml().replace('name="Gen &amp; Test"', 'name="&undefined;"'),
    ]) {
      expectMig(
        caught(() => parseVbox(xml, 'x.vbox')),
        'E_MIG_MALFORMED_ARCHIVE',
      )
    }
  })

  test('a root that is not <VirtualBox> -> E_MIG_UNSUPPORTED_FORMAT; encrypted settings too', () => {
    expectMig(
      caught(() => parseVbox('<Envelope/>', 'x.vbox')),
      'E_MIG_UNSUPPORTED_FORMAT',
    )
    const encrypted =
      '<VirtualBox version="1.19"><Machine uuid="{aaaaaaaa-0000-4000-8000-000000000001}" name="e" keyId="k" keyStore="AAAA">blob</Machine></VirtualBox>'
    expectMig(
      caught(() => parseVbox(encrypted, 'x.vbox')),
      'E_MIG_UNSUPPORTED_FORMAT',
    )
  })

  test('over 4 MiB -> E_MIG_MALFORMED_ARCHIVE', () => {
    expectMig(
      caught(() => parseVbox(Buffer.alloc(4 * MiB + 1, 0x20), 'big.vbox')),
      'E_MIG_MALFORMED_ARCHIVE',
    )
  })

  test('__proto__ / constructor names are dropped, nothing is polluted', () => {
    const n = parseXmlDocument('<a __proto__="x" constructor="y" ok="1"><__proto__ polluted="1"/><b/></a>', 't.xml')
    expect([...n.attrs.keys()]).toEqual(['ok'])
    expect(n.children.map((c) => c.name)).toEqual(['b'])
    expect(({} as Record<string, unknown>)['polluted']).toBeUndefined()
  })

  test('two .vbox files in a folder -> E_MIG_MALFORMED_ARCHIVE listing both; a non-.vbox file -> E_MIG_UNSUPPORTED_FORMAT', async () => {
    const dir = path.join(root, 'two')
    mkdirSync(dir, { recursive: true })
    writeFileSync(path.join(dir, 'a.vbox'), vboxXml())
    writeFileSync(path.join(dir, 'b.vbox'), vboxXml())
    writeFileSync(path.join(dir, 'a.vbox-prev'), vboxXml())
    const err = (await thrown(() => importer.inspect(dir, ctx()))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('a.vbox, b.vbox')
    expectMig(await thrown(() => importer.inspect(path.join(dir, 'a.vbox-prev'), ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
  })
})
