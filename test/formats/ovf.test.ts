/**
 * OVF envelope parsing (lib/formats/ovf.ts) and the `.mf` manifest (lib/formats/ovf-manifest.ts):
 * table-driven over the corpus descriptors, with values read by hand from the files, plus
 * hostile and edge-case descriptors written here.
 */
import { describe, test, expect } from 'bun:test'
import { readFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { VmManifest } from '../../lib/manifest.ts'
import { allocationUnitsMultiplier, checkHref, diskFormatFromUri, parseOvfEnvelope, pickHardwareSection, type OvfEnvelope } from '../../lib/formats/ovf.ts'
import { controllerBus, ovfDiskRefs, ovfToManifest, type ResolvedOvfFile } from '../../lib/formats/ovf-to-vm-manifest.ts'
import { cimOsType } from '../../lib/formats/cim-os.ts'
import { parseOvfManifest, verifyOvfManifest } from '../../lib/formats/ovf-manifest.ts'
import { sniffDiskFormat } from '../../lib/formats/sniff.ts'
import { CORPUS } from '../helpers/tmp.ts'
import { expectMigThrown } from '../helpers/mig-error.ts'

const GiB = 2 ** 30
const MiB = 2 ** 20

/** Manifest of a parsed envelope with every used file resolved to a dummy vmdk path. */
function manifestOf(env: OvfEnvelope) {
  const section = pickHardwareSection(env)
  const { refs } = ovfDiskRefs(env, section)
  const sources = new Map<string, ResolvedOvfFile>(refs.map((r) => [r.file.id, { source: { path: `/imports/${r.file.href}` }, disk_format: 'vmdk' }]))
  const m = ovfToManifest(env, { sourceFormat: 'ovf_folder', sources })
  expect(VmManifest.safeParse(m).success).toBe(true)
  return m
}

describe('corpus descriptors', () => {
  const cases = [
    {
      file: 'virt-v2v/test-i-ova.ovf',
      files: [{ id: 'file1', href: 'test-ova.vmdk', size: 349405696, compression: null, chunkSize: null }],
      systemTypes: ['vmx-08'],
      cimId: 74,
      manifest: {
        name: 'TestOva',
        guest_os: { family: 'windows', id: 'windows7_64Guest' },
        firmware: 'bios',
        secure_boot: false,
        cpu: { count: 1, cores_per_socket: 1 },
        memory_bytes: 2 * GiB,
        disks: [{ label: 'Hard Disk 1', capacity_bytes: 32 * GiB, allocated_bytes: 1008926720, controller: 'scsi', address: '0:0' }],
        nics: [{ label: 'Ethernet 1', mac: null, model: 'e1000', network: 'VM Network' }],
      },
    },
    {
      file: 'virt-v2v/test-i-ova-formats.ovf',
      files: [{ id: 'file1', href: 'disk1.vmdk', size: 7804077568, compression: null, chunkSize: null }],
      systemTypes: ['vmx-10'],
      cimId: 103,
      manifest: {
        name: '2K8R2EESP1_2_Medium',
        guest_os: { family: 'windows', id: 'windows7Server64Guest' },
        firmware: 'efi',
        secure_boot: false,
        cpu: { count: 1, cores_per_socket: 1 },
        memory_bytes: 1 * GiB,
        disks: [{ label: 'Hard disk 1', capacity_bytes: 50 * GiB, allocated_bytes: 18975752192, controller: 'scsi', address: '0:0' }],
        nics: [{ label: 'Network adapter 1', mac: null, model: 'e1000', network: 'PG-VLAN60' }],
      },
    },
    {
      file: 'govmomi/configspec.ovf',
      files: [{ id: 'file1', href: 'haproxy.ova.vmdk', size: 625911296, compression: null, chunkSize: null }],
      systemTypes: ['vmx-13'],
      cimId: 101,
      manifest: {
        name: 'haproxy',
        guest_os: { family: 'linux', id: 'other3xLinux64Guest' },
        firmware: 'bios',
        secure_boot: false,
        cpu: { count: 2, cores_per_socket: 2 },
        memory_bytes: 4 * GiB,
        disks: [{ label: 'Hard Disk 1', capacity_bytes: 20 * GiB, allocated_bytes: 1287454720, controller: 'scsi', address: '0:0' }],
        // the Frontend NIC belongs to the non-default "frontend" deployment option
        nics: [
          { label: 'Management Network', mac: null, model: 'vmxnet3', network: 'Management' },
          { label: 'Workload Network', mac: null, model: 'vmxnet3', network: 'Workload' },
        ],
      },
    },
    {
      file: 'vagrant-mutate/virtualbox-box.ovf',
      files: [{ id: 'file1', href: 'box-disk1.vmdk', size: null, compression: null, chunkSize: null }],
      systemTypes: ['virtualbox-2.2'],
      cimId: 99,
      manifest: {
        name: 'mutate-test',
        guest_os: { family: 'linux', id: 'Linux26' },
        firmware: 'bios',
        secure_boot: false,
        cpu: { count: 1, cores_per_socket: 1 },
        memory_bytes: 256 * MiB,
        disks: [{ label: 'disk1', capacity_bytes: 4 * MiB, controller: 'sata', address: '0:0' }],
        // MAC of the enabled adapter (slot 0) of the embedded vbox:Machine
        nics: [{ label: "Ethernet adapter on 'NAT'", mac: '08:00:27:55:b8:8d', model: 'e1000', network: 'NAT' }],
      },
    },
  ]
  for (const c of cases) {
    test(c.file, () => {
      const env = parseOvfEnvelope(readFileSync(path.join(CORPUS, c.file), 'utf8'), c.file)
      expect(env.version).toBe('1')
      expect(env.files).toEqual(c.files as any)
      expect(env.virtualSystem.hardwareSections.map((s) => s.systemTypes)).toEqual([c.systemTypes])
      expect(env.virtualSystem.os.cimId).toBe(c.cimId)
      const m = manifestOf(env)
      const { disks, ...rest } = c.manifest
      expect(m).toMatchObject({ ...rest, source_format: 'ovf_folder', cbt_available: false })
      expect(m.disks.length).toBe(disks.length)
      disks.forEach((d, i) => {
        expect(m.disks[i]).toMatchObject({ ...d, disk_format: 'vmdk' })
        if (!('allocated_bytes' in d)) expect(m.disks[i]!.allocated_bytes).toBeUndefined()
      })
    })
  }

  test('configspec.ovf: NVMe, SATA (AHCI), pvscsi and lsilogic controllers; blank disks warned', () => {
    const env = parseOvfEnvelope(readFileSync(path.join(CORPUS, 'govmomi/configspec.ovf'), 'utf8'), 'configspec.ovf')
    const sec = pickHardwareSection(env)
    const ctrls = sec.items.filter((i) => [5, 6, 20].includes(i.resourceType)).map((i) => [i.instanceId, i.resourceSubType, controllerBus(i), i.address])
    expect(ctrls).toEqual([
      ['3', 'lsilogic', 'scsi', '0'],
      ['9', null, 'ide', '1'],
      ['10', null, 'ide', '0'],
      ['14', 'VirtualSCSI', 'scsi', '1'],
      ['16', 'vmware.sata.ahci', 'sata', '0'],
      ['18', 'ahci', 'sata', '1'],
      ['20', 'vmware.nvme.controller', 'nvme', '0'],
    ])
    const diskParents = sec.items.filter((i) => i.resourceType === 17).map((i) => [i.elementName, i.parent, i.hostResource])
    expect(diskParents).toEqual([
      ['Hard Disk 1', '3', ['ovf:/disk/vmdisk1']],
      ['Hard Disk 2', '14', []],
      ['Hard Disk 3', '16', []],
      ['Hard Disk 4', '18', []],
      ['Hard Disk 5', '20', []],
    ])
    expect(env.defaultConfiguration).toBe('default')
    expect(sec.config.get('bootOptions.efiSecureBootEnabled')).toBe('false')
    const m = manifestOf(env)
    expect(m.warnings).toEqual([2, 3, 4, 5].map((n) => `Hard Disk ${n}: no HostResource (an empty disk to create); not imported`))
  })

  test('test-i-ova-formats.ovf: OperatingSystemSection Description and vmw:Config firmware', () => {
    const env = parseOvfEnvelope(readFileSync(path.join(CORPUS, 'virt-v2v/test-i-ova-formats.ovf'), 'utf8'), 'x')
    expect(env.virtualSystem.os).toEqual({
      cimId: 103,
      vmwOsType: 'windows7Server64Guest',
      vboxOsType: null,
      description: 'Microsoft Windows Server 2008 R2 (64-bit)',
    })
    expect(env.virtualSystem.hardwareSections[0]!.config.get('firmware')).toBe('efi')
    expect(env.networks).toEqual([{ name: 'PG-VLAN60', description: 'The PG-VLAN60 network' }])
  })
})

/** A small OVF 1.0 envelope; `extra` goes inside the VirtualHardwareSection. */
function ovf(p: { head?: string; attrs?: string; extra?: string; disk?: string; os?: string; file?: string } = {}): string {
  return `<?xml version="1.0" encoding="UTF-8"?>${p.head ?? ''}
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1"
  xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData"
  xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData"
  xmlns:vmw="http://www.vmware.com/schema/ovf" ${p.attrs ?? ''}>
  <References>${p.file ?? '<File ovf:href="d1.vmdk" ovf:id="f1" ovf:size="1024"/>'}</References>
  <DiskSection><Info>d</Info>${p.disk ?? '<Disk ovf:diskId="d1" ovf:fileRef="f1" ovf:capacity="8" ovf:capacityAllocationUnits="byte * 2^20"/>'}</DiskSection>
  <VirtualSystem ovf:id="vm1"><Info>vm</Info><Name>vm one</Name>
    ${p.os ?? '<OperatingSystemSection ovf:id="36"><Info>os</Info></OperatingSystemSection>'}
    <VirtualHardwareSection><Info>hw</Info>
      <System><vssd:VirtualSystemType>vmx-11</vssd:VirtualSystemType></System>
      <Item><rasd:InstanceID>1</rasd:InstanceID><rasd:ResourceType>3</rasd:ResourceType><rasd:VirtualQuantity>4</rasd:VirtualQuantity></Item>
      <Item><rasd:InstanceID>2</rasd:InstanceID><rasd:ResourceType>4</rasd:ResourceType><rasd:VirtualQuantity>512</rasd:VirtualQuantity></Item>
      <Item><rasd:InstanceID>3</rasd:InstanceID><rasd:ResourceType>6</rasd:ResourceType><rasd:ResourceSubType>buslogic</rasd:ResourceSubType><rasd:Address>0</rasd:Address></Item>
      <Item><rasd:InstanceID>4</rasd:InstanceID><rasd:ResourceType>17</rasd:ResourceType><rasd:ElementName>disk A</rasd:ElementName><rasd:HostResource>ovf:/disk/d1</rasd:HostResource><rasd:Parent>3</rasd:Parent><rasd:AddressOnParent>1</rasd:AddressOnParent></Item>
      ${p.extra ?? ''}
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>`
}

describe('envelope details', () => {
  test('defaults: memory in MiB, CIM id 36 = linux, buslogic SCSI address "0:1"', () => {
    const m = manifestOf(parseOvfEnvelope(ovf(), 't.ovf'))
    expect(m).toMatchObject({ name: 'vm one', guest_os: { family: 'linux', id: 'LINUX' }, cpu: { count: 4, cores_per_socket: 1 }, memory_bytes: 512 * MiB })
    expect(m.disks[0]).toMatchObject({ label: 'disk A', capacity_bytes: 8 * MiB, controller: 'scsi', address: '0:1' })
  })

  test('namespaces are matched by URI, not prefix', () => {
    const xml = `<?xml version="1.0"?>
<o:Envelope xmlns:o="http://schemas.dmtf.org/ovf/envelope/1" xmlns:r="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData" xmlns:ovf="urn:not-ovf" xmlns:v="http://www.vmware.com/schema/ovf">
  <o:References><o:File o:href="x.vmdk" o:id="f" ovf:size="999"/></o:References>
  <o:DiskSection><o:Disk o:diskId="d" o:fileRef="f" o:capacity="1" o:capacityAllocationUnits="byte*2^30"/></o:DiskSection>
  <o:VirtualSystem o:id="ns-vm">
    <o:OperatingSystemSection o:id="1" v:osType="windows9_64Guest"/>
    <o:VirtualHardwareSection>
      <o:Item><r:InstanceID>1</r:InstanceID><r:ResourceType>4</r:ResourceType><r:VirtualQuantity>3</r:VirtualQuantity><r:AllocationUnits>byte * 2^30</r:AllocationUnits></o:Item>
      <ovf:Item><r:InstanceID>9</r:InstanceID><r:ResourceType>4</r:ResourceType><r:VirtualQuantity>1</r:VirtualQuantity></ovf:Item>
      <o:Item><r:InstanceID>2</r:InstanceID><r:ResourceType>17</r:ResourceType><r:HostResource>ovf:/disk/d</r:HostResource></o:Item>
      <o:Item><r:InstanceID>3</r:InstanceID><r:ResourceType>10</r:ResourceType><r:Address>00-50-56-AB-CD-EF</r:Address><r:ResourceSubType>VmxNet3</r:ResourceSubType></o:Item>
      <v:Config v:key="firmware" v:value="efi"/><v:Config v:key="uefi.secureBoot.enabled" v:value="TRUE"/>
    </o:VirtualHardwareSection>
  </o:VirtualSystem>
</o:Envelope>`
    const env = parseOvfEnvelope(xml, 'ns.ovf')
    // ovf:size is in urn:not-ovf, so it is not the OVF size
    expect(env.files).toEqual([{ id: 'f', href: 'x.vmdk', size: null, compression: null, chunkSize: null }])
    const m = manifestOf(env)
    expect(m).toMatchObject({
      name: 'ns-vm',
      memory_bytes: 3 * GiB,
      firmware: 'efi',
      secure_boot: true,
      guest_os: { family: 'windows', id: 'windows9_64Guest' },
    })
    expect(m.disks[0]).toMatchObject({ capacity_bytes: GiB, controller: 'unknown', address: '0:0' })
    expect(m.nics).toEqual([{ label: 'Ethernet 1', mac: '00:50:56:ab:cd:ef', model: 'vmxnet3', network: null }])
  })

  test('OVF 2.0 envelope with StorageItem / EthernetPortItem, gzip and chunked files', () => {
    const xml = `<?xml version="1.0"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/2" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/2"
  xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData"
  xmlns:sasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_StorageAllocationSettingData"
  xmlns:epasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_EthernetPortAllocationSettingData"
  xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData">
  <References>
    <File ovf:href="a.vmdk.gz" ovf:id="fa" ovf:size="100" ovf:compression="gzip"/>
    <File ovf:href="b.img" ovf:id="fb" ovf:size="3000" ovf:chunkSize="1024"/>
  </References>
  <DiskSection><Disk ovf:diskId="a" ovf:fileRef="fa" ovf:capacity="2" ovf:capacityAllocationUnits="byte * 2^30" ovf:populatedSize="123"/>
    <Disk ovf:diskId="b" ovf:fileRef="fb" ovf:capacity="3000"/></DiskSection>
  <VirtualSystem ovf:id="v2">
    <VirtualHardwareSection><System><vssd:VirtualSystemType>kvm-qemu generic</vssd:VirtualSystemType></System>
      <Item><rasd:InstanceID>1</rasd:InstanceID><rasd:ResourceType>3</rasd:ResourceType><rasd:VirtualQuantity>2</rasd:VirtualQuantity></Item>
      <Item><rasd:InstanceID>5</rasd:InstanceID><rasd:ResourceType>20</rasd:ResourceType><rasd:ResourceSubType>AHCI</rasd:ResourceSubType></Item>
      <StorageItem><sasd:InstanceID>6</sasd:InstanceID><sasd:ResourceType>17</sasd:ResourceType><sasd:HostResource>ovf:/disk/a</sasd:HostResource><sasd:Parent>5</sasd:Parent><sasd:AddressOnParent>2</sasd:AddressOnParent></StorageItem>
      <StorageItem><sasd:InstanceID>7</sasd:InstanceID><sasd:ResourceType>17</sasd:ResourceType><sasd:HostResource>ovf:/disk/b</sasd:HostResource><sasd:Parent>5</sasd:Parent></StorageItem>
      <EthernetPortItem><epasd:InstanceID>8</epasd:InstanceID><epasd:ResourceType>10</epasd:ResourceType><epasd:Connection>lan</epasd:Connection><epasd:Address>AA:BB:CC:DD:EE:FF</epasd:Address></EthernetPortItem>
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>`
    const env = parseOvfEnvelope(xml, 'v2.ovf')
    expect(env.version).toBe('2')
    expect(env.files).toEqual([
      { id: 'fa', href: 'a.vmdk.gz', size: 100, compression: 'gzip', chunkSize: null },
      { id: 'fb', href: 'b.img', size: 3000, compression: null, chunkSize: 1024 },
    ])
    const m = manifestOf(env)
    expect(m.disks.map((d) => [d.capacity_bytes, d.allocated_bytes, d.controller, d.address])).toEqual([
      [2 * GiB, 123, 'sata', '0:2'],
      [3000, undefined, 'sata', '0:1'],
    ])
    expect(m.nics).toEqual([{ label: 'Ethernet 1', mac: 'aa:bb:cc:dd:ee:ff', model: 'e1000', network: 'lan' }])
    expect(m.guest_os).toEqual({ family: 'unknown', id: null })
  })

  test('pickHardwareSection prefers vmx over a vendor section it cannot use', () => {
    const xen = `</VirtualHardwareSection><VirtualHardwareSection><Info>x</Info><System><vssd:VirtualSystemType>xen-3.0-x86_64</vssd:VirtualSystemType></System>
      <Item><rasd:InstanceID>1</rasd:InstanceID><rasd:ResourceType>3</rasd:ResourceType><rasd:VirtualQuantity>16</rasd:VirtualQuantity></Item>`
    const xml = ovf({ extra: xen }).replace(
      '<VirtualHardwareSection><Info>hw</Info>',
      `<VirtualHardwareSection><Info>x0</Info><System><vssd:VirtualSystemType>hyperv-5</vssd:VirtualSystemType></System>
      <Item><rasd:InstanceID>1</rasd:InstanceID><rasd:ResourceType>3</rasd:ResourceType><rasd:VirtualQuantity>8</rasd:VirtualQuantity></Item></VirtualHardwareSection>
      <VirtualHardwareSection><Info>hw</Info>`,
    )
    const env = parseOvfEnvelope(xml, 'multi.ovf')
    expect(env.virtualSystem.hardwareSections.map((s) => s.systemTypes[0])).toEqual(['hyperv-5', 'vmx-11', 'xen-3.0-x86_64'])
    expect(pickHardwareSection(env).systemTypes).toEqual(['vmx-11'])
    expect(manifestOf(env).cpu.count).toBe(4)
  })

  test('capacity from a ProductSection property; CoresPerSocket', () => {
    const xml = ovf({
      // biome-ignore lint/suspicious/noTemplateCurlyInString: an OVF property reference, not a JS template
      disk: '<Disk ovf:diskId="d1" ovf:fileRef="f1" ovf:capacity="${disk.size}" ovf:capacityAllocationUnits="byte * 2^30"/>',
      extra: '',
    })
      .replace(
        '<VirtualHardwareSection>',
        '<ProductSection><Info>p</Info><Property ovf:key="disk.size" ovf:type="int" ovf:value="12"/></ProductSection><VirtualHardwareSection>',
      )
      .replace(
        '<rasd:VirtualQuantity>4</rasd:VirtualQuantity>',
        '<rasd:VirtualQuantity>4</rasd:VirtualQuantity><vmw:CoresPerSocket ovf:required="false">2</vmw:CoresPerSocket>',
      )
    const m = manifestOf(parseOvfEnvelope(xml, 'p.ovf'))
    expect(m.disks[0]!.capacity_bytes).toBe(12 * GiB)
    expect(m.cpu).toEqual({ count: 4, cores_per_socket: 2 })
  })

  test('allocation units', () => {
    const table: [string | null, number][] = [
      ['byte * 2^30', GiB],
      ['byte*2^20', MiB],
      ['byte * 1024 * 1024', MiB],
      ['MegaBytes', MiB],
      ['GB', GiB],
      ['byte * 10^9', 1e9],
      ['byte', 1],
      [null, 7],
      ['bytes * 2^10', 1024],
    ]
    for (const [u, v] of table) expect(allocationUnitsMultiplier(u, 7, 'x')).toBe(v)
    for (const u of ['hertz * 10^6', 'byte * 2^99', 'byte / 2', 'percent']) {
      expect(() => allocationUnitsMultiplier(u, 1, 'x')).toThrow(MigError)
    }
  })

  test('CIM OsType table: Windows ids vs Linux ids', () => {
    expect(cimOsType(74)).toEqual({ name: 'Windows Vista 64-Bit', family: 'windows' })
    expect(cimOsType(103)).toEqual({ name: 'Microsoft Windows Server 2008 R2', family: 'windows' })
    expect(cimOsType(120)).toEqual({ name: 'Microsoft Windows 10 64-bit', family: 'windows' })
    expect(cimOsType(99)).toEqual({ name: 'Linux 2.6.x', family: 'linux' })
    expect(cimOsType(107)).toEqual({ name: 'CentOS 64-bit', family: 'linux' })
    expect(cimOsType(42)).toEqual({ name: 'FreeBSD', family: 'other' })
    expect(cimOsType(0).family).toBe('unknown')
    expect(cimOsType(999)).toEqual({ name: null, family: 'unknown' })
    // the CIM id decides when no vendor osType is present
    const m = manifestOf(parseOvfEnvelope(ovf({ os: '<OperatingSystemSection ovf:id="112"><Info>os</Info></OperatingSystemSection>' }), 'w.ovf'))
    expect(m.guest_os).toEqual({ family: 'windows', id: 'Microsoft Windows Server 2012' })
  })

  test('disk format URIs and magic', () => {
    expect(diskFormatFromUri('http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized')).toBe('vmdk')
    expect(diskFormatFromUri('http://www.gnome.org/~markmc/qcow-image-format.html')).toBe('qcow2')
    expect(diskFormatFromUri('http://www.virtualbox.org/manual/ch05.html#vdidetails')).toBe('vdi')
    expect(diskFormatFromUri(null)).toBeNull()
    expect(sniffDiskFormat(Buffer.from('KDMV\x01\0\0\0', 'latin1'))).toBe('vmdk')
    expect(sniffDiskFormat(Buffer.from([0x51, 0x46, 0x49, 0xfb, 0, 0, 0, 3]))).toBe('qcow2')
    expect(sniffDiskFormat(Buffer.from('vhdxfile'))).toBe('vhdx')
    expect(sniffDiskFormat(Buffer.alloc(512), Buffer.concat([Buffer.from('conectix'), Buffer.alloc(504)]))).toBe('vpc')
    expect(sniffDiskFormat(Buffer.alloc(512))).toBeNull()
  })

  test('checkHref', async () => {
    expect(checkHref('disk1.vmdk', 'x')).toBe('disk1.vmdk')
    expect(checkHref('./sub//d.vmdk', 'x')).toBe('sub/d.vmdk')
    for (const bad of [
      '../../etc/passwd',
      '/etc/passwd',
      'http://evil/x.vmdk',
      'file:///etc/shadow',
      'C:\\disk.vmdk',
      'a/%2e%2e/%2e%2e/b',
      'sub/../../x',
      '',
    ]) {
      await expectMigThrown(() => checkHref(bad, 'pkg.ovf'), 'E_MIG_HOST_PATH_REJECTED')
    }
  })
})

describe('hostile descriptors', () => {
  test('XML bomb (entity expansion) is refused before parsing', async () => {
    const bomb =
      `<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;"><!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>` +
      ovf()
        .replace(/^<\?xml[^>]*>/, '')
        .replace('<Name>vm one</Name>', '<Name>&lol3;</Name>')
    await expectMigThrown(() => parseOvfEnvelope(bomb, 'bomb.ovf'), 'E_MIG_MALFORMED_ARCHIVE', 'bomb.ovf', 'DOCTYPE')
  })

  test('a DOCTYPE without entities is refused too', async () => {
    await expectMigThrown(
      () => parseOvfEnvelope(ovf({ head: '<!DOCTYPE Envelope SYSTEM "file:///etc/passwd">' }), 'dt.ovf'),
      'E_MIG_MALFORMED_ARCHIVE',
      'DOCTYPE',
    )
  })

  test('an undefined entity is refused; predefined ones and character references decode', async () => {
    await expectMigThrown(() => parseOvfEnvelope(ovf().replace('vm one', 'vm &xxe;'), 'e.ovf'), 'E_MIG_MALFORMED_ARCHIVE', 'undefined entity &xxe;')
    const env = parseOvfEnvelope(ovf().replace('vm one', 'a &amp; b &lt;&#67;&#x44;&gt;'), 'e.ovf')
    expect(env.virtualSystem.name).toBe('a & b <CD>')
  })

  test('__proto__ / constructor elements and attributes are ignored, nothing is polluted', () => {
    const xml = ovf({
      attrs: '__proto__="x" constructor="y"',
      extra:
        '<__proto__ polluted="yes"><rasd:ResourceType>3</rasd:ResourceType></__proto__><vmw:Config vmw:key="__proto__" vmw:value="bad"/><constructor/><vmw:prototype/>',
    }).replace('<Name>vm one</Name>', '<Name>vm one</Name><prototype x="1"/>')
    const env = parseOvfEnvelope(xml, 'proto.ovf')
    expect(({} as Record<string, unknown>).polluted).toBeUndefined()
    expect(Object.hasOwn(Object.prototype, 'polluted')).toBe(false)
    const m = manifestOf(env)
    expect(m.cpu.count).toBe(4)
    expect(pickHardwareSection(env).config.get('__proto__')).toBe('bad') // a Map key, harmless
  })

  test('a 5 MiB descriptor is refused', async () => {
    const big = ovf({ extra: `<!-- ${'x'.repeat(5 * MiB)} -->` })
    await expectMigThrown(() => parseOvfEnvelope(big, 'big.ovf'), 'E_MIG_MALFORMED_ARCHIVE', 'big.ovf', 'larger than 4194304 bytes')
  })

  test('not well-formed, wrong root, missing attributes, bad numbers', async () => {
    await expectMigThrown(
      () => parseOvfEnvelope(readFileSync(path.join(CORPUS, 'virt-v2v/test-i-ova.ovf'), 'utf8').slice(0, 3000), 'cut.ovf'),
      'E_MIG_MALFORMED_ARCHIVE',
      'cut.ovf',
      'not well-formed',
    )
    await expectMigThrown(
      () => parseOvfEnvelope('<?xml version="1.0"?><Foo xmlns="http://schemas.dmtf.org/ovf/envelope/1"/>', 'r.ovf'),
      'E_MIG_MALFORMED_ARCHIVE',
      'not an OVF Envelope',
    )
    await expectMigThrown(() => parseOvfEnvelope('<Envelope xmlns="urn:x"/>', 'n.ovf'), 'E_MIG_MALFORMED_ARCHIVE', 'namespace')
    await expectMigThrown(
      () => parseOvfEnvelope('<Envelope xmlns="http://www.vmware.com/schema/ovf/1/envelope"/>', 'old.ovf'),
      'E_MIG_UNSUPPORTED_FORMAT',
      'OVF 0.9',
    )
    await expectMigThrown(
      () => parseOvfEnvelope(ovf({ disk: '<Disk ovf:diskId="d1" ovf:fileRef="f1"/>' }), 'c.ovf'),
      'E_MIG_MALFORMED_ARCHIVE',
      'Disk d1: no ovf:capacity',
    )
    await expectMigThrown(
      () => parseOvfEnvelope(ovf({ disk: '<Disk ovf:diskId="d1" ovf:fileRef="f1" ovf:capacity="-5"/>' }), 'c.ovf'),
      'E_MIG_MALFORMED_ARCHIVE',
      'not a non-negative integer',
    )
    await expectMigThrown(
      () => parseOvfEnvelope(ovf({ disk: '<Disk ovf:diskId="d1" ovf:fileRef="nope" ovf:capacity="5"/>' }), 'c.ovf'),
      'E_MIG_MALFORMED_ARCHIVE',
      'names no References/File',
    )
    await expectMigThrown(
      () =>
        parseOvfEnvelope(ovf({ disk: '<Disk ovf:diskId="d1" ovf:fileRef="f1" ovf:capacity="99999999" ovf:capacityAllocationUnits="byte * 2^40"/>' }), 'c.ovf'),
      'E_MIG_MALFORMED_ARCHIVE',
      'out of range',
    )
    await expectMigThrown(
      () => parseOvfEnvelope(ovf({ file: '<File ovf:href="a" ovf:id="f1" ovf:compression="bzip2"/>' }), 'c.ovf'),
      'E_MIG_UNSUPPORTED_FORMAT',
      'bzip2',
    )
    await expectMigThrown(
      () => parseOvfEnvelope(ovf().replace('<rasd:InstanceID>1</rasd:InstanceID>', '<x:InstanceID>1</x:InstanceID>'), 'u.ovf'),
      'E_MIG_MALFORMED_ARCHIVE',
      'undeclared namespace prefix',
    )
    await expectMigThrown(
      () => manifestOf(parseOvfEnvelope(ovf().replace('ovf:/disk/d1', 'ovf:/disk/zz'), 'h.ovf')),
      'E_MIG_MALFORMED_ARCHIVE',
      'names no DiskSection disk',
    )
  })

  test('deep nesting is bounded', async () => {
    const deep = ovf({ extra: '<a>'.repeat(300) + '</a>'.repeat(300) })
    await expectMigThrown(() => parseOvfEnvelope(deep, 'deep.ovf'), 'E_MIG_MALFORMED_ARCHIVE', 'deep.ovf')
  })
})

describe('.mf manifest', () => {
  const h1 = 'a'.repeat(40)
  const h256 = 'B'.repeat(64)
  const h512 = 'c'.repeat(128)

  test('ovftool and coreutils spellings, CRLF, blank lines', () => {
    const text = `SHA1(vm.ovf)= ${h1}\r\nSHA256 (disk 1.vmdk) = ${h256}\r\n\r\n  SHA512(./sub/d2.vmdk)=${h512}  \n`
    expect(parseOvfManifest(text, 'vm.mf')).toEqual([
      { name: 'vm.ovf', algorithm: 'sha1', hex: h1 },
      { name: 'disk 1.vmdk', algorithm: 'sha256', hex: h256.toLowerCase() },
      { name: './sub/d2.vmdk', algorithm: 'sha512', hex: h512 },
    ])
  })

  test('bad lines', async () => {
    await expectMigThrown(() => parseOvfManifest(`MD5(vm.ovf)= ${'a'.repeat(32)}`, 'vm.mf'), 'E_MIG_MALFORMED_ARCHIVE', 'vm.mf', 'line 1')
    await expectMigThrown(() => parseOvfManifest(`SHA1(vm.ovf)= ${h1}\nSHA256(vm.vmdk)= ${h1}`, 'vm.mf'), 'E_MIG_MALFORMED_ARCHIVE', 'line 2', 'expected 64')
    await expectMigThrown(() => parseOvfManifest(`SHA1(vm.ovf)= ${h1}\nSHA1(./vm.ovf)= ${'b'.repeat(40)}`, 'vm.mf'), 'E_MIG_MALFORMED_ARCHIVE', 'listed twice')
  })

  test('verification: match, mismatch, missing file, deferred large file', async () => {
    const files = new Map([
      ['small', { size: 10, digest: async () => h1 }],
      [
        'large',
        {
          size: 65 * MiB,
          digest: async (): Promise<string> => {
            throw new Error('must not hash a large file at inspect')
          },
        },
      ],
    ])
    const res = await verifyOvfManifest(
      [
        { name: 'small', algorithm: 'sha1', hex: h1 },
        { name: 'large', algorithm: 'sha256', hex: h256.toLowerCase() },
      ],
      (n) => files.get(n) ?? null,
      { label: 'x.mf' },
    )
    expect(res.verified).toEqual(['small'])
    expect([...res.deferred]).toEqual([['large', { algorithm: 'sha256', hex: h256.toLowerCase() }]])
    const err = await expectMigThrown(
      () => verifyOvfManifest([{ name: 'small', algorithm: 'sha1', hex: 'f'.repeat(40) }], (n) => files.get(n) ?? null, { label: 'x.mf' }),
      'E_MIG_MALFORMED_ARCHIVE',
      'small',
      'SHA1',
      'f'.repeat(40),
      h1,
    )
    expect(err.details).toEqual({ file: 'small', algorithm: 'sha1', expected: 'f'.repeat(40), actual: h1 })
    await expectMigThrown(
      () => verifyOvfManifest([{ name: 'ghost.vmdk', algorithm: 'sha1', hex: h1 }], (n) => files.get(n) ?? null, { label: 'x.mf' }),
      'E_MIG_MALFORMED_ARCHIVE',
      'ghost.vmdk',
      'not in the package',
    )
  })
})
