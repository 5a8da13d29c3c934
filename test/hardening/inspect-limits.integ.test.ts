/**
 * Destination limits and disk sizes at inspect, so that inspect tells the truth about the disks inside archives: what the
 * destination cannot take, and disk files whose header or size disagrees with the package, are
 * refused at inspect with `E_MIG_MALFORMED_ARCHIVE` naming the file, the field and the figures,
 * before any job copies a byte.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { closeSync, fstatSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { inspectInput } from '../../lib/importers/index.ts'
import { DESTINATION_LIMITS } from '../../lib/limits.ts'
import { MAX_DISKS } from '../../lib/domain/xml.ts'
import { buildInput, makeRawImage } from '../helpers/inputs.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const t = tempDir('mig-i12-limits-')
const root = path.join(t.dir, 'imports')
const ctx = { importRoot: root }
let raw = ''

beforeAll(() => {
  raw = makeRawImage(path.join(t.dir, 'd.raw'), 16 << 20)
})
afterAll(() => t.cleanup())

function expectMalformed(e: any, ...mentions: string[]): void {
  expect(e.code).toBe('E_MIG_MALFORMED_ARCHIVE')
  for (const m of mentions) expect(e.message).toContain(m)
}

describe('destination limits at inspect (lib/limits.ts, shared with lib/domain/xml.ts)', () => {
  test('the domain XML builder and inspect use the same limit', () => {
    expect(MAX_DISKS).toBe(DESTINATION_LIMITS.maxDisks)
  })

  test('a VMX with 20,000 scsiN:M.fileName entries is refused before any disk is resolved', async () => {
    const built = buildInput('vmx_folder', root, 'many-vmx', [raw])
    const vmx = path.join(built.path, 'many-vmx.vmx')
    const lines = readFileSync(vmx, 'utf8')
      .split('\n')
      .filter((l) => !/^scsi0:/.test(l))
    for (let n = 0; n < 100; n++) {
      lines.push(`scsi${n}.present = "TRUE"`)
      for (let m = 0; m < 200; m++)
        lines.push(`scsi${n}:${m}.present = "TRUE"`, `scsi${n}:${m}.fileName = "many-vmx.vmdk"`, `scsi${n}:${m}.deviceType = "scsi-hardDisk"`)
    }
    writeFileSync(vmx, lines.join('\n'))
    const t0 = performance.now()
    const e = await thrown(() => inspectInput(built.path, ctx, 'vmx_folder'))
    expectMalformed(e, 'many-vmx.vmx', `more than the ${DESTINATION_LIMITS.maxDisks}`)
    expect(e.message).not.toContain(root)
    expect(performance.now() - t0).toBeLessThan(10_000)
  })

  test('a .vbox with 500 disks is refused', async () => {
    const built = buildInput('vbox_folder', root, 'many-vbox', [raw])
    const file = path.join(built.path, 'many-vbox.vbox')
    const text = readFileSync(file, 'utf8')
    const uuid = (i: number) => `0e5b6c1a-2f3d-4e5f-8a9b-${String(i).padStart(12, '0')}`
    const hard = Array.from({ length: 500 }, (_, i) => `<HardDisk uuid="{${uuid(i)}}" location="many-vbox-0.vdi" format="VDI" type="Normal"/>`).join('\n')
    const att = Array.from(
      { length: 500 },
      (_, i) => `<AttachedDevice type="HardDisk" hotpluggable="false" port="${i}" device="0"><Image uuid="{${uuid(i)}}"/></AttachedDevice>`,
    ).join('\n')
    writeFileSync(
      file,
      text
        .replace(/<HardDisks>[\s\S]*<\/HardDisks>/, `<HardDisks>${hard}</HardDisks>`)
        .replace(/(<StorageController [^>]*PortCount=")\d+("[^>]*>)[\s\S]*?(<\/StorageController>)/, `$1500$2${att}$3`),
    )
    const e = await thrown(() => inspectInput(built.path, ctx, 'vbox_folder'))
    expectMalformed(e, '500 disks', `more than the ${DESTINATION_LIMITS.maxDisks}`)
  })
})

describe('disk files against their package (OVF)', () => {
  function ovfFolder(name: string): { dir: string; ovf: string; disk: string } {
    const built = buildInput('ovf_folder', root, name, [raw])
    for (const f of readdirSync(built.path)) if (f.endsWith('.mf')) rmSync(path.join(built.path, f))
    const files = readdirSync(built.path)
    return {
      dir: built.path,
      ovf: path.join(built.path, files.find((f) => f.endsWith('.ovf'))!),
      disk: path.join(built.path, files.find((f) => f.endsWith('.vmdk'))!),
    }
  }

  test('ovf:capacity of 1 TiB over a 16 MiB VMDK: refused naming both figures', async () => {
    const { dir, ovf } = ovfFolder('cap-1t')
    const text = readFileSync(ovf, 'utf8')
    const changed = text
      .replace(/ovf:capacity="\d+"/, `ovf:capacity="${2 ** 40}"`)
      .replace(/ovf:capacityAllocationUnits="[^"]*"/, 'ovf:capacityAllocationUnits="byte"')
    expect(changed).not.toBe(text)
    writeFileSync(ovf, changed)
    const e = await thrown(() => inspectInput(dir, ctx, 'ovf_folder'))
    expectMalformed(e, `${2 ** 40} bytes`, `${16 << 20}-byte image`)
  })

  test('an OVA whose VMDK member went through a text-mode transfer: refused naming member and field', async () => {
    const { dir, ovf, disk } = ovfFolder('textmode')
    const bytes = readFileSync(disk)
    // A text-mode transfer re-encoding Latin-1 as UTF-8: every byte >= 0x80 becomes two bytes.
    writeFileSync(disk, Buffer.from(bytes.toString('latin1'), 'utf8'))
    const ova = path.join(root, 'textmode.ova')
    execFileSync('tar', ['--format=ustar', '-cf', ova, '-C', dir, path.basename(ovf), path.basename(disk)])
    rmSync(dir, { recursive: true })
    const e = await thrown(() => inspectInput(ova, ctx, 'ova_archive'))
    expectMalformed(e, path.basename(disk))
    expect(e.details?.member).toBe(path.basename(disk))
    expect(typeof e.details?.field).toBe('string')
    expect(e.message).not.toContain(root)
  })

  /** An OVA of the OVF package with its disk as `fmt` (qemu-img), `damage` applied to the image first. */
  function ovaWith(fmt: 'vhdx' | 'vpc', name: string, damage: (fd: number, size: number) => void): string {
    const { dir, ovf, disk } = ovfFolder(name)
    const member = `${name}.${fmt === 'vpc' ? 'vhd' : 'vhdx'}`
    const image = path.join(dir, member)
    execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', fmt, raw, image])
    rmSync(disk)
    writeFileSync(ovf, readFileSync(ovf, 'utf8').replaceAll(path.basename(disk), member))
    const fd = openSync(image, 'r+')
    try {
      damage(fd, fstatSync(fd).size)
    } finally {
      closeSync(fd)
    }
    const ova = path.join(root, `${name}.ova`)
    execFileSync('tar', ['--format=ustar', '-cf', ova, '-C', dir, path.basename(ovf), member])
    rmSync(dir, { recursive: true })
    return ova
  }

  test('OVA members in VHDX and VHD are checked in place at inspect: intact ones pass, damaged headers are refused naming the member', async () => {
    const ok = (fd: number, size: number) => void [fd, size]
    for (const fmt of ['vhdx', 'vpc'] as const) {
      const r = await inspectInput(ovaWith(fmt, `ok-${fmt}`, ok), ctx, 'ova_archive')
      expect([r.manifest.disks[0]!.disk_format, r.manifest.disks[0]!.capacity_bytes]).toEqual([fmt, 16 << 20])
    }
    // VHDX: both headers (at 64 and 128 KiB) overwritten.
    const vhdx = ovaWith('vhdx', 'bad-vhdx', (fd) => {
      writeSync(fd, Buffer.alloc(4096, 0x3f), 0, 4096, 64 * 1024)
      writeSync(fd, Buffer.alloc(4096, 0x3f), 0, 4096, 128 * 1024)
    })
    let e = await thrown(() => inspectInput(vhdx, ctx, 'ova_archive'))
    expectMalformed(e, 'bad-vhdx.vhdx: ', 'neither VHDX header')
    expect(e.details?.member).toBe('bad-vhdx.vhdx')
    expect(e.message).not.toContain(root)
    // VHD (dynamic): the footer and its copy at offset 0 with a wrong checksum.
    const vhd = ovaWith('vpc', 'bad-vhd', (fd, size) => {
      writeSync(fd, Buffer.from([1, 2, 3, 4]), 0, 4, 64)
      writeSync(fd, Buffer.from([1, 2, 3, 4]), 0, 4, size - 512 + 64)
    })
    e = await thrown(() => inspectInput(vhd, ctx, 'ova_archive'))
    expectMalformed(e, 'bad-vhd.vhd: ', 'footer checksum')
    expect(e.message).not.toContain(root)
  })

  test('an intact OVA of the same disk inspects', async () => {
    const { dir, ovf, disk } = ovfFolder('intact')
    const ova = path.join(root, 'intact.ova')
    execFileSync('tar', ['--format=ustar', '-cf', ova, '-C', dir, path.basename(ovf), path.basename(disk)])
    const r = await inspectInput(ova, ctx, 'ova_archive')
    expect(r.manifest.disks[0]!.capacity_bytes).toBe(16 << 20)
  })
})
