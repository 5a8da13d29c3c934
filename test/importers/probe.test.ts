/**
 * probeFile (magic bytes, qemu-img fallback) and detectKind (importer kind of an unlabelled file
 * or folder), on corpus files and inputs built here with qemu-img and tar.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { gunzipSync } from 'node:zlib'
import type { MigError } from '../../lib/errors.ts'
import { detectKind, probeFile } from '../../lib/importers/probe.ts'
import { probeMagic } from '../../lib/formats/sniff.ts'
import { CORPUS, tempDir } from '../helpers/tmp.ts'
import { expectMigThrown } from '../helpers/mig-error.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-probe-')
const ROOT = tmp.dir
const ctx = { importRoot: ROOT }
const p = (...parts: string[]): string => path.join(ROOT, ...parts)
const run = (cmd: string, args: string[], cwd = ROOT): void => {
  execFileSync(cmd, args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] })
}

async function unsupported(target: string): Promise<MigError> {
  const err = await expectMigThrown(() => detectKind(target, ctx), 'E_MIG_UNSUPPORTED_FORMAT')
  return err
}

beforeAll(() => {
  writeFileSync(p('fixed.vhdx'), gunzipSync(readFileSync(path.join(CORPUS, 'dissect.hypervisor/fixed.vhdx.gz'))))
  writeFileSync(p('fixed.vhd'), gunzipSync(readFileSync(path.join(CORPUS, 'dissect.hypervisor/fixed.vhd.gz'))))
  run('qemu-img', ['create', '-q', '-f', 'qcow2', 'gen.qcow2', '8M'])
  run('qemu-img', ['create', '-q', '-f', 'vhdx', 'gen.vhdx', '8M'])
  run('qemu-img', ['create', '-q', '-f', 'vpc', 'gen.vhd', '8M'])
  run('qemu-img', ['create', '-q', '-f', 'vdi', 'gen.vdi', '8M'])
  run('qemu-img', ['create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicFlat', 'flat.vmdk', '1M'])
  run('truncate', ['-s', '1M', 'zeros.raw'])
  writeFileSync(p('cowd.vmdk'), Buffer.concat([Buffer.from('COWD', 'latin1'), Buffer.alloc(2044)]))

  // OVA: a tar holding an .ovf, XVA: a tar whose first member is ova.xml (and more than 8 members).
  mkdirSync(p('ova-src'))
  writeFileSync(p('ova-src', 'vm.ovf'), '<?xml version="1.0"?><Envelope/>')
  copyFileSync(path.join(CORPUS, 'vagrant-mutate/virtualbox-box-disk1.vmdk'), p('ova-src', 'vm-disk1.vmdk'))
  run('tar', ['-cf', '../appliance.ova', 'vm.ovf', 'vm-disk1.vmdk'], p('ova-src'))
  mkdirSync(p('xva-src', 'Ref:5'), { recursive: true })
  writeFileSync(p('xva-src', 'ova.xml'), '<value><struct></struct></value>')
  const blocks: string[] = []
  for (let i = 0; i < 10; i++) {
    const n = String(i).padStart(8, '0')
    writeFileSync(p('xva-src', 'Ref:5', n), Buffer.alloc(512, i))
    blocks.push(`Ref:5/${n}`)
  }
  run('tar', ['-cf', '../export.xva', 'ova.xml', ...blocks], p('xva-src'))
  run('tar', ['-cf', '../plain.tar', 'Ref:5/00000000', 'ova.xml'], p('xva-src'))

  // Folders of each kind, and one without a descriptor.
  for (const [dir, file] of [
    ['ovf-dir', 'vm.OVF'],
    ['vmx-dir', 'vm.vmx'],
    ['vbox-dir', 'vm.vbox'],
    ['empty-dir', 'notes.txt'],
  ] as const) {
    mkdirSync(p(dir))
    writeFileSync(p(dir, file), 'x')
  }
  mkdirSync(p('hyperv-export', 'Virtual Machines'), { recursive: true })
  mkdirSync(p('hyperv-export', 'Virtual Hard Disks'), { recursive: true })
  copyFileSync(path.join(CORPUS, 'dissect.hypervisor/test.vmcx'), p('hyperv-export', 'Virtual Machines', '5B0E7D1A-1111-2222-3333-444455556666.vmcx'))
})

afterAll(() => tmp.cleanup())

describe('probeFile', () => {
  test('disk images by magic bytes', async () => {
    const kvm = await probeFile(path.join(CORPUS, 'vagrant-mutate/kvm-box-disk1.qcow2'))
    expect(kvm).toEqual({ format: 'qcow2', disk_format: 'qcow2', version: 3, description: 'qcow2 v3 image', source: 'magic', size: 197120 })
    expect(await probeFile(p('fixed.vhdx'))).toMatchObject({ format: 'vhdx', disk_format: 'vhdx', source: 'magic', size: 14 * MiB })
    expect(await probeFile(p('fixed.vhd'))).toMatchObject({ format: 'vhd', disk_format: 'vpc', source: 'magic', size: 10 * MiB + 512 })
    expect(await probeFile(p('gen.vhd'))).toMatchObject({ format: 'vhd', disk_format: 'vpc' })
    expect(await probeFile(p('gen.vdi'))).toMatchObject({ format: 'vdi', disk_format: 'vdi' })
    expect(await probeFile(path.join(CORPUS, 'vagrant-mutate/virtualbox-box-disk1.vmdk'))).toMatchObject({
      format: 'vmdk_sparse',
      disk_format: 'vmdk',
      size: 68096,
    })
    expect(await probeFile(p('flat.vmdk'))).toMatchObject({ format: 'vmdk_descriptor', disk_format: 'vmdk' })
    expect(await probeFile(p('cowd.vmdk'))).toMatchObject({ format: 'vmdk_cowd', disk_format: 'vmdk' })
  })

  test('legacy qcow v1 is flagged, not reported as qcow2', async () => {
    const r = await probeFile(path.join(CORPUS, 'containerized-data-importer/invalid-qcow-large-size.img'))
    expect(r).toEqual({ format: 'qcow', disk_format: null, version: 1, description: 'legacy qcow v1 image', source: 'magic', size: 516 })
  })

  test('containers, compressed streams, XML and other files', async () => {
    expect(await probeFile(p('appliance.ova'))).toMatchObject({ format: 'tar', disk_format: null })
    expect(await probeFile(path.join(CORPUS, 'vagrant-mutate/virtualbox-mutate-test.box'))).toMatchObject({ format: 'gzip', size: 3667 })
    expect(await probeFile(path.join(CORPUS, 'virt-v2v/test-i-ova.ovf'))).toMatchObject({ format: 'xml', disk_format: null })
    expect(await probeFile(path.join(CORPUS, 'glance/testserver-not-tar.ova'))).toEqual({
      format: 'unknown',
      disk_format: null,
      description: 'PNG image',
      source: 'magic',
      size: 164385,
    })
  })

  test('qemu-img fallback: data without a known magic is raw', async () => {
    expect(await probeFile(p('zeros.raw'))).toEqual({
      format: 'raw',
      disk_format: 'raw',
      description: 'raw data (no known image format)',
      source: 'qemu-img',
      size: MiB,
    })
  })

  test('probeMagic: 511-byte VHD footer, empty file, BOM before a VMDK descriptor', () => {
    const tail = Buffer.concat([Buffer.alloc(1), Buffer.from('conectix', 'latin1'), Buffer.alloc(503)])
    expect(probeMagic(Buffer.alloc(64), tail, 4096)?.format).toBe('vhd')
    expect(probeMagic(Buffer.alloc(0), Buffer.alloc(0), 0)).toMatchObject({ format: 'unknown', description: 'empty file' })
    const desc = Buffer.from('\xef\xbb\xbf\n# Disk DescriptorFile\nversion=1\n', 'latin1')
    expect(probeMagic(desc, desc, desc.length)?.format).toBe('vmdk_descriptor')
    expect(probeMagic(Buffer.from('random bytes'), Buffer.from('random bytes'), 12)).toBeNull()
  })

  test('an unreadable path is E_MIG_DISK_READ_FAILED', async () => {
    await expectMigThrown(() => probeFile(p('missing.img')), 'E_MIG_DISK_READ_FAILED')
  })
})

describe('detectKind', () => {
  test('folders by descriptor', async () => {
    expect(await detectKind(p('ovf-dir'), ctx)).toBe('ovf_folder')
    expect(await detectKind(p('vmx-dir'), ctx)).toBe('vmx_folder')
    expect(await detectKind(p('vbox-dir'), ctx)).toBe('vbox_folder')
    expect(await detectKind(p('hyperv-export'), ctx)).toBe('vmcx_export')
  })

  test('descriptor files give their folder kind', async () => {
    expect(await detectKind(p('ova-src', 'vm.ovf'), ctx)).toBe('ovf_folder')
    expect(await detectKind(p('vmx-dir', 'vm.vmx'), ctx)).toBe('vmx_folder')
    expect(await detectKind(p('vbox-dir', 'vm.vbox'), ctx)).toBe('vbox_folder')
  })

  test('tar archives: .ovf member -> ova_archive, ova.xml first -> xva_archive (also past 8 members)', async () => {
    expect(await detectKind(p('appliance.ova'), ctx)).toBe('ova_archive')
    expect(await detectKind(p('export.xva'), ctx)).toBe('xva_archive')
    const err = await unsupported(p('plain.tar'))
    expect(err.message).toContain('neither an .ovf descriptor nor ova.xml')
  })

  test('disk images', async () => {
    expect(await detectKind(path.join(CORPUS, 'vagrant-mutate/kvm-box-disk1.qcow2'), ctx)).toBe('qcow2')
    expect(await detectKind(p('gen.qcow2'), ctx)).toBe('qcow2')
    expect(await detectKind(p('fixed.vhdx'), ctx)).toBe('vhdx')
    expect(await detectKind(p('fixed.vhd'), ctx)).toBe('vhdx')
    expect(await detectKind(p('gen.vhd'), ctx)).toBe('vhdx')
    expect(await detectKind(path.join(CORPUS, 'vagrant-mutate/virtualbox-box-disk1.vmdk'), ctx)).toBe('vmdk')
    expect(await detectKind(p('flat.vmdk'), ctx)).toBe('vmdk')
  })

  test('gzip-compressed box: decompress it first', async () => {
    const f = path.join(CORPUS, 'vagrant-mutate/virtualbox-mutate-test.box')
    const err = await unsupported(f)
    expect(err.message).toBe(`${f}: gzip-compressed archive: decompress it first`)
  })

  test('unsupported inputs name what was seen', async () => {
    expect((await unsupported(path.join(CORPUS, 'glance/testserver-not-tar.ova'))).message).toContain('PNG image')
    expect((await unsupported(p('gen.vdi'))).message).toContain('VDI')
    expect((await unsupported(p('zeros.raw'))).message).toContain('raw data')
    expect((await unsupported(path.join(CORPUS, 'containerized-data-importer/invalid-qcow-large-size.img'))).message).toContain('qcow v1')
    expect((await unsupported(p('empty-dir'))).message).toContain('no .ovf, .vmx or .vbox')
  })

  test('a missing path is E_MIG_NOT_FOUND', async () => {
    await expectMigThrown(() => detectKind(p('nothing-here'), ctx), 'E_MIG_NOT_FOUND')
  })
})
