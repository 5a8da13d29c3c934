/**
 * VMX parser and VMX -> manifest tests, on the virt-v2v corpus VMX files and hand-written ones.
 */
import { describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import * as path from 'node:path'
import { VmManifest, type ControllerBus, type ManifestDisk } from '../../lib/manifest.ts'
import { parseVmx, vmxGet, vmxHardware, vmxToManifest, type VmxFile } from '../../lib/formats/vmx.ts'
import { CORPUS, thrown } from '../helpers/tmp.ts'
import { caught, expectMig } from '../helpers/mig-error.ts'

const MiB = 1024 * 1024

/** A resolveDisk that records its calls and returns a 1 GiB vmdk disk. */
function recorder() {
  const calls: Array<[string, ControllerBus, string, string]> = []
  const resolveDisk = async (fileName: string, bus: ControllerBus, address: string, key: string) => {
    calls.push([fileName, bus, address, key])
    const disk: ManifestDisk = {
      label: fileName.replace(/\.vmdk$/, ''),
      capacity_bytes: 1024 * MiB,
      disk_format: 'vmdk',
      source: { path: `/root/${fileName}` },
      controller: bus,
      address,
    }
    return { disk }
  }
  return { calls, resolveDisk }
}

function vmxOf(lines: string[]): VmxFile {
  return parseVmx(lines.join('\n'), 'test.vmx')
}

describe('parseVmx', () => {
  test('corpus test-i-vmx-3.vmx: keys lower-cased, values kept', () => {
    const vmx = parseVmx(readFileSync(path.join(CORPUS, 'virt-v2v/test-i-vmx-3.vmx')), 'test-i-vmx-3.vmx')
    expect(vmx.encoding).toBe('UTF-8')
    expect(vmxGet(vmx, 'displayName')).toBe('RHEL 7.1 UEFI')
    expect(vmx.values.get('memsize')).toBe('2048')
    expect(vmxGet(vmx, 'scsi0.virtualDev')).toBe('pvscsi')
    expect(vmxGet(vmx, 'replay.filename')).toBe('')
    expect(vmxGet(vmx, 'uuid.bios')).toBe('56 4d 99 89 a7 21 91 0d-cc 28 e2 db d5 4b 2b 8c')
    expect(vmx.values.size).toBe(91) // 91 lines, 91 distinct keys
  })

  test('corpus test-i-vmx-5.vmx: backslash values stay literal', () => {
    const vmx = parseVmx(readFileSync(path.join(CORPUS, 'virt-v2v/test-i-vmx-5.vmx')), 'test-i-vmx-5.vmx')
    expect(vmxGet(vmx, 'migrate.hostlog')).toBe('.\\MSEdge - Win10_preview-aee69569.hlog')
    expect(vmxGet(vmx, 'MEMSIZE')).toBe('2048')
  })

  test('escapes, comments, unquoted values, duplicates, case', () => {
    const vmx = vmxOf([
      '# a comment',
      '  ',
      'annotation = "say |22hi|22 |7C pipe |23 hash|0Anext |zz |C3|A9"',
      'Foo.Bar = "1"',
      'foo.bar = "2"   # trailing comment',
      'unquoted = some value # comment',
      'empty = ""',
      'path.x = "C:\\VMs\\x.vmdk"',
    ])
    expect(vmxGet(vmx, 'annotation')).toBe('say "hi" | pipe # hash\nnext |zz é')
    expect(vmxGet(vmx, 'FOO.BAR')).toBe('2')
    expect(vmxGet(vmx, 'unquoted')).toBe('some value')
    expect(vmxGet(vmx, 'empty')).toBe('')
    expect(vmxGet(vmx, 'path.x')).toBe('C:\\VMs\\x.vmdk')
  })

  test('.encoding windows-1252 bytes are decoded', () => {
    const bytes = Buffer.concat([Buffer.from('.encoding = "windows-1252"\ndisplayName = "caf'), Buffer.from([0xe9]), Buffer.from('"\n')])
    const vmx = parseVmx(bytes, 'cp.vmx')
    expect(vmx.encoding).toBe('windows-1252')
    expect(vmxGet(vmx, 'displayName')).toBe('café')
  })

  test('__proto__ keys are data and 100k junk lines parse fast', () => {
    const lines = ['__proto__.present = "TRUE"', 'constructor.prototype.polluted = "yes"', '__proto__ = "x"']
    for (let i = 0; i < 100000; i++) lines.push(`junk${i}.key = "v${i}"`)
    const started = Date.now()
    const vmx = vmxOf(lines)
    expect(Date.now() - started).toBeLessThan(2000)
    expect(vmx.values.get('__proto__.present')).toBe('TRUE')
    expect(vmx.values.get('__proto__')).toBe('x')
    expect(vmx.values.size).toBe(100003)
    expect(({} as Record<string, unknown>).polluted).toBeUndefined()
    expect(({} as Record<string, unknown>).present).toBeUndefined()
  })

  test('malformed VMX lines and sizes', () => {
    const cases = ['no equals sign here', 'key = "unterminated', '= "no key"', 'key = "v" trailing', 'bad key = "v"', 'a = "b"\0', 'x'.repeat(5 * MiB)]
    for (const text of cases) {
      expectMig(
        caught(() => parseVmx(text, 'bad.vmx')),
        'E_MIG_MALFORMED_ARCHIVE',
      )
    }
  })
})

describe('vmxToManifest', () => {
  test('corpus test-i-vmx-3.vmx: RHEL, efi, pvscsi disk, vmxnet3 NIC, CD-ROM skipped', async () => {
    const vmx = parseVmx(readFileSync(path.join(CORPUS, 'virt-v2v/test-i-vmx-3.vmx')), 'test-i-vmx-3.vmx')
    const r = recorder()
    const m = await vmxToManifest(vmx, { resolveDisk: r.resolveDisk, fallbackName: 'test-i-vmx-3' })
    expect(VmManifest.parse(m)).toEqual(m)
    expect(m.name).toBe('RHEL 7.1 UEFI')
    expect(m.source_format).toBe('vmx_folder')
    expect(m.guest_os).toEqual({ family: 'linux', id: 'rhel6-64' })
    expect(m.firmware).toBe('efi')
    expect(m.secure_boot).toBe(false)
    expect(m.cpu).toEqual({ count: 1, cores_per_socket: 1 })
    expect(m.memory_bytes).toBe(2048 * MiB)
    expect(r.calls).toEqual([['RHEL-7.1-UEFI.vmdk', 'scsi', 'scsi0:0', 'scsi0:0.fileName']])
    expect(m.disks.map((d) => [d.label, d.controller, d.address])).toEqual([['RHEL-7.1-UEFI', 'scsi', 'scsi0:0']])
    expect(m.nics).toEqual([{ label: 'ethernet0', mac: '00:0c:29:4b:2b:8c', model: 'vmxnet3', network: 'VM Network', pci_slot: 192 }])
    expect(m.cbt_available).toBe(false)
    expect(m.warnings.some((w) => w.includes('pvscsi'))).toBe(true)
  })

  test('corpus test-i-vmx-5.vmx: Windows, lsisas1068, e1000e, lower-case memsize', async () => {
    const vmx = parseVmx(readFileSync(path.join(CORPUS, 'virt-v2v/test-i-vmx-5.vmx')), 'test-i-vmx-5.vmx')
    const r = recorder()
    const m = await vmxToManifest(vmx, { resolveDisk: r.resolveDisk, fallbackName: 'x' })
    expect(m.name).toBe('MSEdge - Win10_preview')
    expect(m.guest_os).toEqual({ family: 'windows', id: 'windows9-64' })
    expect(m.firmware).toBe('bios')
    expect(m.memory_bytes).toBe(2048 * MiB)
    expect(m.cpu).toEqual({ count: 1, cores_per_socket: 1 })
    expect(r.calls).toEqual([['MSEdge-Win10_preview.vmdk', 'scsi', 'scsi0:0', 'scsi0:0.fileName']])
    expect(m.nics).toEqual([{ label: 'ethernet0', mac: '00:0c:29:bf:e4:5d', model: 'e1000e', network: null, pci_slot: 192 }])
    expect(m.warnings.some((w) => w.includes('lsisas1068'))).toBe(true)
    const hw = vmxHardware(vmx)
    expect(hw.controllers).toEqual([{ bus: 'scsi', index: 0, model: 'lsisas1068', present: true }])
  })

  test('disk selection and order, controller not present, NIC variants, secure boot, vCPUs', async () => {
    const vmx = vmxOf([
      'displayName = ""',
      'numvcpus = "8"',
      'cpuid.coresPerSocket = "4"',
      'memsize = "4096"',
      'firmware = "efi"',
      'uefi.secureBoot.enabled = "TRUE"',
      'guestOS = "windows2019srv-64"',
      'ide0:0.present = "TRUE"',
      'ide0:0.fileName = "ide.vmdk"',
      'ide1:0.present = "TRUE"',
      'ide1:0.deviceType = "atapi-cdrom"',
      'ide1:0.fileName = "auto detect"',
      'sata0.present = "TRUE"',
      'sata0:1.present = "TRUE"',
      'sata0:1.fileName = "sata1.vmdk"',
      'sata0:0.present = "TRUE"',
      'sata0:0.deviceType = "cdrom-image"',
      'sata0:0.fileName = "install.iso"',
      'scsi1.present = "TRUE"',
      'scsi1.virtualDev = "lsilogic"',
      'scsi1:2.present = "TRUE"',
      'scsi1:2.fileName = "s12.vmdk"',
      'scsi0.present = "TRUE"',
      'scsi0.virtualDev = "buslogic"',
      'scsi0:1.present = "TRUE"',
      'scsi0:1.fileName = "s01.vmdk"',
      'scsi0:1.deviceType = "scsi-hardDisk"',
      'scsi0:0.present = "TRUE"',
      'scsi0:0.fileName = "s00.vmdk"',
      'scsi0:3.present = "FALSE"',
      'scsi0:3.fileName = "off.vmdk"',
      'scsi2.present = "FALSE"',
      'scsi2:0.present = "TRUE"',
      'scsi2:0.fileName = "dropped.vmdk"',
      'nvme0.present = "TRUE"',
      'nvme0:0.present = "TRUE"',
      'nvme0:0.fileName = "nv.vmdk"',
      'ethernet1.present = "TRUE"',
      'ethernet1.addressType = "static"',
      'ethernet1.address = "00:50:56:AA:BB:CC"',
      'ethernet1.generatedAddress = "00:0c:29:00:00:01"',
      'ethernet1.pciSlotNumber = "-1"',
      'ethernet0.present = "TRUE"',
      'ethernet0.pciSlotNumber = "224"',
      'ethernet0.addressType = "vpx"',
      'ethernet0.generatedAddress = "00:50:56:01:02:03"',
      'ethernet0.networkName = "Prod"',
      'ethernet2.present = "FALSE"',
      'ethernet3.present = "TRUE"',
      'ethernet3.virtualDev = "vlance"',
      'ethernet3.generatedAddress = "not-a-mac"',
      'ethernet3.pciSlotNumber = "1e3"',
    ])
    const r = recorder()
    const m = await vmxToManifest(vmx, { resolveDisk: r.resolveDisk, fallbackName: 'fallback' })
    expect(m.name).toBe('fallback')
    expect(m.cpu).toEqual({ count: 8, cores_per_socket: 4 })
    expect(m.memory_bytes).toBe(4096 * MiB)
    expect(m.firmware).toBe('efi')
    expect(m.secure_boot).toBe(true)
    expect(m.guest_os.family).toBe('windows')
    expect(r.calls.map((c) => c[2])).toEqual(['scsi0:0', 'scsi0:1', 'scsi1:2', 'sata0:1', 'nvme0:0', 'ide0:0'])
    expect(m.disks.map((d) => d.controller)).toEqual(['scsi', 'scsi', 'scsi', 'sata', 'nvme', 'ide'])
    expect(m.warnings.some((w) => w.includes('dropped.vmdk'))).toBe(true)
    expect(m.nics).toEqual([
      { label: 'ethernet0', mac: '00:50:56:01:02:03', model: 'e1000', network: 'Prod', pci_slot: 224 },
      { label: 'ethernet1', mac: '00:50:56:aa:bb:cc', model: 'e1000', network: null },
      { label: 'ethernet3', mac: null, model: 'vlance', network: null },
    ])
    expect(m.warnings.some((w) => w.includes('not-a-mac'))).toBe(true)
    expect(VmManifest.parse(m)).toEqual(m)
  })

  test('defaults: no memsize (2 GiB warned), bad coresPerSocket reset, no disks', async () => {
    const m = await vmxToManifest(vmxOf(['numvcpus = "3"', 'cpuid.coresPerSocket = "2"']), { ...recorder(), fallbackName: 'vm' })
    expect(m.memory_bytes).toBe(2048 * MiB)
    expect(m.cpu).toEqual({ count: 3, cores_per_socket: 1 })
    expect(m.firmware).toBe('bios')
    expect(m.guest_os).toEqual({ family: 'unknown', id: null })
    expect(m.disks).toEqual([])
    expect(m.warnings.length).toBe(3)
  })

  test('encrypted VMX, bad numbers and raw disks are refused', async () => {
    const enc = await thrown(() =>
      vmxToManifest(vmxOf(['encryption.keySafe = "vmware:key/list/(pair/(null/vmware-null/...))"', 'encryption.data = "abc"']), {
        ...recorder(),
        fallbackName: 'e',
      }),
    )
    expectMig(enc, 'E_MIG_UNSUPPORTED_FORMAT')
    expect(enc.message).toContain('encrypted VM: decrypt it in VMware first')
    expectMig(await thrown(() => vmxToManifest(vmxOf(['encryption.data = "x"']), { ...recorder(), fallbackName: 'e' })), 'E_MIG_UNSUPPORTED_FORMAT')
    expectMig(await thrown(() => vmxToManifest(vmxOf(['memsize = "lots"']), { ...recorder(), fallbackName: 'e' })), 'E_MIG_MALFORMED_ARCHIVE')
    expectMig(await thrown(() => vmxToManifest(vmxOf(['numvcpus = "0"']), { ...recorder(), fallbackName: 'e' })), 'E_MIG_MALFORMED_ARCHIVE')
    expectMig(await thrown(() => vmxToManifest(vmxOf(['memsize = "99999999999"']), { ...recorder(), fallbackName: 'e' })), 'E_MIG_MALFORMED_ARCHIVE')
    const raw = vmxOf(['scsi0.present = "TRUE"', 'scsi0:0.present = "TRUE"', 'scsi0:0.deviceType = "rawDisk"', 'scsi0:0.fileName = "phys.vmdk"'])
    expectMig(await thrown(() => vmxToManifest(raw, { ...recorder(), fallbackName: 'r' })), 'E_MIG_UNSUPPORTED_FORMAT')
  })
})
