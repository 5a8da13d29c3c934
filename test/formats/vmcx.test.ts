/**
 * Hyper-V `.vmcx` reader and `vmcx_export` importer: the dissect.hypervisor corpus file
 * (test.vmcx, values read by hand with an independent dump), a generated export folder (the
 * corpus VMCX copied into a temp `Virtual Machines/` beside a qemu-made `.vhdx`), and damaged
 * files (truncated, randomly mutated, checksum failures, wrong version).
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { VmManifest } from '../../lib/manifest.ts'
import { crc32, isVmcxNode, parseVmcx, vmcxGet, type VmcxNode } from '../../lib/formats/vmcx-container.ts'
import { vmcxDevices, vmcxVmInfo } from '../../lib/formats/vmcx.ts'
import { importer } from '../../lib/importers/vmcx-export.ts'
import { importRootFor } from '../helpers/import-root.ts'
import { CORPUS, thrown } from '../helpers/tmp.ts'
import { expectMig } from '../helpers/mig-error.ts'

const MiB = 1024 * 1024
const VMCX = path.join(CORPUS, 'dissect.hypervisor/test.vmcx')
const BYTES = readFileSync(VMCX)
const VHDX_PATH = 'C:\\Users\\Public\\Documents\\Hyper-V\\Virtual Hard Disks\\Other Location.vhdx'

const { root, ctx } = importRootFor('mig-vmcx-')

function parseErr(buf: Buffer): unknown {
  try {
    parseVmcx(buf, 't.vmcx')
  } catch (e) {
    return e
  }
  return undefined
}

describe('parseVmcx on the corpus (test.vmcx, Gen 1)', () => {
  const cfg = parseVmcx(BYTES, 'test.vmcx')

  test('storage header, key tables, tree shape (as dissect.hypervisor counts them)', () => {
    expect(cfg.formatVersion).toBe(0x400)
    expect(cfg.sequence).toBe(25) // header 1 (0x19) beats header 2 (0x18)
    expect(cfg.alignment).toBe(0x1000)
    expect(cfg.dirty).toBe(false)
    expect(cfg.keyTables).toBe(8)
    expect(cfg.warnings).toEqual([])
    expect([...cfg.root.keys()]).toEqual(['configuration'])
    const conf = cfg.root.get('configuration') as VmcxNode
    expect(conf.size).toBe(27)
    expect((conf.get('manifest') as VmcxNode).size).toBe(39)
    expect((conf.get('properties') as VmcxNode).size).toBe(11)
    expect((conf.get('settings') as VmcxNode).size).toBe(6)
  })

  test('typed values: strings, ints, bools, byte arrays, nested nodes', () => {
    const r = cfg.root
    expect(vmcxGet(r, 'configuration/properties/name')).toBe('Other Location')
    expect(vmcxGet(r, 'configuration/properties/global_id')).toBe('282874FC-59D6-4F30-BC04-5FDD909C82E0')
    expect(vmcxGet(r, 'configuration/properties/version')).toBe(2304)
    expect(vmcxGet(r, 'configuration/properties/highly_available')).toBe(false)
    expect(vmcxGet(r, 'configuration/properties/creation_time')).toEqual(Buffer.from('a76e45669e97d701', 'hex'))
    expect(vmcxGet(r, 'configuration/settings/memory/bank/size')).toBe(1024)
    expect(vmcxGet(r, 'configuration/settings/memory/bank/limit')).toBe(1048576)
    expect(vmcxGet(r, 'configuration/settings/processors/count')).toBe(1)
    expect(vmcxGet(r, 'configuration/settings/vnuma/enabled')).toBe(true)
    expect(vmcxGet(r, 'configuration/_83f8638b-8dca-4152-9eda-2ca8b33039b4_/controller0/drive0/pathname')).toBe(VHDX_PATH)
    expect(vmcxGet(r, 'configuration/_83f8638b-8dca-4152-9eda-2ca8b33039b4_/controller1/drive0/type')).toBe('ISO')
    expect(vmcxGet(r, 'configuration/_917bd8cb-3bb6-4124-9383-b7d21ac07f79_/StateFilePath')).toBe(
      'C:\\Hyper-V\\EasyToFind\\Virtual Machines\\282874FC-59D6-4F30-BC04-5FDD909C82E0.vmgs',
    )
    expect(vmcxGet(r, 'configuration/_ac6b8dc1-3257-4a70-b1b2-a9c9215659ad_/boot/device1')).toBe('HardDrive')
    expect(isVmcxNode(vmcxGet(r, 'configuration/_ac6b8dc1-3257-4a70-b1b2-a9c9215659ad_/nvram'))).toBe(true)
    expect(vmcxGet(r, 'configuration/nope/nothing')).toBeUndefined()
  })

  test('device manifest: 37 devices with the firmware, IDE and synthetic SCSI controllers', () => {
    const devs = vmcxDevices(cfg)
    expect(devs.length).toBe(37)
    expect(devs.find((d) => d.key === 'vdev007')).toEqual({
      key: 'vdev007',
      device: 'ac6b8dc1-3257-4a70-b1b2-a9c9215659ad',
      instance: 'ac6b8dc1-3257-4a70-b1b2-a9c9215659ad',
      name: 'Microsoft Virtual BIOS',
    })
    expect(devs.find((d) => d.key === 'vdev021')!.name).toBe('Microsoft Emulated IDE Controller')
    expect(devs.find((d) => d.key === 'vdev037')).toEqual({
      key: 'vdev037',
      device: 'd422512d-2bf2-4752-809d-7b82b5fcb1b4',
      instance: '73e0f0c5-c0bc-4e16-a458-0e1c388bfee3',
      name: 'Synthetic SCSI Controller',
    })
  })

  test('VM facts: Gen 1 BIOS, 1 vCPU, 1024 MB, the .vhdx on IDE 0:0, one dynamic-MAC NIC', () => {
    const info = vmcxVmInfo(cfg)
    expect(info).toEqual({
      name: 'Other Location',
      configVersion: 2304,
      generation: 1,
      firmware: 'bios',
      secureBoot: false,
      cpuCount: 1,
      memoryMiB: 1024,
      dynamicMemory: false,
      disks: [{ bus: 'ide', controller: 0, slot: 0, address: '0:0', pathname: VHDX_PATH, type: 'VHD', instance: '83f8638b-8dca-4152-9eda-2ca8b33039b4' }],
      nics: [{ name: 'Network Adapter', mac: null, staticMac: false, switchName: null, legacy: false, instance: '1bc9500e-ad4b-426e-ad70-d04cbeb2033b' }],
      guestOs: null,
      warnings: [],
    })
  })
})

describe('parseVmcx on damaged input', () => {
  test('header 1 damaged: header 2 (sequence 24) is used, with a warning', () => {
    const b = Buffer.from(BYTES)
    b[8] ^= 0xff // header 1 sequence number: its CRC no longer matches
    const cfg = parseVmcx(b, 't.vmcx')
    expect(cfg.sequence).toBe(24)
    expect(cfg.warnings[0]).toContain('storage headers is damaged')
  })

  test('both headers damaged -> E_MIG_MALFORMED_ARCHIVE; no signature -> E_MIG_UNSUPPORTED_FORMAT', () => {
    const b = Buffer.from(BYTES)
    b[8] ^= 0xff
    b[0x1008] ^= 0xff
    expectMig(parseErr(b), 'E_MIG_MALFORMED_ARCHIVE')
    expectMig(parseErr(Buffer.alloc(0x3000)), 'E_MIG_UNSUPPORTED_FORMAT')
    expectMig(parseErr(readFileSync(path.join(CORPUS, 'dissect.hypervisor/GOAD-DC01.vbox'))), 'E_MIG_UNSUPPORTED_FORMAT')
  })

  test('another format version (valid checksum) -> E_MIG_UNSUPPORTED_FORMAT', () => {
    const b = Buffer.from(BYTES)
    for (const at of [0, 0x1000]) {
      b.writeUInt32LE(0x300, at + 10)
      b.writeUInt32LE(0, at + 4)
      b.writeUInt32LE(crc32(b.subarray(at, at + 46)), at + 4)
    }
    const err = parseErr(b) as MigError
    expectMig(err, 'E_MIG_UNSUPPORTED_FORMAT')
    expect(err.message).toContain('0x300')
  })

  test('one flipped byte in a string value -> E_MIG_MALFORMED_ARCHIVE (entry checksum)', () => {
    const b = Buffer.from(BYTES)
    const at = b.indexOf(Buffer.from('Other Location', 'utf16le'))
    expect(at).toBeGreaterThan(0x3000)
    b[at] ^= 0x01
    const err = parseErr(b) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('checksum mismatch')
  })

  test('larger than 4 MiB -> E_MIG_MALFORMED_ARCHIVE', () => {
    expectMig(parseErr(Buffer.concat([BYTES, Buffer.alloc(4 * MiB)])), 'E_MIG_MALFORMED_ARCHIVE')
  })

  test('every truncation length (step 97 bytes) -> MigError or a sane tree, fast', () => {
    const t0 = Date.now()
    let errors = 0
    for (let n = 0; n < BYTES.length; n += 97) {
      const e = parseErr(BYTES.subarray(0, n))
      if (e === undefined) continue
      expect(e).toBeInstanceOf(MigError)
      expect(['E_MIG_MALFORMED_ARCHIVE', 'E_MIG_UNSUPPORTED_FORMAT']).toContain((e as MigError).code)
      errors++
    }
    expect(errors).toBeGreaterThan(700)
    expect(Date.now() - t0).toBeLessThan(10_000)
  })

  test('400 random mutations (seeded) -> MigError or a sane tree, fast', () => {
    let seed = 0x9e3779b9
    const rnd = (n: number) => {
      seed ^= seed << 13
      seed ^= seed >>> 17
      seed ^= seed << 5
      return (seed >>> 0) % n
    }
    const t0 = Date.now()
    let ok = 0
    for (let i = 0; i < 400; i++) {
      const b = Buffer.from(BYTES)
      const flips = 1 + rnd(8)
      for (let k = 0; k < flips; k++) b[rnd(b.length)] = rnd(256)
      try {
        const cfg = parseVmcx(b, 'm.vmcx')
        const info = vmcxVmInfo(cfg)
        expect(cfg.root.size).toBeGreaterThan(0)
        expect(Array.isArray(info.disks)).toBe(true)
        ok++
      } catch (e) {
        expect(e).toBeInstanceOf(MigError)
        expect(['E_MIG_MALFORMED_ARCHIVE', 'E_MIG_UNSUPPORTED_FORMAT']).toContain((e as MigError).code)
      }
    }
    // Most random bytes land in free space or slack of the 80 KiB file.
    expect(ok).toBeGreaterThan(0)
    expect(Date.now() - t0).toBeLessThan(10_000)
  })
})

describe('vmcx_export importer on a generated export folder', () => {
  function makeExport(name: string, disks: string[]): string {
    const dir = path.join(root, name)
    mkdirSync(path.join(dir, 'Virtual Machines'), { recursive: true })
    mkdirSync(path.join(dir, 'Virtual Hard Disks'), { recursive: true })
    copyFileSync(VMCX, path.join(dir, 'Virtual Machines', '282874FC-59D6-4F30-BC04-5FDD909C82E0.vmcx'))
    for (const d of disks) execFileSync('qemu-img', ['create', '-q', '-f', 'vhdx', d, '256M'], { cwd: path.join(dir, 'Virtual Hard Disks') })
    return dir
  }

  test('the VMCX disk path maps onto "Virtual Hard Disks/Other Location.vhdx"', async () => {
    const dir = makeExport('Other Location', ['Other Location.vhdx'])
    const man = VmManifest.parse(await importer.inspect(dir, ctx()))
    expect(man.name).toBe('Other Location')
    expect(man.source_format).toBe('vmcx_export')
    expect(man.firmware).toBe('bios')
    expect(man.secure_boot).toBe(false)
    expect(man.cpu).toEqual({ count: 1, cores_per_socket: 1 })
    expect(man.memory_bytes).toBe(1024 * MiB)
    expect(man.guest_os).toEqual({ family: 'unknown', id: null })
    expect(man.disks).toHaveLength(1)
    const d = man.disks[0]!
    expect(d.label).toBe('Other_Location')
    expect(d.capacity_bytes).toBe(256 * MiB)
    expect(d.disk_format).toBe('vhdx')
    expect(d.controller).toBe('ide')
    expect(d.address).toBe('0:0')
    expect(d.source.path).toBe(path.join(dir, 'Virtual Hard Disks', 'Other Location.vhdx'))
    expect(d.backing_chain).toBeUndefined()
    expect(man.nics).toEqual([{ label: 'nic0', mac: null, model: 'virtio', network: null }])
    expect(man.warnings.some((w) => w.includes('does not record the guest OS'))).toBe(true)
    expect(man.warnings.some((w) => w.includes('virt-v2v'))).toBe(true)
    // The .vmcx itself, or the "Virtual Machines" folder, as input gives the same manifest.
    expect(await importer.inspect(path.join(dir, 'Virtual Machines', '282874FC-59D6-4F30-BC04-5FDD909C82E0.vmcx'), ctx())).toEqual(man)
    expect(await importer.inspect(path.join(dir, 'Virtual Machines'), ctx())).toEqual(man)
  })

  test('no VMCX path in the folder: every disk of "Virtual Hard Disks" with a warning', async () => {
    const dir = makeExport('renamed', ['b-data.vhdx', 'a-system.vhdx'])
    const man = VmManifest.parse(await importer.inspect(dir, ctx()))
    expect(man.disks.map((d) => [d.label, d.controller, d.address, d.capacity_bytes])).toEqual([
      ['a-system', 'unknown', '0:0', 256 * MiB],
      ['b-data', 'unknown', '0:1', 256 * MiB],
    ])
    expect(man.warnings.some((w) => w.includes('"Other Location.vhdx"') && w.includes('every disk of that folder'))).toBe(true)
  })

  test('no "Virtual Machines" folder -> E_MIG_MALFORMED_ARCHIVE; a non-.vmcx file -> E_MIG_UNSUPPORTED_FORMAT', async () => {
    const dir = path.join(root, 'empty')
    mkdirSync(dir, { recursive: true })
    expectMig(await thrown(() => importer.inspect(dir, ctx())), 'E_MIG_MALFORMED_ARCHIVE')
    writeFileSync(path.join(dir, 'x.txt'), 'x')
    expectMig(await thrown(() => importer.inspect(path.join(dir, 'x.txt'), ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
  })

  test('no disk at all although the VMCX attaches one -> E_MIG_MALFORMED_ARCHIVE naming it', async () => {
    const dir = makeExport('nodisk', [])
    const err = (await thrown(() => importer.inspect(dir, ctx()))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('Other Location.vhdx')
  })

  test('a truncated VMCX in an export -> E_MIG_MALFORMED_ARCHIVE', async () => {
    const dir = makeExport('truncated', ['Other Location.vhdx'])
    writeFileSync(path.join(dir, 'Virtual Machines', '282874FC-59D6-4F30-BC04-5FDD909C82E0.vmcx'), BYTES.subarray(0, 0x4800))
    expectMig(await thrown(() => importer.inspect(dir, ctx())), 'E_MIG_MALFORMED_ARCHIVE')
  })

  test('a disk that is not a VHDX although named so -> an E_MIG_* error, never a crash', async () => {
    const dir = makeExport('fake', [])
    writeFileSync(path.join(dir, 'Virtual Hard Disks', 'Other Location.vhdx'), Buffer.alloc(4096))
    expectMig(await thrown(() => importer.inspect(dir, ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
  })
})
