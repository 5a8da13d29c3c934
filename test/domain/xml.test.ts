/**
 * Golden and structural checks of the libvirt domain XML (lib/domain/xml.ts), each document also
 * validated against libvirt's RelaxNG schema with `virt-xml-validate` (libxml2-utils + libvirt-clients).
 */
import { describe, expect, test, afterAll } from 'bun:test'
import { spawnSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { XMLParser } from 'fast-xml-parser'
import { MigError } from '../../lib/errors.ts'
import { buildDomainXml, sanitizeDomainName, targetDevName, type DomainXmlInput } from '../../lib/domain/xml.ts'
import { normalizeMac } from '../../lib/mac.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'
import { disk, manifest } from './fixtures.ts'

const tmp = tempDir('mig-xml-')
afterAll(() => tmp.cleanup())

const UUID = '6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b'
const SERIAL = '/var/log/migrator/j1.serial.log'
const ZVOL = '/dev/zvol/tank/vm/migrations/j1/Hard_disk_1'

let n = 0
/** Builds the XML, validates it with virt-xml-validate (installed in CI), returns text and parsed tree. */
function build(over: Partial<DomainXmlInput> = {}): { xml: string; dom: any } {
  const input: DomainXmlInput = {
    manifest: manifest(),
    volumes: [{ label: 'Hard disk 1', path: ZVOL }],
    uuid: UUID,
    domainType: 'qemu',
    defaultBridge: null,
    serialLogPath: SERIAL,
    ...over,
  }
  const xml = buildDomainXml(input)
  // Always validated: a missing virt-xml-validate fails the test, never skips.
  const f = path.join(tmp.dir, `d${n++}.xml`)
  writeFileSync(f, xml)
  const r = spawnSync('virt-xml-validate', [f, 'domain'], { encoding: 'utf8' })
  expect(r.error?.message ?? null).toBeNull()
  expect(`${r.stdout}${r.stderr}`.trim()).toBe(`${f} validates`)
  expect(r.status).toBe(0)
  const dom = new XMLParser({
    ignoreAttributes: false,
    attributeNamePrefix: '',
    isArray: (name) => ['disk', 'interface'].includes(name),
    processEntities: true,
  }).parse(xml).domain
  return { xml, dom }
}

const GOLDEN_LINUX_BIOS = `<domain type="qemu">
  <name>web01</name>
  <uuid>6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b</uuid>
  <title>Imported ova_archive: web01</title>
  <description>Imported by the VM migrator from ova_archive.
Source name: web01
Guest OS: linux (ubuntu64Guest)
Disk 0: Hard disk 1 -&gt; /dev/zvol/tank/vm/migrations/j1/Hard_disk_1</description>
  <memory unit="KiB">2097152</memory>
  <currentMemory unit="KiB">2097152</currentMemory>
  <vcpu placement="static">2</vcpu>
  <os>
    <type arch="x86_64" machine="q35">hvm</type>
    <bios useserial="yes"/>
  </os>
  <features>
    <acpi/>
    <apic/>
  </features>
  <cpu>
    <topology sockets="2" dies="1" cores="1" threads="1"/>
  </cpu>
  <clock offset="utc"/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type="block" device="disk">
      <driver name="qemu" type="raw" cache="none" io="native" discard="unmap"/>
      <source dev="/dev/zvol/tank/vm/migrations/j1/Hard_disk_1"/>
      <target dev="vda" bus="virtio"/>
      <boot order="1"/>
    </disk>
    <interface type="bridge">
      <mac address="00:50:56:01:02:03"/>
      <source bridge="br0"/>
      <model type="virtio"/>
    </interface>
    <serial type="file">
      <source path="/var/log/migrator/j1.serial.log"/>
      <target port="0"/>
    </serial>
    <console type="file">
      <source path="/var/log/migrator/j1.serial.log"/>
      <target type="serial" port="0"/>
    </console>
    <channel type="unix">
      <target type="virtio" name="org.qemu.guest_agent.0"/>
    </channel>
    <graphics type="vnc" port="-1" autoport="yes" listen="127.0.0.1">
      <listen type="address" address="127.0.0.1"/>
    </graphics>
    <video>
      <model type="virtio"/>
    </video>
    <memballoon model="virtio"/>
    <panic model="isa"/>
  </devices>
</domain>
`

describe('buildDomainXml', () => {
  test('Linux BIOS guest on a zvol with a mapped bridge: golden document', () => {
    const { xml } = build({ plan: { networks: [{ source: 'VM Network', bridge: 'br0' }] } })
    expect(xml).toBe(GOLDEN_LINUX_BIOS)
  })

  test('UEFI without secure boot: OVMF pflash loader, NVRAM from the VARS template, no SMM', () => {
    const { dom } = build({ manifest: manifest({ firmware: 'efi' }) })
    expect(dom.os.type).toEqual({ '#text': 'hvm', arch: 'x86_64', machine: 'q35' })
    expect(dom.os.loader).toEqual({ '#text': '/usr/share/OVMF/OVMF_CODE_4M.fd', readonly: 'yes', secure: 'no', type: 'pflash' })
    expect(dom.os.nvram).toEqual({ '#text': '/var/lib/libvirt/qemu/nvram/web01_VARS.fd', template: '/usr/share/OVMF/OVMF_VARS_4M.fd' })
    expect(dom.features.smm).toBeUndefined()
  })

  test('UEFI secure boot: secure loader, MS-keys VARS template, SMM on; explicit OVMF paths are used', () => {
    const { dom } = build({ manifest: manifest({ firmware: 'efi', secure_boot: true }) })
    expect(dom.os.loader).toEqual({ '#text': '/usr/share/OVMF/OVMF_CODE_4M.secboot.fd', readonly: 'yes', secure: 'yes', type: 'pflash' })
    expect(dom.os.nvram.template).toBe('/usr/share/OVMF/OVMF_VARS_4M.ms.fd')
    expect(dom.features.smm).toEqual({ state: 'on' })
    const custom = build({
      manifest: manifest({ firmware: 'efi', secure_boot: true }),
      ovmf: { code: '/opt/ovmf/CODE.sb.fd', varsTemplate: '/opt/ovmf/VARS.fd', nvram: '/var/lib/mig/nvram/x.fd' },
    }).dom
    expect(custom.os.loader['#text']).toBe('/opt/ovmf/CODE.sb.fd')
    expect(custom.os.nvram).toEqual({ '#text': '/var/lib/mig/nvram/x.fd', template: '/opt/ovmf/VARS.fd' })
  })

  test('plan.firmware overrides the manifest; secure boot only applies to UEFI', () => {
    const bios = build({ manifest: manifest({ firmware: 'efi', secure_boot: true }), plan: { firmware: 'bios' } }).dom
    expect(bios.os.loader).toBeUndefined()
    expect(bios.os.bios).toEqual({ useserial: 'yes' })
    expect(build({ manifest: manifest({ firmware: 'efi' }) }).dom.os.bios).toBeUndefined()
    expect(bios.features.smm).toBeUndefined()
    const efi = build({ plan: { firmware: 'efi' } }).dom
    expect(efi.os.loader.secure).toBe('no')
  })

  test('Windows guest: SATA disks, e1000 NICs, localtime clock, Hyper-V enlightenments only under KVM', () => {
    const m = manifest({ guest_os: { family: 'windows', id: 'windows2019srv_64Guest' }, disks: [disk('C'), disk('D')] })
    const vols = [
      { label: 'C', path: '/dev/zvol/t/C' },
      { label: 'D', path: '/dev/zvol/t/D' },
    ]
    const tcg = build({ manifest: m, volumes: vols }).dom
    expect(tcg.devices.disk.map((d: any) => d.target)).toEqual([
      { dev: 'sda', bus: 'sata' },
      { dev: 'sdb', bus: 'sata' },
    ])
    expect(tcg.devices.interface[0].model.type).toBe('e1000')
    expect(tcg.clock.offset).toBe('localtime')
    expect(tcg.features.hyperv).toBeUndefined()
    expect(tcg.devices.video.model.type).toBe('vga')
    const kvm = build({ manifest: m, volumes: vols, domainType: 'kvm' }).dom
    expect(kvm.type).toBe('kvm')
    expect(kvm.cpu.mode).toBe('host-passthrough')
    expect(kvm.features.hyperv.mode).toBe('custom')
    expect(kvm.features.hyperv.spinlocks).toEqual({ state: 'on', retries: '8191' })
    expect(kvm.clock.timer).toEqual({ name: 'hypervclock', present: 'yes' })
    // After V2V the orchestrator switches to virtio per volume and for the NICs.
    const after = build({ manifest: m, volumes: vols.map((v) => ({ ...v, bus: 'virtio' as const })), nicModel: 'virtio' }).dom
    expect(after.devices.disk.map((d: any) => d.target.dev)).toEqual(['vda', 'vdb'])
    expect(after.devices.interface[0].model.type).toBe('virtio')
    // plan.guest_os overrides the manifest's family.
    expect(build({ plan: { guest_os: 'windows' } }).dom.devices.disk[0].target.bus).toBe('sata')
  })

  test('multi-disk: manifest order, boot order on the first disk only, cache per volume type', () => {
    const m = manifest({ disks: [disk('boot'), disk('data'), disk('logs'), disk('scratch')] })
    const { dom } = build({
      manifest: m,
      volumes: [
        { label: 'boot', path: '/dev/zvol/t/boot' },
        { label: 'data', path: '/var/lib/mig/volumes/j1/data.img' },
        { label: 'logs', path: '/var/lib/mig/volumes/j1/logs.img', directIo: true },
        { label: 'scratch', path: '/dev/loop7', bus: 'scsi' },
      ],
    })
    const d = dom.devices.disk
    expect(d.map((x: any) => x.type)).toEqual(['block', 'file', 'file', 'block'])
    expect(d.map((x: any) => x.source)).toEqual([
      { dev: '/dev/zvol/t/boot' },
      { file: '/var/lib/mig/volumes/j1/data.img' },
      { file: '/var/lib/mig/volumes/j1/logs.img' },
      { dev: '/dev/loop7' },
    ])
    expect(d.map((x: any) => x.target)).toEqual([
      { dev: 'vda', bus: 'virtio' },
      { dev: 'vdb', bus: 'virtio' },
      { dev: 'vdc', bus: 'virtio' },
      { dev: 'sda', bus: 'scsi' },
    ])
    expect(d.map((x: any) => [x.driver.cache, x.driver.io])).toEqual([
      ['none', 'native'],
      ['writeback', 'threads'],
      ['none', 'native'],
      ['none', 'native'],
    ])
    expect(d.map((x: any) => x.boot?.order ?? null)).toEqual(['1', null, null, null])
    expect(dom.devices.controller).toEqual({ type: 'scsi', index: '0', model: 'virtio-scsi' })
  })

  test('SCSI models with one LUN per target (pvscsi, LSI SAS 1068): each disk on a target of its own, LUN 0; too many disks fail', async () => {
    const m = manifest({ disks: [disk('boot'), disk('data'), disk('logs')] })
    const volumes = (bus: 'scsi' | 'virtio') => [
      { label: 'boot', path: '/dev/zvol/t/boot', bus: 'scsi' as const },
      { label: 'data', path: '/dev/zvol/t/data', bus },
      { label: 'logs', path: '/dev/zvol/t/logs', bus: 'scsi' as const },
    ]
    // libvirt's default address is LUN N of target 0, which qemu's pvscsi refuses ("bad scsi device lun: 1").
    const pv = build({ manifest: m, volumes: volumes('scsi'), scsiModel: 'vmpvscsi' }).dom.devices
    expect(pv.controller).toEqual({ type: 'scsi', index: '0', model: 'vmpvscsi' })
    expect(pv.disk.map((x: any) => [x.target.dev, x.address])).toEqual([
      ['sda', { type: 'drive', controller: '0', bus: '0', target: '0', unit: '0' }],
      ['sdb', { type: 'drive', controller: '0', bus: '0', target: '1', unit: '0' }],
      ['sdc', { type: 'drive', controller: '0', bus: '0', target: '2', unit: '0' }],
    ])
    // Targets count SCSI disks only.
    const mixed = build({ manifest: m, volumes: volumes('virtio'), scsiModel: 'lsisas1068' }).dom.devices.disk
    expect(mixed.map((x: any) => [x.target.dev, x.address?.target ?? null])).toEqual([
      ['sda', '0'],
      ['vda', null],
      ['sdb', '1'],
    ])
    // virtio-scsi (many LUNs) and lsilogic (libvirt maps the unit to the SCSI id) keep libvirt's addressing.
    for (const scsiModel of ['virtio-scsi', 'lsilogic'] as const)
      expect(build({ manifest: m, volumes: volumes('scsi'), scsiModel }).dom.devices.disk.map((x: any) => x.address ?? null)).toEqual([null, null, null])
    const nine = manifest({ disks: Array.from({ length: 9 }, (_v, i) => disk(`d${i}`)) })
    const e = await thrown(() =>
      buildDomainXml({
        manifest: nine,
        volumes: nine.disks.map((d, i) => ({ label: d.label, path: `/dev/zvol/t/d${i}`, bus: 'scsi' as const })),
        uuid: UUID,
        domainType: 'qemu',
        defaultBridge: null,
        serialLogPath: SERIAL,
        scsiModel: 'lsisas1068',
      }),
    )
    expect(e).toBeInstanceOf(MigError)
    expect((e as MigError).code).toBe('E_MIG_DOMAIN_DEFINE_FAILED')
    expect((e as MigError).message).toContain('9 SCSI disks: the lsisas1068 controller has 8 targets of one LUN each')
  })

  test('NIC mapping: plan.networks by the NIC network name, else the default bridge, else user networking', () => {
    const m = manifest({
      nics: [
        { label: 'a', mac: '00:50:56:AA:BB:01', model: 'vmxnet3', network: 'Prod' },
        { label: 'b', mac: '00-50-56-aa-bb-02', model: 'e1000', network: 'Backup' },
        { label: 'c', mac: null, model: 'e1000', network: null },
        { label: 'd', mac: '01:00:5e:00:00:01', model: 'e1000', network: 'Prod' }, // multicast: dropped
        { label: 'e', mac: '00:50:56:aa:bb:01', model: 'e1000', network: 'Prod' }, // duplicate: dropped
      ],
    })
    const plan = {
      networks: [
        { source: 'Prod', bridge: 'br-prod' },
        { source: 'Prod', bridge: 'br-other' },
      ],
    }
    const withDefault = build({ manifest: m, plan, defaultBridge: 'vmbr0' }).dom.devices.interface
    expect(withDefault.map((i: any) => [i.type, i.source?.bridge ?? null, i.mac?.address ?? null])).toEqual([
      ['bridge', 'br-prod', '00:50:56:aa:bb:01'],
      ['bridge', 'vmbr0', '00:50:56:aa:bb:02'],
      ['bridge', 'vmbr0', null],
      ['bridge', 'br-prod', null],
      ['bridge', 'br-prod', null],
    ])
    const noDefault = build({ manifest: m, plan }).dom.devices.interface
    expect(noDefault.map((i: any) => [i.type, i.source?.bridge ?? null])).toEqual([
      ['bridge', 'br-prod'],
      ['user', null],
      ['user', null],
      ['bridge', 'br-prod'],
      ['bridge', 'br-prod'],
    ])
    expect(build({ manifest: manifest({ nics: [] }) }).dom.devices.interface).toBeUndefined()
  })

  test('hostile names and labels are sanitized or escaped, never interpreted', () => {
    const evil = `x"/><devices><disk type='file'><source file='/etc/shadow'/></disk></devices><name>&amp;\u0001\u0000]]>`
    const m = manifest({ name: evil, disks: [disk(`</description><on_crash>restart</on_crash>\u0007`)], guest_os: { family: 'linux', id: '<script>' } })
    const { xml, dom } = build({ manifest: m, volumes: [{ label: 'l', path: '/var/lib/mig/v/a b&c\'d".img' }] })
    expect(dom.name).toBe('x_devices_disk_type_file_source_file_etc_shadow_disk_devices_na')
    expect(dom.name.length).toBeLessThanOrEqual(63)
    expect(dom.title).toBe(`Imported ova_archive: x"/><devices><disk type='file'><source file='/etc/shadow'/></disk></devices><name>&amp;]]>`)
    expect(dom.description).toContain(`Disk 0: </description><on_crash>restart</on_crash> -> /var/lib/mig/v/a b&c'd".img`)
    expect(dom.description).toContain('Guest OS: linux (<script>)')
    expect(dom.on_crash).toBe('destroy')
    expect(dom.devices.disk).toHaveLength(1)
    expect(dom.devices.disk[0].source.file).toBe(`/var/lib/mig/v/a b&c'd".img`)
    expect(xml).not.toContain('\u0000')
    expect(xml).not.toContain('\u0001')
    expect(xml).not.toContain('<!')
    expect(build({ manifest: manifest({ name: '../../..' }) }).dom.name).toBe('vm')
    expect(build({ manifest: manifest({ name: 'db' }), plan: { name: 'db-migrated.1' } }).dom.name).toBe('db-migrated.1')
  })

  test('CPU topology and memory units', () => {
    const t = (count: number, cps: number) => build({ manifest: manifest({ cpu: { count, cores_per_socket: cps } }) }).dom
    expect(t(8, 4).cpu.topology).toEqual({ sockets: '2', dies: '1', cores: '4', threads: '1' })
    expect(t(8, 4).vcpu).toEqual({ '#text': 8, placement: 'static' })
    expect(t(6, 4).cpu.topology).toEqual({ sockets: '6', dies: '1', cores: '1', threads: '1' })
    expect(t(1, 2).cpu.topology).toEqual({ sockets: '1', dies: '1', cores: '1', threads: '1' })
    const mem = (b: number) => build({ manifest: manifest({ memory_bytes: b }) }).dom.memory
    expect(mem(0)).toEqual({ '#text': 1048576, unit: 'KiB' })
    expect(mem(1000)).toEqual({ '#text': 1, unit: 'KiB' })
    expect(mem(4096 * 1024 * 1024 + 1)).toEqual({ '#text': 4194305, unit: 'KiB' })
  })

  test('IDE override selects the i440FX machine (q35 has no IDE)', () => {
    const m = manifest({ guest_os: { family: 'other', id: 'dos' }, disks: [disk('a'), disk('b')] })
    const { dom } = build({
      manifest: m,
      volumes: [
        { label: 'a', path: '/dev/zvol/t/a', bus: 'ide' },
        { label: 'b', path: '/dev/zvol/t/b', bus: 'ide' },
      ],
    })
    expect(dom.os.type.machine).toBe('pc')
    expect(dom.devices.disk.map((d: any) => d.target)).toEqual([
      { dev: 'hda', bus: 'ide' },
      { dev: 'hdb', bus: 'ide' },
    ])
  })

  test('invalid inputs: E_MIG_DOMAIN_DEFINE_FAILED', async () => {
    const cases: Array<[Partial<DomainXmlInput>, RegExp]> = [
      [{ volumes: [] }, /0 volume\(s\) for 1 manifest disk/],
      [{ volumes: [{ label: 'x', path: 'relative/x.img' }] }, /not a clean absolute path/],
      [{ volumes: [{ label: 'x', path: '/var/../etc/x' }] }, /not a clean absolute path/],
      [{ serialLogPath: '/tmp/a\nb' }, /serial log: not a clean absolute path/],
      [{ uuid: 'not-a-uuid' }, /invalid domain uuid/],
      [
        { manifest: manifest({ firmware: 'efi', secure_boot: true }), volumes: [{ label: 'x', path: '/dev/x', bus: 'ide' }] },
        /secure boot needs the q35 machine/,
      ],
      [{ defaultBridge: 'br0 ; rm' }, /invalid bridge name/],
      [
        {
          manifest: manifest({ disks: Array.from({ length: 65 }, (_, i) => disk(`d${i}`)) }),
          volumes: Array.from({ length: 65 }, (_, i) => ({ label: `d${i}`, path: `/dev/d${i}` })),
        },
        /too many disks/,
      ],
    ]
    for (const [over, re] of cases) {
      const err = await thrown(() => build(over))
      expect(err).toBeInstanceOf(MigError)
      expect(err.code).toBe('E_MIG_DOMAIN_DEFINE_FAILED')
      expect(err.message).toMatch(re)
    }
  })
})

describe('helpers', () => {
  test('targetDevName spells device names like libvirt', () => {
    expect([0, 1, 25, 26, 27, 51, 52, 701, 702].map((i) => targetDevName('vd', i))).toEqual([
      'vda',
      'vdb',
      'vdz',
      'vdaa',
      'vdab',
      'vdaz',
      'vdba',
      'vdzz',
      'vdaaa',
    ])
    expect(targetDevName('sd', 2)).toBe('sdc')
  })

  test('sanitizeDomainName', () => {
    expect(sanitizeDomainName('My VM (prod)')).toBe('My_VM_prod')
    expect(sanitizeDomainName('--opt')).toBe('opt')
    expect(sanitizeDomainName('')).toBe('vm')
    expect(sanitizeDomainName('12345')).toBe('vm-12345')
    expect(sanitizeDomainName('6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b')).toBe('vm-6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b')
    expect(sanitizeDomainName('a'.repeat(100))).toBe('a'.repeat(63))
    expect(sanitizeDomainName('ümlaut-ä')).toBe('mlaut')
  })

  test('normalizeMac', () => {
    expect(normalizeMac('00:0C:29:AB:CD:EF')).toBe('00:0c:29:ab:cd:ef')
    expect(normalizeMac('00-15-5D-01-02-03')).toBe('00:15:5d:01:02:03')
    expect(normalizeMac('ff:ff:ff:ff:ff:ff')).toBeNull()
    expect(normalizeMac('00:00:00:00:00:00')).toBeNull()
    expect(normalizeMac('0:1:2:3:4:5')).toBeNull()
    expect(normalizeMac(null)).toBeNull()
  })
})
