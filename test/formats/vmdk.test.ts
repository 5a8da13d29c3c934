/**
 * VMDK reader tests: sparse headers (corpus streamOptimized files, qemu-made images, hand-made
 * COWD), descriptors, whole-disk inspection (extents, chains, confinement) and hostile input.
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { closeSync, copyFileSync, mkdirSync, openSync, readFileSync, readSync, symlinkSync, truncateSync, writeFileSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { busOfAdapterType, inspectVmdk, readVmdkSparseHeader } from '../../lib/formats/vmdk/inspect.ts'
import { parseVmdkDescriptor } from '../../lib/formats/vmdk/descriptor.ts'
import { MAX_CHAIN_DEPTH } from '../../lib/formats/vmdk/limits.ts'
import { caught } from '../helpers/mig-error.ts'
import { importRootFor } from '../helpers/import-root.ts'
import { CORPUS, thrown } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const VBOX_VMDK = path.join(CORPUS, 'vagrant-mutate/virtualbox-box-disk1.vmdk')
const TTY_OVA = path.join(CORPUS, 'govmomi/ttylinux-pc_i486-16.1.ova')

const { root, ctx } = importRootFor('mig-vmdk-')

function qemuImg(...args: string[]): void {
  execFileSync('qemu-img', args, { stdio: ['ignore', 'pipe', 'pipe'] })
}

/** Finds a member in a ustar archive by walking its 512-byte headers by hand. */
function tarMember(file: string, name: string): { offset: number; size: number } {
  const buf = readFileSync(file)
  for (let at = 0; at + 512 <= buf.length; ) {
    const h = buf.subarray(at, at + 512)
    if (h.every((b) => b === 0)) break
    const n = h.toString('latin1', 0, 100).replace(/\0.*$/s, '')
    const size = parseInt(h.toString('latin1', 124, 136).replace(/\0.*$/s, '').trim(), 8)
    if (n === name) return { offset: at + 512, size }
    at += 512 + Math.ceil(size / 512) * 512
  }
  throw new Error(`${name} not in ${file}`)
}

function expectMig(err: unknown, code: string): void {
  expect(err).toBeInstanceOf(MigError)
  expect((err as MigError).code).toBe(code as MigError['code'])
}

function descriptorText(createType: string, extents: string[], extra: string[] = []): string {
  return [
    '# Disk DescriptorFile',
    'version=1',
    'CID=12345678',
    'parentCID=ffffffff',
    `createType="${createType}"`,
    ...extra,
    '',
    '# Extent description',
    ...extents,
    '',
    '# The Disk Data Base',
    '#DDB',
    'ddb.adapterType = "lsilogic"',
    '',
  ].join('\n')
}

describe('readVmdkSparseHeader', () => {
  test('corpus VirtualBox streamOptimized: header values and the footer copy (GD_AT_END)', async () => {
    const h = await readVmdkSparseHeader(VBOX_VMDK)
    expect(h.magic).toBe('KDMV')
    expect(h.version).toBe(3)
    expect(h.flags).toBe(0x30001)
    expect(h.newlineDetect).toBe(true)
    expect(h.compressedGrains).toBe(true)
    expect(h.markers).toBe(true)
    expect(h.capacity).toBe(8192)
    expect(h.grainSize).toBe(128)
    expect(h.descriptorOffset).toBe(1)
    expect(h.descriptorSize).toBe(2)
    expect(h.numGTEsPerGT).toBe(512)
    expect(h.overHead).toBe(128)
    expect(h.compressAlgorithm).toBe(1)
    expect(h.gdAtEnd).toBe(true)
    expect(h.fromFooter).toBe(true)
    expect(h.gdOffset).toBe(129) // 0x81, from the footer at 1024 bytes before the end
    expect(h.truncated).toBe(false)
    expect(h.extentBytes).toBe(68096)
  })

  test('govmomi OVA member at its tar offset: capacity 61440, truncated (no footer)', async () => {
    const m = tarMember(TTY_OVA, 'ttylinux-pc_i486-16.1-disk1.vmdk')
    expect(m.offset).toBe(14 * 512) // tar -tvR: header at block 13
    expect(m.size).toBe(1048576)
    const h = await readVmdkSparseHeader(TTY_OVA, m.offset, m.size)
    expect(h.capacity).toBe(61440)
    expect(h.grainSize).toBe(128)
    expect(h.compressAlgorithm).toBe(1)
    expect(h.gdAtEnd).toBe(true)
    expect(h.fromFooter).toBe(false)
    expect(h.gdOffset).toBeNull()
    expect(h.truncated).toBe(true)
    // Its embedded descriptor, read in place.
    const fd = openSync(TTY_OVA, 'r')
    const buf = Buffer.alloc(h.descriptorSize * 512)
    readSync(fd, buf, 0, buf.length, m.offset + h.descriptorOffset * 512)
    closeSync(fd)
    const d = parseVmdkDescriptor(buf.subarray(0, buf.indexOf(0) < 0 ? buf.length : buf.indexOf(0)), 'ttylinux')
    expect(d.createType).toBe('streamOptimized')
    expect(d.extents).toEqual([{ access: 'RDONLY', sectors: 61440, type: 'SPARSE', file: 'generated-stream.vmdk', offset: 0, line: expect.any(Number) }])
    expect(d.adapterType).toBe('lsilogic')
  })

  test('qemu-img monolithicSparse: version 1, grain 128, GD in the header', async () => {
    const f = path.join(root, 'hdr-sparse.vmdk')
    qemuImg('create', '-q', '-f', 'vmdk', f, '10M')
    const h = await readVmdkSparseHeader(f)
    expect(h.version).toBe(1)
    expect(h.capacity).toBe(20480)
    expect(h.grainSize).toBe(128)
    expect(h.gdAtEnd).toBe(false)
    expect(typeof h.gdOffset).toBe('number')
    expect(h.compressedGrains).toBe(false)
    expect(h.truncated).toBe(false)
  })

  test('hand-made COWD (ESX sparse) header', async () => {
    const f = path.join(root, 'esx-delta.vmdk')
    const b = Buffer.alloc(4096)
    b.write('COWD', 0, 'latin1')
    b.writeUInt32LE(1, 4) // version
    b.writeUInt32LE(3, 8) // flags
    b.writeUInt32LE(4096, 12) // numSectors
    b.writeUInt32LE(1, 16) // grainSize
    b.writeUInt32LE(4, 20) // gdOffset
    b.writeUInt32LE(1, 24) // numGDEntries
    b.writeUInt32LE(8, 28) // freeSector
    b.write('base-flat.vmdk\0', 32, 'latin1') // child: parentFileName
    writeFileSync(f, b)
    const h = await readVmdkSparseHeader(f)
    expect(h.magic).toBe('COWD')
    expect(h.capacity).toBe(4096)
    expect(h.grainSize).toBe(1)
    expect(h.gdOffset).toBe(4)
    expect(h.gdEntries).toBe(1)
    expect(h.parentFileName).toBe('base-flat.vmdk')
    expect(h.truncated).toBe(false)
  })

  test('corrupted headers: version 4, newline bytes, grain size, unknown compression, not a VMDK', async () => {
    const good = readFileSync(VBOX_VMDK).subarray(0, 512)
    const cases: Array<[(b: Buffer) => void, string]> = [
      [(b) => b.writeUInt32LE(4, 4), 'E_MIG_UNSUPPORTED_FORMAT'],
      [(b) => b.writeUInt32LE(0, 4), 'E_MIG_MALFORMED_ARCHIVE'],
      [(b) => (b[75] = 0x0a), 'E_MIG_MALFORMED_ARCHIVE'],
      [(b) => b.writeBigUInt64LE(3n, 20), 'E_MIG_MALFORMED_ARCHIVE'],
      [(b) => b.writeUInt32LE(0, 44), 'E_MIG_MALFORMED_ARCHIVE'],
      [(b) => b.writeBigUInt64LE(1n << 60n, 12), 'E_MIG_MALFORMED_ARCHIVE'],
      [(b) => b.writeUInt16LE(2, 77), 'E_MIG_UNSUPPORTED_FORMAT'],
      [(b) => b.write('XXXX', 0, 'latin1'), 'E_MIG_UNSUPPORTED_FORMAT'],
    ]
    for (const [i, [mutate, code]] of cases.entries()) {
      const b = Buffer.from(good)
      mutate(b)
      const f = path.join(root, `bad-hdr-${i}.vmdk`)
      writeFileSync(f, Buffer.concat([b, Buffer.alloc(4096)]))
      expectMig(await thrown(() => readVmdkSparseHeader(f)), code)
    }
  })
})

describe('parseVmdkDescriptor', () => {
  test('header keys, all extent kinds, ddb, CRLF and comments', () => {
    const text = [
      '# Disk DescriptorFile',
      'version=1',
      'encoding="UTF-8"',
      'CID=ABCDEF01',
      'parentCID=fffffffe',
      'createType="custom"',
      'parentFileNameHint="base.vmdk"',
      '# Extent description',
      'RW 4192256 FLAT "disk-flat.vmdk" 0',
      'RDONLY 2048 SPARSE "disk-s001.vmdk"',
      'NOACCESS 1000 ZERO',
      'RW 8 VMFS "disk-vmfs.vmdk"',
      'RW 16 FLAT "disk-flat.vmdk" 4192256',
      '#DDB',
      'ddb.adapterType = "buslogic"',
      'ddb.geometry.cylinders = "261"',
      'ddb.geometry.heads = "255"',
      'ddb.geometry.sectors = "63"',
      'ddb.uuid = "60 00 C2 9a 7b 10 6b 7f-3c 6a 4e 2d 1b 0c 4a 91"',
      'ddb.virtualHWVersion = "21"',
      'ddb.__proto__ = "x"',
    ].join('\r\n')
    const d = parseVmdkDescriptor(text, 'custom.vmdk')
    expect(d.version).toBe(1)
    expect(d.encoding).toBe('UTF-8')
    expect(d.CID).toBe('abcdef01')
    expect(d.parentCID).toBe('fffffffe')
    expect(d.createType).toBe('custom')
    expect(d.parentFileNameHint).toBe('base.vmdk')
    expect(d.extents).toEqual([
      { access: 'RW', sectors: 4192256, type: 'FLAT', file: 'disk-flat.vmdk', offset: 0, line: 9 },
      { access: 'RDONLY', sectors: 2048, type: 'SPARSE', file: 'disk-s001.vmdk', offset: 0, line: 10 },
      { access: 'NOACCESS', sectors: 1000, type: 'ZERO', file: null, offset: 0, line: 11 },
      { access: 'RW', sectors: 8, type: 'VMFS', file: 'disk-vmfs.vmdk', offset: 0, line: 12 },
      { access: 'RW', sectors: 16, type: 'FLAT', file: 'disk-flat.vmdk', offset: 4192256, line: 13 },
    ])
    expect(d.adapterType).toBe('buslogic')
    expect(d.geometry).toEqual({ cylinders: 261, heads: 255, sectors: 63 })
    expect(d.uuid).toBe('60 00 C2 9a 7b 10 6b 7f-3c 6a 4e 2d 1b 0c 4a 91')
    expect(d.virtualHWVersion).toBe('21')
    // biome-ignore lint/suspicious/noProto: checks that a DDB key named __proto__ is kept as data
    expect(d.ddb['__proto__']).toBe('x')
    expect(Object.getPrototypeOf(d.ddb)).toBeNull()
    expect(({} as Record<string, unknown>).x).toBeUndefined()
  })

  test('corpus VirtualBox embedded descriptor', () => {
    const buf = readFileSync(VBOX_VMDK).subarray(512, 512 + 1024)
    const d = parseVmdkDescriptor(buf.subarray(0, buf.indexOf(0)), 'box-disk1.vmdk')
    expect(d.CID).toBe('f8e20e7a')
    expect(d.parentCID).toBe('ffffffff')
    expect(d.createType).toBe('streamOptimized')
    expect(d.extents.map((e) => [e.access, e.sectors, e.type, e.file])).toEqual([['RDONLY', 8192, 'SPARSE', 'box-disk1.vmdk']])
    expect(d.adapterType).toBe('ide')
  })

  test('a descriptor NUL-padded to a sector (as qemu-img writes some) parses like the unpadded one', () => {
    const text = descriptorText('monolithicFlat', ['RW 20480 FLAT "a-flat.vmdk" 0'])
    const padded = Buffer.concat([Buffer.from(text), Buffer.alloc(512 - (text.length % 512))])
    expect(parseVmdkDescriptor(padded, 'padded.vmdk')).toEqual(parseVmdkDescriptor(text, 'padded.vmdk'))
  })

  test('a descriptor qemu rewrote with a shorter CID (bytes of the old text behind the new NUL) parses like qemu reads it', () => {
    // The bytes qemu-io 7.2 left in a monolithicFlat descriptor after a write whose new CID had
    // 6 hex digits, the old one 7 (seen in the vCenter simulator harness, which writes the guest's
    // data with qemu-io; reproduced with qemu-img create + qemu-io writes): `…"\n\0\n` then padding.
    const text = descriptorText('monolithicFlat', ['RW 20480 FLAT "a-flat.vmdk" 0'])
    expect(text.endsWith('\n')).toBe(true)
    const rewritten = Buffer.concat([Buffer.from(text), Buffer.from('\0\n'), Buffer.alloc(300)])
    expect(parseVmdkDescriptor(rewritten, 'cid.vmdk')).toEqual(parseVmdkDescriptor(text, 'cid.vmdk'))
  })

  test('bad descriptors carry the right codes', () => {
    const ok = (ct: string, ext: string) => descriptorText(ct, [ext])
    const cases: Array<[string, string]> = [
      [ok('monolithicFlat', 'RW 10 FLAT "a" 0').replace('createType="monolithicFlat"', ''), 'E_MIG_MALFORMED_ARCHIVE'],
      [ok('hyperDisk', 'RW 10 FLAT "a" 0'), 'E_MIG_UNSUPPORTED_FORMAT'],
      [ok('monolithicFlat', 'RW 10 TAPE "a"'), 'E_MIG_UNSUPPORTED_FORMAT'],
      [ok('monolithicFlat', 'RW -10 FLAT "a" 0'), 'E_MIG_MALFORMED_ARCHIVE'],
      [ok('monolithicFlat', 'RW 10 FLAT "a'), 'E_MIG_MALFORMED_ARCHIVE'],
      [ok('monolithicFlat', 'RW 10 FLAT "a" zz'), 'E_MIG_MALFORMED_ARCHIVE'],
      [ok('monolithicFlat', 'RW 10 SPARSE "a" 7'), 'E_MIG_MALFORMED_ARCHIVE'],
      [ok('monolithicFlat', 'RW 10 FLAT'), 'E_MIG_MALFORMED_ARCHIVE'],
      [ok('monolithicFlat', 'this is not a descriptor line'), 'E_MIG_MALFORMED_ARCHIVE'],
      [descriptorText('monolithicFlat', []), 'E_MIG_MALFORMED_ARCHIVE'],
      [ok('monolithicFlat', 'RW 10 FLAT "a" 0').replace('CID=12345678', 'CID=nothex!'), 'E_MIG_MALFORMED_ARCHIVE'],
      [ok('monolithicFlat', 'RW 10 FLAT "a" 0').replace('version=1', 'version=9'), 'E_MIG_UNSUPPORTED_FORMAT'],
      [ok('monolithicFlat', 'RW 10 FLAT "a" 0').replace('version=1', 'version=1\0'), 'E_MIG_MALFORMED_ARCHIVE'],
      ['x'.repeat(5 * MiB), 'E_MIG_MALFORMED_ARCHIVE'],
    ]
    for (const [text, code] of cases) {
      expectMig(
        caught(() => parseVmdkDescriptor(text, 'bad.vmdk')),
        code,
      )
    }
  })
})

describe('inspectVmdk', () => {
  test('corpus streamOptimized (VirtualBox): 4 MiB, vmdk, adapter ide', async () => {
    const info = await inspectVmdk(VBOX_VMDK, { importRoot: path.dirname(VBOX_VMDK) })
    expect(info.kind).toBe('sparse')
    expect(info.createType).toBe('streamOptimized')
    expect(info.capacity_bytes).toBe(4 * MiB)
    expect(info.allocated_bytes).toBe(68096)
    expect(info.disk_format).toBe('vmdk')
    expect(info.source).toEqual({ path: VBOX_VMDK })
    expect(info.adapterType).toBe('ide')
    expect(busOfAdapterType(info.adapterType)).toBe('ide')
    expect(info.descriptor?.CID).toBe('f8e20e7a')
    expect(info.backing_chain).toEqual([])
  })

  test('truncated streamOptimized extent (the OVA member, copied out) is malformed', async () => {
    const m = tarMember(TTY_OVA, 'ttylinux-pc_i486-16.1-disk1.vmdk')
    const f = path.join(root, 'ttylinux-disk1.vmdk')
    writeFileSync(f, readFileSync(TTY_OVA).subarray(m.offset, m.offset + m.size))
    const err = await thrown(() => inspectVmdk(f, ctx()))
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('truncated')
    // The complete corpus stream cut short loses its footer too.
    const g = path.join(root, 'box-cut.vmdk')
    copyFileSync(VBOX_VMDK, g)
    truncateSync(g, 68096 - 1024)
    expectMig(await thrown(() => inspectVmdk(g, { importRoot: root })), 'E_MIG_MALFORMED_ARCHIVE')
  })

  test('qemu-img subformats: sparse, flat (raw at offset), split sparse and split flat', async () => {
    const dir = path.join(root, 'subformats')
    mkdirSync(dir)
    for (const s of ['monolithicSparse', 'monolithicFlat', 'twoGbMaxExtentSparse', 'twoGbMaxExtentFlat', 'streamOptimized']) {
      qemuImg('create', '-q', '-f', 'vmdk', '-o', `subformat=${s}`, path.join(dir, `${s}.vmdk`), '10M')
    }
    const sp = await inspectVmdk(path.join(dir, 'monolithicSparse.vmdk'), ctx())
    expect([sp.kind, sp.createType, sp.capacity_bytes, sp.allocated_bytes, sp.disk_format]).toEqual(['sparse', 'monolithicSparse', 10 * MiB, 65536, 'vmdk'])
    const fl = await inspectVmdk(path.join(dir, 'monolithicFlat.vmdk'), ctx())
    expect([fl.kind, fl.createType, fl.capacity_bytes, fl.disk_format]).toEqual(['descriptor', 'monolithicFlat', 10 * MiB, 'raw'])
    expect(fl.source).toEqual({ path: path.join(dir, 'monolithicFlat-flat.vmdk'), offset: 0, length: 10 * MiB })
    expect(fl.adapterType).toBe('ide')
    const ts = await inspectVmdk(path.join(dir, 'twoGbMaxExtentSparse.vmdk'), ctx())
    expect([ts.createType, ts.capacity_bytes, ts.disk_format]).toEqual(['twoGbMaxExtentSparse', 10 * MiB, 'vmdk'])
    expect(ts.extents.map((e) => [e.type, e.sectors, e.path])).toEqual([['SPARSE', 20480, path.join(dir, 'twoGbMaxExtentSparse-s001.vmdk')]])
    expect(ts.extents[0].header?.capacity).toBe(20480)
    const tf = await inspectVmdk(path.join(dir, 'twoGbMaxExtentFlat.vmdk'), ctx())
    expect(tf.disk_format).toBe('raw')
    expect(tf.source.path).toBe(path.join(dir, 'twoGbMaxExtentFlat-f001.vmdk'))
    const so = await inspectVmdk(path.join(dir, 'streamOptimized.vmdk'), ctx())
    expect([so.createType, so.capacity_bytes, so.disk_format]).toEqual(['streamOptimized', 10 * MiB, 'vmdk'])
  })

  test('multi-extent descriptor with offset and ZERO extent stays vmdk; sums capacity', async () => {
    const dir = path.join(root, 'multi')
    mkdirSync(dir)
    writeFileSync(path.join(dir, 'm-flat.vmdk'), Buffer.alloc(3 * 512 * 1024))
    writeFileSync(
      path.join(dir, 'm.vmdk'),
      descriptorText('monolithicFlat', ['RW 1024 FLAT "m-flat.vmdk" 0', 'RW 1024 FLAT "m-flat.vmdk" 2048', 'RW 2048 ZERO']),
    )
    const info = await inspectVmdk(path.join(dir, 'm.vmdk'), ctx())
    expect(info.capacity_bytes).toBe(4096 * 512)
    expect(info.disk_format).toBe('vmdk')
    expect(info.source).toEqual({ path: path.join(dir, 'm.vmdk') })
    expect(info.allocated_bytes).toBe(3 * 512 * 1024 + readFileSync(path.join(dir, 'm.vmdk')).length)
    expect(info.warnings).toEqual([])
    // Descriptors qemu 7.2 would not open as they are are flagged.
    writeFileSync(path.join(dir, 'c.vmdk'), descriptorText('custom', ['RDONLY 1024 FLAT "m-flat.vmdk" 0', 'RW 2048 ZERO']))
    const c = await inspectVmdk(path.join(dir, 'c.vmdk'), ctx())
    expect(c.warnings.length).toBe(2)
    expect(c.warnings[0]).toContain('createType custom')
    expect(c.warnings[1]).toContain('non-RW extents')
    // A single flat extent at an offset reads raw from that offset.
    writeFileSync(path.join(dir, 'o.vmdk'), descriptorText('monolithicFlat', ['RW 1024 FLAT "m-flat.vmdk" 2048']))
    const o = await inspectVmdk(path.join(dir, 'o.vmdk'), ctx())
    expect(o.source).toEqual({ path: path.join(dir, 'm-flat.vmdk'), offset: 2048 * 512, length: 1024 * 512 })
  })

  test('snapshot chain: child -> base, nearest first', async () => {
    const dir = path.join(root, 'chain')
    mkdirSync(dir)
    qemuImg('create', '-q', '-f', 'vmdk', path.join(dir, 'base.vmdk'), '8M')
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-b', 'base.vmdk', '-F', 'vmdk', 'base-000001.vmdk'], { cwd: dir })
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-b', 'base-000001.vmdk', '-F', 'vmdk', 'base-000002.vmdk'], { cwd: dir })
    const info = await inspectVmdk(path.join(dir, 'base-000002.vmdk'), ctx())
    expect(info.backing_chain).toEqual([path.join(dir, 'base-000001.vmdk'), path.join(dir, 'base.vmdk')])
    expect(info.capacity_bytes).toBe(8 * MiB)
    expect(info.disk_format).toBe('vmdk')
    expect(info.descriptor?.parentFileNameHint).toBe('base-000001.vmdk')
    expect(info.warnings).toEqual([])
  })

  test('parent loops and chains deeper than MAX_CHAIN_DEPTH (64) are malformed; missing parent too', async () => {
    const dir = path.join(root, 'loop')
    mkdirSync(dir)
    writeFileSync(path.join(dir, 'f.bin'), Buffer.alloc(8 * 512))
    writeFileSync(path.join(dir, 'a.vmdk'), descriptorText('monolithicFlat', ['RW 8 FLAT "f.bin" 0'], ['parentFileNameHint="b.vmdk"']))
    writeFileSync(path.join(dir, 'b.vmdk'), descriptorText('monolithicFlat', ['RW 8 FLAT "f.bin" 0'], ['parentFileNameHint="a.vmdk"']))
    const loop = await thrown(() => inspectVmdk(path.join(dir, 'a.vmdk'), ctx()))
    expectMig(loop, 'E_MIG_MALFORMED_ARCHIVE')
    expect(loop.message).toContain('loops')
    const n = MAX_CHAIN_DEPTH + 4
    for (let i = 0; i < n; i++) {
      writeFileSync(path.join(dir, `d${i}.vmdk`), descriptorText('monolithicFlat', ['RW 8 FLAT "f.bin" 0'], [`parentFileNameHint="d${i + 1}.vmdk"`]))
    }
    writeFileSync(path.join(dir, `d${n}.vmdk`), descriptorText('monolithicFlat', ['RW 8 FLAT "f.bin" 0']))
    const deep = await thrown(() => inspectVmdk(path.join(dir, 'd0.vmdk'), ctx()))
    expectMig(deep, 'E_MIG_MALFORMED_ARCHIVE')
    expect(deep.message).toContain(`deeper than ${MAX_CHAIN_DEPTH}`)
    const ok = await inspectVmdk(path.join(dir, 'd5.vmdk'), ctx())
    expect(ok.backing_chain.length).toBe(n - 5)
    writeFileSync(path.join(dir, 'orphan.vmdk'), descriptorText('monolithicFlat', ['RW 8 FLAT "f.bin" 0'], ['parentFileNameHint="gone.vmdk"']))
    expectMig(await thrown(() => inspectVmdk(path.join(dir, 'orphan.vmdk'), ctx())), 'E_MIG_MALFORMED_ARCHIVE')
  })

  test('extents and parents outside the root are rejected', async () => {
    const dir = path.join(root, 'escape')
    mkdirSync(dir)
    const cases = ['RW 8 FLAT "../../../../../../etc/passwd" 0', 'RW 8 FLAT "/etc/passwd" 0', 'RW 8 FLAT "%2e%2e/x" 0']
    for (const [i, ext] of cases.entries()) {
      writeFileSync(path.join(dir, `e${i}.vmdk`), descriptorText('monolithicFlat', [ext]))
      expectMig(await thrown(() => inspectVmdk(path.join(dir, `e${i}.vmdk`), ctx())), 'E_MIG_HOST_PATH_REJECTED')
    }
    symlinkSync('/etc/passwd', path.join(dir, 'link-flat.vmdk'))
    writeFileSync(path.join(dir, 'sym.vmdk'), descriptorText('monolithicFlat', ['RW 1 FLAT "link-flat.vmdk" 0']))
    expectMig(await thrown(() => inspectVmdk(path.join(dir, 'sym.vmdk'), ctx())), 'E_MIG_HOST_PATH_REJECTED')
    writeFileSync(path.join(dir, 'f.bin'), Buffer.alloc(512))
    writeFileSync(path.join(dir, 'p.vmdk'), descriptorText('monolithicFlat', ['RW 1 FLAT "f.bin" 0'], ['parentFileNameHint="/etc/hostname"']))
    expectMig(await thrown(() => inspectVmdk(path.join(dir, 'p.vmdk'), ctx())), 'E_MIG_HOST_PATH_REJECTED')
  })

  test('missing, short, mismatched and device extents', async () => {
    const dir = path.join(root, 'extents')
    mkdirSync(dir)
    writeFileSync(path.join(dir, 'missing.vmdk'), descriptorText('monolithicFlat', ['RW 8 FLAT "nope-flat.vmdk" 0']))
    const miss = await thrown(() => inspectVmdk(path.join(dir, 'missing.vmdk'), ctx()))
    expectMig(miss, 'E_MIG_MALFORMED_ARCHIVE')
    expect(miss.message).toContain('missing.vmdk')
    expect(miss.message).toContain('nope-flat.vmdk')
    writeFileSync(path.join(dir, 'short-flat.vmdk'), Buffer.alloc(4 * 512))
    writeFileSync(path.join(dir, 'short.vmdk'), descriptorText('monolithicFlat', ['RW 8 FLAT "short-flat.vmdk" 0']))
    expectMig(await thrown(() => inspectVmdk(path.join(dir, 'short.vmdk'), ctx())), 'E_MIG_MALFORMED_ARCHIVE')
    writeFileSync(path.join(dir, 'off.vmdk'), descriptorText('monolithicFlat', ['RW 4 FLAT "short-flat.vmdk" 1']))
    expectMig(await thrown(() => inspectVmdk(path.join(dir, 'off.vmdk'), ctx())), 'E_MIG_MALFORMED_ARCHIVE')
    qemuImg('create', '-q', '-f', 'vmdk', path.join(dir, 'sp-s001.vmdk'), '1M')
    writeFileSync(path.join(dir, 'cap.vmdk'), descriptorText('twoGbMaxExtentSparse', ['RW 4096 SPARSE "sp-s001.vmdk"']))
    const cap = await thrown(() => inspectVmdk(path.join(dir, 'cap.vmdk'), ctx()))
    expectMig(cap, 'E_MIG_MALFORMED_ARCHIVE')
    expect(cap.message).toContain('2048')
    writeFileSync(path.join(dir, 'rdm.vmdk'), descriptorText('vmfsPassthroughRawDeviceMap', ['RW 8 VMFSRDM "rdm-rdmp.vmdk"']))
    expectMig(await thrown(() => inspectVmdk(path.join(dir, 'rdm.vmdk'), ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
    writeFileSync(path.join(dir, 'raw.vmdk'), descriptorText('custom', ['RW 8 VMFSRAW "/dev/sda"']))
    expectMig(await thrown(() => inspectVmdk(path.join(dir, 'raw.vmdk'), ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
  })

  test('COWD extent behind a vmfsSparse descriptor', async () => {
    const dir = path.join(root, 'cowd')
    mkdirSync(dir)
    copyFileSync(path.join(root, 'esx-delta.vmdk'), path.join(dir, 'vm-delta.vmdk'))
    writeFileSync(path.join(dir, 'vm.vmdk'), descriptorText('vmfsSparse', ['RW 4096 VMFSSPARSE "vm-delta.vmdk"']))
    const info = await inspectVmdk(path.join(dir, 'vm.vmdk'), ctx())
    expect(info.capacity_bytes).toBe(4096 * 512)
    expect(info.extents[0].header?.magic).toBe('COWD')
    expect(info.disk_format).toBe('vmdk')
  })

  test('non-VMDK file, 5 MiB descriptor, directory', async () => {
    const dir = path.join(root, 'odd')
    mkdirSync(dir)
    writeFileSync(path.join(dir, 'png.vmdk'), Buffer.from('\x89PNG\r\n\x1a\n' + 'x'.repeat(100), 'latin1'))
    expectMig(await thrown(() => inspectVmdk(path.join(dir, 'png.vmdk'), ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
    const big = descriptorText('monolithicFlat', ['RW 8 FLAT "f" 0']) + '#'.repeat(5 * MiB) + '\n'
    writeFileSync(path.join(dir, 'big.vmdk'), big)
    const e = await thrown(() => inspectVmdk(path.join(dir, 'big.vmdk'), ctx()))
    expectMig(e, 'E_MIG_MALFORMED_ARCHIVE')
    expect(e.message).toContain('4 MiB')
    expectMig(await thrown(() => inspectVmdk(dir, ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
  })

  test('random mutations of a descriptor and a sparse header: MigError or a sane result, quickly', async () => {
    const dir = path.join(root, 'fuzz')
    mkdirSync(dir)
    qemuImg('create', '-q', '-f', 'vmdk', path.join(dir, 'seed.vmdk'), '4M')
    writeFileSync(path.join(dir, 'flat.bin'), Buffer.alloc(8192 * 512 + 4096))
    truncateSync(path.join(dir, 'flat.bin'), 8192 * 512)
    const sparse = readFileSync(path.join(dir, 'seed.vmdk'))
    const desc = Buffer.from(descriptorText('monolithicFlat', ['RW 8192 FLAT "flat.bin" 0'], ['parentFileNameHint="seed.vmdk"']))
    let seed = 12345
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff
      return seed % n
    }
    const started = Date.now()
    let ok = 0
    let failed = 0
    for (let i = 0; i < 400; i++) {
      const isSparse = i % 2 === 0
      const b = Buffer.from(isSparse ? sparse : desc)
      const span = isSparse ? 2048 : b.length
      for (let k = 0, n = 1 + rnd(6); k < n; k++) b[rnd(span)] = rnd(256)
      const f = path.join(dir, `m${i}.vmdk`)
      const fd = openSync(f, 'w')
      writeSync(fd, b)
      closeSync(fd)
      try {
        const info = await inspectVmdk(f, ctx())
        expect(info.capacity_bytes).toBeGreaterThanOrEqual(0)
        expect(Number.isSafeInteger(info.capacity_bytes)).toBe(true)
        expect(info.capacity_bytes).toBeLessThanOrEqual(2 ** 37 * 512)
        ok++
      } catch (e) {
        expect(e).toBeInstanceOf(MigError)
        failed++
      }
    }
    expect(ok + failed).toBe(400)
    // Both outcomes occur: some mutations are harmless, most are caught.
    expect(ok).toBeGreaterThan(0)
    expect(failed).toBeGreaterThan(0)
    expect(Date.now() - started).toBeLessThan(10000)
  })
})
