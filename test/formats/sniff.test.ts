// Format sniffing (lib/formats/sniff.ts): one classifier for the probe, the OVF disk-format choice
// and the qemu driver of backing-chain parents.
import { afterAll, describe, expect, test } from 'bun:test'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { probeMagic, sniffDiskFormat } from '../../lib/formats/sniff.ts'
import { probeImageFormat } from '../../lib/pipeline/qemu-nbd.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const tmp = tempDir('i14-sniff-')
afterAll(() => tmp.cleanup())

const qcowHeader = (version: number): Buffer => Buffer.concat([Buffer.from([0x51, 0x46, 0x49, 0xfb, 0, 0, 0, version]), Buffer.alloc(504)])

describe('sniffing', () => {
  test('a legacy qcow v1 image is qcow (no disk format), a v3 image qcow2', () => {
    expect(probeMagic(qcowHeader(1), Buffer.alloc(512), 4096)).toMatchObject({ format: 'qcow', disk_format: null, version: 1 })
    expect(sniffDiskFormat(qcowHeader(1))).toBeNull()
    expect(sniffDiskFormat(qcowHeader(3))).toBe('qcow2')
  })

  test('an ESX COWD extent is vmdk for every caller', () => {
    expect(sniffDiskFormat(Buffer.from('COWD\x01\0\0\0', 'latin1'))).toBe('vmdk')
  })

  test("qemu-nbd's parent probe refuses a legacy qcow v1 parent instead of calling it qcow2", async () => {
    const v1 = join(tmp.dir, 'v1.qcow')
    writeFileSync(v1, Buffer.concat([qcowHeader(1), Buffer.alloc(4096)]))
    const err = await thrown(() => probeImageFormat(v1))
    expect(err.code).toBe('E_MIG_UNSUPPORTED_FORMAT')
    expect(err.message).toContain('legacy qcow v1')
    const v3 = join(tmp.dir, 'v3.qcow2')
    writeFileSync(v3, Buffer.concat([qcowHeader(3), Buffer.alloc(4096)]))
    expect(await probeImageFormat(v3)).toBe('qcow2')
    const fixedVhd = join(tmp.dir, 'fixed.vhd')
    writeFileSync(fixedVhd, Buffer.concat([Buffer.alloc(4096), Buffer.from('conectix'), Buffer.alloc(504)]))
    expect(await probeImageFormat(fixedVhd)).toBe('vpc')
    const raw = join(tmp.dir, 'zeros.raw')
    writeFileSync(raw, Buffer.alloc(8192))
    expect(await probeImageFormat(raw)).toBe('raw')
  })
})
