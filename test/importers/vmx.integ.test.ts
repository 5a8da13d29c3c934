/**
 * vmx_folder and vmdk importer tests: corpus VMX files copied into a temporary import root with
 * real disks made by qemu-img (sparse, flat, split, snapshot chains), and hostile folders.
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { VmManifest } from '../../lib/manifest.ts'
import { importer as vmxImporter } from '../../lib/importers/vmx-folder.ts'
import { importer as vmdkImporter } from '../../lib/importers/vmdk.ts'
import { inspectInput } from '../../lib/importers/index.ts'
import { importRootFor, qemuImg } from '../helpers/import-root.ts'
import { expectMig } from '../helpers/mig-error.ts'
import { CORPUS, thrown } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const VMX3 = path.join(CORPUS, 'virt-v2v/test-i-vmx-3.vmx')
const VMX5 = path.join(CORPUS, 'virt-v2v/test-i-vmx-5.vmx')

const { root, ctx } = importRootFor('mig-vmx-')

/** A folder under the root with the corpus VMX copied in (optionally rewritten). */
function vmFolder(name: string, vmx: string, edit: (t: string) => string = (t) => t): string {
  const dir = path.join(root, name)
  mkdirSync(dir, { recursive: true })
  writeFileSync(path.join(dir, path.basename(vmx)), edit(readFileSync(vmx, 'utf8')))
  return dir
}

describe('vmx_folder importer', () => {
  test('test-i-vmx-3 with a monolithicSparse disk (folder and .vmx path)', async () => {
    const dir = vmFolder('rhel', VMX3)
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', 'RHEL-7.1-UEFI.vmdk', '16M')
    const m = await vmxImporter.inspect(dir, ctx())
    expect(VmManifest.parse(m)).toEqual(m)
    expect(m.name).toBe('RHEL 7.1 UEFI')
    expect(m.source_format).toBe('vmx_folder')
    expect(m.firmware).toBe('efi')
    expect(m.guest_os).toEqual({ family: 'linux', id: 'rhel6-64' })
    expect(m.memory_bytes).toBe(2048 * MiB)
    expect(m.disks).toEqual([
      {
        label: 'RHEL-7.1-UEFI',
        capacity_bytes: 16 * MiB,
        allocated_bytes: 65536,
        disk_format: 'vmdk',
        source: { path: path.join(dir, 'RHEL-7.1-UEFI.vmdk') },
        controller: 'scsi',
        address: 'scsi0:0',
      },
    ])
    expect(m.nics).toEqual([{ label: 'ethernet0', mac: '00:0c:29:4b:2b:8c', model: 'vmxnet3', network: 'VM Network', pci_slot: 192 }])
    const again = await vmxImporter.inspect(path.join(dir, 'test-i-vmx-3.vmx'), ctx())
    expect(again).toEqual(m)
    const viaIndex = await inspectInput(dir, ctx(), 'vmx_folder')
    expect(viaIndex).toEqual({ detected_kind: 'vmx_folder', manifest: m })
  })

  test('test-i-vmx-5 with a monolithicFlat disk reads raw from the flat extent', async () => {
    const dir = vmFolder('edge', VMX5)
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicFlat', 'MSEdge-Win10_preview.vmdk', '8M')
    const m = await vmxImporter.inspect(dir, ctx())
    expect(m.name).toBe('MSEdge - Win10_preview')
    expect(m.guest_os.family).toBe('windows')
    expect(m.disks).toEqual([
      {
        label: 'MSEdge-Win10_preview',
        capacity_bytes: 8 * MiB,
        allocated_bytes: 8 * MiB,
        disk_format: 'raw',
        source: { path: path.join(dir, 'MSEdge-Win10_preview-flat.vmdk'), offset: 0, length: 8 * MiB },
        controller: 'scsi',
        address: 'scsi0:0',
      },
    ])
    expect(m.nics[0]).toEqual({ label: 'ethernet0', mac: '00:0c:29:bf:e4:5d', model: 'e1000e', network: null, pci_slot: 192 })
  })

  test('split sparse and split flat disks, and a snapshot chain', async () => {
    const dir = vmFolder('split', VMX5, (t) =>
      t.replace(
        'scsi0:0.fileName = "MSEdge-Win10_preview.vmdk"',
        [
          'scsi0:0.fileName = "a.vmdk"',
          'scsi0:1.present = "TRUE"',
          'scsi0:1.fileName = "b.vmdk"',
          'sata0.present = "TRUE"',
          'sata0:0.present = "TRUE"',
          'sata0:0.fileName = "c-000001.vmdk"',
        ].join('\n'),
      ),
    )
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', '-o', 'subformat=twoGbMaxExtentSparse', 'a.vmdk', '4M')
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', '-o', 'subformat=twoGbMaxExtentFlat', 'b.vmdk', '2M')
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', 'c.vmdk', '6M')
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', '-b', 'c.vmdk', '-F', 'vmdk', 'c-000001.vmdk')
    const m = await vmxImporter.inspect(dir, ctx())
    expect(m.disks.map((d) => [d.label, d.address, d.controller, d.capacity_bytes, d.disk_format])).toEqual([
      ['a', 'scsi0:0', 'scsi', 4 * MiB, 'vmdk'],
      ['b', 'scsi0:1', 'scsi', 2 * MiB, 'raw'],
      ['c-000001', 'sata0:0', 'sata', 6 * MiB, 'vmdk'],
    ])
    expect(m.disks[0].source).toEqual({ path: path.join(dir, 'a.vmdk') })
    expect(m.disks[1].source).toEqual({ path: path.join(dir, 'b-f001.vmdk'), offset: 0, length: 2 * MiB })
    expect(m.disks[2].backing_chain).toEqual([path.join(dir, 'c.vmdk')])
    expect(VmManifest.parse(m)).toEqual(m)
  })

  test('folder with several .vmx or none is malformed', async () => {
    const dir = vmFolder('two', VMX3)
    copyFileSync(VMX5, path.join(dir, 'other.vmx'))
    const err = await thrown(() => vmxImporter.inspect(dir, ctx()))
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('other.vmx')
    expect(err.message).toContain('test-i-vmx-3.vmx')
    mkdirSync(path.join(root, 'empty'))
    expectMig(await thrown(() => vmxImporter.inspect(path.join(root, 'empty'), ctx())), 'E_MIG_MALFORMED_ARCHIVE')
  })

  test('missing disk names the VMX key and file', async () => {
    const dir = vmFolder('nodisk', VMX3)
    const err = await thrown(() => vmxImporter.inspect(dir, ctx()))
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('scsi0:0.fileName')
    expect(err.message).toContain('RHEL-7.1-UEFI.vmdk')
  })

  test('disks and extents outside the root are rejected', async () => {
    const a = vmFolder('esc1', VMX3, (t) => t.replace('"RHEL-7.1-UEFI.vmdk"', '"../../../../../../etc/passwd"'))
    expectMig(await thrown(() => vmxImporter.inspect(a, ctx())), 'E_MIG_HOST_PATH_REJECTED')
    const b = vmFolder('esc2', VMX3)
    writeFileSync(
      path.join(b, 'RHEL-7.1-UEFI.vmdk'),
      '# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType="monolithicFlat"\nRW 8 FLAT "/etc/passwd" 0\n',
    )
    expectMig(await thrown(() => vmxImporter.inspect(b, ctx())), 'E_MIG_HOST_PATH_REJECTED')
    const c = vmFolder('esc3', VMX3)
    writeFileSync(
      path.join(c, 'RHEL-7.1-UEFI.vmdk'),
      '# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType="monolithicFlat"\nRW 8 FLAT "../../../../../../../etc/passwd" 0\n',
    )
    expectMig(await thrown(() => vmxImporter.inspect(c, ctx())), 'E_MIG_HOST_PATH_REJECTED')
    const d = vmFolder('esc4', VMX3)
    symlinkSync('/etc/hostname', path.join(d, 'RHEL-7.1-UEFI-flat.vmdk'))
    writeFileSync(
      path.join(d, 'RHEL-7.1-UEFI.vmdk'),
      '# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType="monolithicFlat"\nRW 1 FLAT "RHEL-7.1-UEFI-flat.vmdk" 0\n',
    )
    expectMig(await thrown(() => vmxImporter.inspect(d, ctx())), 'E_MIG_HOST_PATH_REJECTED')
    const e = vmFolder('esc5', VMX3)
    symlinkSync('/etc', path.join(e, 'RHEL-7.1-UEFI.vmdk'))
    expectMig(await thrown(() => vmxImporter.inspect(e, ctx())), 'E_MIG_HOST_PATH_REJECTED')
  })

  test('flat extent shorter than declared is malformed', async () => {
    const dir = vmFolder('short', VMX3)
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicFlat', 'RHEL-7.1-UEFI.vmdk', '8M')
    execFileSync('truncate', ['-s', '4M', path.join(dir, 'RHEL-7.1-UEFI-flat.vmdk')])
    const err = await thrown(() => vmxImporter.inspect(dir, ctx()))
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('RHEL-7.1-UEFI-flat.vmdk')
  })

  test('encrypted VMX is refused', async () => {
    const dir = vmFolder('enc', VMX3, (t) => t + 'encryption.keySafe = "vmware:key/list/(pair/(null/vmware-null/...))"\nencryption.data = "AAAA"\n')
    const err = await thrown(() => vmxImporter.inspect(dir, ctx()))
    expectMig(err, 'E_MIG_UNSUPPORTED_FORMAT')
    expect(err.message).toContain('encrypted VM: decrypt it in VMware first')
  })

  test('VMX with __proto__ keys and 100k junk lines', async () => {
    const junk: string[] = ['__proto__.present = "TRUE"', '__proto__.fileName = "x.vmdk"', 'constructor.prototype.x = "y"']
    for (let i = 0; i < 100000; i++) junk.push(`junk${i}.k = "${i}"`)
    const dir = vmFolder('junk', VMX3, (t) => t + junk.join('\n') + '\n')
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', 'RHEL-7.1-UEFI.vmdk', '1M')
    const started = Date.now()
    const m = await vmxImporter.inspect(dir, ctx())
    expect(Date.now() - started).toBeLessThan(3000)
    expect(m.disks.length).toBe(1)
    expect(({} as Record<string, unknown>).present).toBeUndefined()
    expect(({} as Record<string, unknown>).x).toBeUndefined()
  })

  test('VMX larger than 4 MiB is malformed', async () => {
    const dir = vmFolder('huge', VMX3, (t) => t + `# ${'x'.repeat(5 * MiB)}\n`)
    expectMig(await thrown(() => vmxImporter.inspect(dir, ctx())), 'E_MIG_MALFORMED_ARCHIVE')
  })
})

describe('vmdk importer', () => {
  test('corpus VirtualBox streamOptimized disk: one IDE disk, defaults warned', async () => {
    const corpusRoot = path.join(CORPUS, 'vagrant-mutate')
    const m = await vmdkImporter.inspect(path.join(corpusRoot, 'virtualbox-box-disk1.vmdk'), { importRoot: corpusRoot })
    expect(VmManifest.parse(m)).toEqual(m)
    expect(m.name).toBe('virtualbox-box-disk1')
    expect(m.source_format).toBe('vmdk')
    expect(m.firmware).toBe('bios')
    expect(m.cpu).toEqual({ count: 1, cores_per_socket: 1 })
    expect(m.memory_bytes).toBe(2048 * MiB)
    expect(m.disks).toEqual([
      {
        label: 'virtualbox-box-disk1',
        capacity_bytes: 4 * MiB,
        allocated_bytes: 68096,
        disk_format: 'vmdk',
        source: { path: path.join(corpusRoot, 'virtualbox-box-disk1.vmdk') },
        controller: 'ide',
        address: 'ide0:0',
      },
    ])
    expect(m.nics).toEqual([])
    expect(m.cbt_available).toBe(false)
    expect(m.warnings[0]).toContain('defaults')
  })

  test('lsilogic descriptor -> scsi; snapshot child keeps its chain', async () => {
    const dir = path.join(root, 'lone')
    mkdirSync(dir)
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', '-o', 'adapter_type=lsilogic,subformat=monolithicFlat', 'srv.vmdk', '3M')
    const m = await vmdkImporter.inspect(path.join(dir, 'srv.vmdk'), ctx())
    expect(m.disks[0]).toEqual({
      label: 'srv',
      capacity_bytes: 3 * MiB,
      allocated_bytes: 3 * MiB,
      disk_format: 'raw',
      source: { path: path.join(dir, 'srv-flat.vmdk'), offset: 0, length: 3 * MiB },
      controller: 'scsi',
      address: 'scsi0:0',
    })
    qemuImg(dir, 'create', '-q', '-f', 'vmdk', '-b', 'srv.vmdk', '-F', 'vmdk', 'srv-000001.vmdk')
    const c = await vmdkImporter.inspect(path.join(dir, 'srv-000001.vmdk'), ctx())
    expect(c.disks[0].backing_chain).toEqual([path.join(dir, 'srv.vmdk')])
    expect(c.disks[0].disk_format).toBe('vmdk')
    expect(c.disks[0].capacity_bytes).toBe(3 * MiB)
  })

  test('not a VMDK is unsupported', async () => {
    writeFileSync(path.join(root, 'fake.vmdk'), 'hello world, not a disk\n')
    expectMig(await thrown(() => vmdkImporter.inspect(path.join(root, 'fake.vmdk'), ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
  })
})
