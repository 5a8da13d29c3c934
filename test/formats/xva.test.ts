/**
 * XenServer XVA reader and `xva_archive` importer on generated archives: an `ova.xml` written per
 * xapi's export format (XML-RPC objects VM, VBD, VDI, VIF, network), 1 MiB blocks with `.checksum`
 * (SHA-1) companions and missing (all-zero) blocks, tarred with GNU tar; plus hostile variants.
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createXXHash64 } from 'hash-wasm'
import { createHash } from 'node:crypto'
import { mkdirSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import type { MigError } from '../../lib/errors.ts'
import { VmManifest } from '../../lib/manifest.ts'
import { listTarMembers, type TarMember } from '../../lib/formats/tar.ts'
import { parseOvaXml } from '../../lib/formats/xva.ts'
import { checkXvaBlock, verifyXvaBlocks, XVA_BLOCK_SIZE, type XvaBlock } from '../../lib/formats/xva-chunks.ts'
import { decodeXmlRpcValue } from '../../lib/formats/xmlrpc.ts'
import { parseXmlDocument } from '../../lib/formats/xml.ts'
import { importer } from '../../lib/importers/xva-archive.ts'
import { xxh64Upper } from '../helpers/inputs.ts'
import { importRootFor } from '../helpers/import-root.ts'
import { thrown } from '../helpers/tmp.ts'
import { caught, expectMig } from '../helpers/mig-error.ts'

const MiB = 1024 * 1024
const { root, ctx } = importRootFor('mig-xva-')

const s = (v: string) => `<value>${v}</value>`
const member = (name: string, value: string) => `<member><name>${name}</name>${value}</member>`
const struct = (m: Record<string, string>) =>
  `<value><struct>${Object.entries(m)
    .map(([k, v]) => member(k, v))
    .join('')}</struct></value>`
const array = (vals: string[]) => `<value><array><data>${vals.join('')}</data></array></value>`
const obj = (cls: string, id: string, snap: Record<string, string>) => struct({ class: s(cls), id: s(id), snapshot: struct(snap) })

/** An ova.xml as xapi writes it: two disks (Ref:3 8 MiB, Ref:5 3.5 MiB), a CD, one VIF. */
function ovaXml(over: { vdi5Size?: string } = {}): string {
  return (
    `<?xml version="1.0"?>` +
    struct({
      version: struct({
        hostname: s('xcp1'),
        date: s('2024-05-01'),
        product_version: s('8.2.1'),
        product_brand: s('XCP-ng'),
        build_number: s('release/yangtze'),
        xapi_major: `<value><i4>1</i4></value>`,
        xapi_minor: `<value><i4>20</i4></value>`,
        export_vsn: `<value><i4>2</i4></value>`,
      }),
      objects: array([
        obj('VM', 'Ref:0', {
          uuid: s('6a3d1c6e-0000-4000-8000-000000000001'),
          name_label: s('win &amp; data'),
          is_a_template: `<value><boolean>0</boolean></value>`,
          is_control_domain: `<value><boolean>0</boolean></value>`,
          memory_static_max: s('4294967296'),
          VCPUs_max: s('4'),
          HVM_boot_policy: s('BIOS order'),
          HVM_boot_params: struct({ order: s('dc'), firmware: s('uefi') }),
          platform: struct({ secureboot: s('true'), 'cores-per-socket': s('2'), viridian: s('true'), device_id: s('0002') }),
          other_config: struct({ base_template_name: s('Windows Server 2019 (64-bit)'), mac_seed: s('x') }),
          VBDs: array([s('Ref:12'), s('Ref:11'), s('Ref:10')]),
          VIFs: array([s('Ref:20')]),
          guest_metrics: s('OpaqueRef:NULL'),
        }),
        obj('VBD', 'Ref:10', {
          VM: s('Ref:0'),
          VDI: s('Ref:3'),
          userdevice: s('0'),
          type: s('Disk'),
          bootable: `<value><boolean>1</boolean></value>`,
          mode: s('RW'),
        }),
        obj('VBD', 'Ref:11', { VM: s('Ref:0'), VDI: s('OpaqueRef:NULL'), userdevice: s('3'), type: s('CD'), bootable: `<value><boolean>0</boolean></value>` }),
        obj('VBD', 'Ref:12', { VM: s('Ref:0'), VDI: s('Ref:5'), userdevice: s('1'), type: s('Disk'), bootable: `<value><boolean>0</boolean></value>` }),
        obj('VDI', 'Ref:3', { name_label: s('system disk'), virtual_size: s(String(8 * MiB)), type: s('system'), SR: s('Ref:40') }),
        obj('VDI', 'Ref:5', { name_label: s('data'), virtual_size: s(over.vdi5Size ?? String(3.5 * MiB)), type: s('user'), SR: s('Ref:40') }),
        obj('VIF', 'Ref:20', { device: s('0'), MAC: s('AA:BB:CC:00:11:22'), network: s('Ref:30'), MTU: s('1500') }),
        obj('network', 'Ref:30', { name_label: s('Pool-wide network associated with eth0'), bridge: s('xenbr0') }),
        obj('SR', 'Ref:40', { name_label: s('Local storage') }),
      ]),
    })
  )
}

/** Block content: a recognisable pattern per (dir, index). */
function block(dir: string, index: number, size = XVA_BLOCK_SIZE): Buffer {
  const b = Buffer.alloc(size)
  for (let i = 0; i < size; i += 4096) b.write(`${dir}/${index}@${i};`, i)
  return b
}

interface BlockSpec {
  dir: string
  index: number
  size?: number
  companion?: 'checksum' | 'xxhash' | 'none' | 'bad' | 'badxxhash'
  /** The companion is stored before its block (an archive repacked in directory order). */
  companionFirst?: boolean
}

/** Writes the staging files and tars them in the given order (ova.xml first). */
function makeXva(name: string, blocks: BlockSpec[], xml = ovaXml()): string {
  const stage = path.join(root, `${name}.stage`)
  rmSync(stage, { recursive: true, force: true })
  mkdirSync(stage, { recursive: true })
  writeFileSync(path.join(stage, 'ova.xml'), xml)
  const order = ['ova.xml']
  for (const b of blocks) {
    mkdirSync(path.join(stage, b.dir), { recursive: true })
    const n = `${b.dir}/${String(b.index).padStart(8, '0')}`
    const data = block(b.dir, b.index, b.size)
    writeFileSync(path.join(stage, n), data)
    order.push(n)
    const at = order.length - 1
    const c = b.companion ?? 'checksum'
    if (c === 'checksum' || c === 'bad') {
      const h = createHash('sha1')
        .update(c === 'bad' ? Buffer.from('tampered') : data)
        .digest('hex')
      writeFileSync(path.join(stage, `${n}.checksum`), h)
      order.push(`${n}.checksum`)
    } else if (c === 'xxhash' || c === 'badxxhash') {
      writeFileSync(path.join(stage, `${n}.xxhash`), xxh64Upper(c === 'badxxhash' ? Buffer.from('tampered') : data))
      order.push(`${n}.xxhash`)
    }
    if (b.companionFirst && order.length > at + 1) order.splice(at, 2, order[at + 1]!, n)
  }
  const out = path.join(root, `${name}.xva`)
  execFileSync('tar', ['-cf', out, '--no-recursion', '--format=gnu', '-C', stage, ...order])
  rmSync(stage, { recursive: true, force: true })
  return out
}

const GOOD: BlockSpec[] = [
  { dir: 'Ref:3', index: 0 },
  { dir: 'Ref:3', index: 2 },
  { dir: 'Ref:3', index: 7 },
  { dir: 'Ref:5', index: 0 },
  { dir: 'Ref:5', index: 3, size: MiB / 2 }, // last chunk of a 3.5 MiB disk
]

describe('parseOvaXml', () => {
  test('VM, VBDs, VDIs, VIFs, firmware and OS hint from a xapi-style ova.xml', () => {
    const d = parseOvaXml(ovaXml(), 'ova.xml')
    expect(d.version.get('product_brand')).toBe('XCP-ng')
    expect(d.version.get('xapi_major')).toBe('1')
    expect(d.objects.length).toBe(9)
    const vm = d.vm
    expect(vm.id).toBe('Ref:0')
    expect(vm.name_label).toBe('win & data')
    expect(vm.memory_static_max).toBe(4 * 1024 * MiB)
    expect(vm.vcpus_max).toBe(4)
    expect(vm.cores_per_socket).toBe(2)
    expect(vm.firmware).toBe('efi')
    expect(vm.secure_boot).toBe(true)
    expect(vm.hvm).toBe(true)
    expect(vm.os_hint).toBe('Windows Server 2019 (64-bit)')
    expect(vm.os_hint_source).toBe('other_config:base_template_name')
    expect(vm.vbds.map((v) => [v.userdevice, v.type, v.vdi, v.bootable])).toEqual([
      ['0', 'Disk', 'Ref:3', true],
      ['1', 'Disk', 'Ref:5', false],
      ['3', 'CD', null, false],
    ])
    expect([...vm.vdis.values()]).toEqual([
      { id: 'Ref:5', name_label: 'data', virtual_size: 3.5 * MiB },
      { id: 'Ref:3', name_label: 'system disk', virtual_size: 8 * MiB },
    ])
    expect(vm.vifs).toEqual([{ id: 'Ref:20', device: '0', mac: 'aa:bb:cc:00:11:22', network: 'Pool-wide network associated with eth0' }])
    expect(d.warnings).toEqual([])
  })

  test('XML-RPC scalar types decode', () => {
    const v = decodeXmlRpcValue(
      parseXmlDocument(
        '<value><array><data><value><int>-7</int></value><value><boolean>1</boolean></value><value><double>1.5</double></value><value><nil/></value><value>plain</value><value><string>s</string></value></data></array></value>',
        't',
      ),
      't',
    )
    expect(v).toEqual([-7, true, 1.5, null, 'plain', 's'])
  })

  test('not XML-RPC, DOCTYPE, no VM, bad sizes -> E_MIG_MALFORMED_ARCHIVE', () => {
    const bad = [
      '<?xml version="1.0"?><methodCall><methodName>x</methodName></methodCall>',
      '<value><struct><member><name>version</name><value>1</value></member></struct></value>',
      '<value><struct><member><name>objects</name><value><array><data><value><unknowntype>1</unknowntype></value></data></array></value></member></struct></value>',
      '<!DOCTYPE value [<!ENTITY x "y">]><value>&x;</value>',
      '<value><struct><member><name>objects</name><value><array><data></data></array></value></member></struct></value>',
      ovaXml({ vdi5Size: '-1' }),
      ovaXml({ vdi5Size: '99999999999999999999' }),
      ovaXml().replace('<value>4294967296</value>', '<value>lots</value>'),
      'not xml at all',
    ]
    for (const x of bad) {
      expectMig(
        caught(() => parseOvaXml(x, 'ova.xml')),
        'E_MIG_MALFORMED_ARCHIVE',
      )
    }
  })
})

describe('verifyXvaBlocks', () => {
  const sizes = new Map([
    ['Ref:3', 8 * MiB],
    ['Ref:5', 3.5 * MiB],
  ])

  test('all SHA-1 companions verified; a byte budget defers the rest', async () => {
    const xva = makeXva('verify', GOOD)
    const members = await listTarMembers(xva)
    const all = await verifyXvaBlocks(xva, members, { vdiSizes: sizes })
    expect(all.verified).toBe(5)
    expect(all.verifiedBytes).toBe(4.5 * MiB)
    expect(all.deferred).toEqual([])
    expect(all.dirs.get('Ref:3')!.blocks.map((b) => b.index)).toEqual([0, 2, 7])
    expect(all.dirs.get('Ref:5')!.bytes).toBe(1.5 * MiB)
    const some = await verifyXvaBlocks(xva, members, { vdiSizes: sizes, maxBytes: 2 * MiB })
    expect(some.verified).toBe(2)
    expect(some.deferred).toEqual(['Ref:3/00000007', 'Ref:5/00000000', 'Ref:5/00000003'])
    expect(some.warnings[0]).toContain('3 blocks')
  })

  test('.xxhash (XXH64) companions are verified; blocks without a companion unchecked', async () => {
    const xva = makeXva('xxh', [
      { dir: 'Ref:3', index: 0, companion: 'xxhash' },
      { dir: 'Ref:3', index: 7, companion: 'none' },
      { dir: 'Ref:5', index: 3, size: MiB / 2 },
    ])
    const r = await verifyXvaBlocks(xva, await listTarMembers(xva), { vdiSizes: sizes })
    expect(r.verified).toBe(2)
    expect(r.dirs.get('Ref:3')!.blocks[0]!.checksum?.algorithm).toBe('xxh64')
    expect(r.unchecked).toEqual(['Ref:3/00000007'])
    expect(r.warnings).toEqual(['1 blocks have no checksum companion'])
  })

  test('XXH64 is xapi\'s: seed 0, 16 hex digits in either case (known values of the empty input and "abc")', async () => {
    const block: XvaBlock = {
      index: 0,
      member: { name: 'Ref:1/00000000' } as TarMember,
      checksum: { algorithm: 'xxh64', member: { name: 'Ref:1/00000000.xxhash' } as TarMember },
    }
    await checkXvaBlock('t.xva', block, new Uint8Array(0), 'EF46DB3751D8E999\n')
    await checkXvaBlock('t.xva', block, Buffer.from('abc'), '44bc2cf5ad770999')
    const wrong = (await thrown(() => checkXvaBlock('t.xva', block, Buffer.from('abd'), '44BC2CF5AD770999'))) as MigError
    expectMig(wrong, 'E_MIG_MALFORMED_ARCHIVE')
    expect(wrong.message).toContain('block Ref:1/00000000: XXH64')
    expect(wrong.details).toMatchObject({ member: 'Ref:1/00000000', expected: '44bc2cf5ad770999' })
    for (const text of ['EF46DB3751D8E99', 'EF46DB3751D8E999A', 'XF46DB3751D8E999', ''])
      expectMig(await thrown(() => checkXvaBlock('t.xva', block, new Uint8Array(0), text)), 'E_MIG_MALFORMED_ARCHIVE')
    // Under Node the check hashes with hash-wasm, set up the same way (seed 0, hex digest).
    const wasm = await createXXHash64(0, 0)
    expect([new Uint8Array(0), Buffer.from('abc')].map((d) => wasm.init().update(d).digest('hex'))).toEqual(['ef46db3751d8e999', '44bc2cf5ad770999'])
  })

  test('a bad .xxhash -> E_MIG_MALFORMED_ARCHIVE naming the block', async () => {
    const xva = makeXva('badxxh', [GOOD[0]!, { dir: 'Ref:3', index: 2, companion: 'badxxhash' }])
    const err = (await thrown(async () => verifyXvaBlocks(xva, await listTarMembers(xva), { vdiSizes: sizes }))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('block Ref:3/00000002: XXH64')
  })

  test('xapi keep-alive: a zero-length chunk and its companion, re-sent in full later, are skipped', async () => {
    const xva = makeXva('keepalive', [GOOD[0]!])
    const ka = path.join(root, 'ka.stage')
    mkdirSync(path.join(ka, 'Ref:3'), { recursive: true })
    writeFileSync(path.join(ka, 'Ref:3/00000002'), '')
    writeFileSync(path.join(ka, 'Ref:3/00000002.xxhash'), 'EF46DB3751D8E999')
    execFileSync('tar', ['-rf', xva, '--no-recursion', '--format=gnu', '-C', ka, 'Ref:3/00000002', 'Ref:3/00000002.xxhash'])
    const full = block('Ref:3', 2)
    writeFileSync(path.join(ka, 'Ref:3/00000002'), full)
    writeFileSync(path.join(ka, 'Ref:3/00000002.checksum'), createHash('sha1').update(full).digest('hex'))
    execFileSync('tar', ['-rf', xva, '--no-recursion', '--format=gnu', '-C', ka, 'Ref:3/00000002', 'Ref:3/00000002.checksum'])
    const members = await listTarMembers(xva)
    expect(members.filter((m) => m.name === 'Ref:3/00000002').map((m) => m.size)).toEqual([0, MiB])
    const r = await verifyXvaBlocks(xva, members, { vdiSizes: sizes })
    expect(r.dirs.get('Ref:3')!.blocks.map((b) => [b.index, b.member.size, b.checksum?.algorithm])).toEqual([
      [0, MiB, 'sha1'],
      [2, MiB, 'sha1'],
    ])
    expect(r.verified).toBe(2)
  })

  test("a companion stored before its block is its block's (no keep-alive of that name): verified, and a bad one still refused", async () => {
    const xva = makeXva('before', [GOOD[0]!, { dir: 'Ref:3', index: 2, companionFirst: true }])
    const members = await listTarMembers(xva)
    expect(members.map((m) => m.name).slice(-2)).toEqual(['Ref:3/00000002', 'Ref:3/00000002.checksum'].reverse())
    const r = await verifyXvaBlocks(xva, members, { vdiSizes: sizes })
    expect(r.verified).toBe(2)
    expect(r.dirs.get('Ref:3')!.blocks.map((b) => b.checksum?.member.name)).toEqual(['Ref:3/00000000.checksum', 'Ref:3/00000002.checksum'])
    const bad = makeXva('before-bad', [GOOD[0]!, { dir: 'Ref:3', index: 2, companion: 'bad', companionFirst: true }])
    const err = (await thrown(async () => verifyXvaBlocks(bad, await listTarMembers(bad), { vdiSizes: sizes }))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('Ref:3/00000002')
  })

  test('a bad .checksum -> E_MIG_MALFORMED_ARCHIVE naming the block', async () => {
    const xva = makeXva('badsum', [GOOD[0]!, { dir: 'Ref:3', index: 2, companion: 'bad' }])
    const err = (await thrown(async () => verifyXvaBlocks(xva, await listTarMembers(xva), { vdiSizes: sizes }))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('Ref:3/00000002')
    expect(err.details).toMatchObject({ member: 'Ref:3/00000002' })
  })

  test('block number beyond the virtual size, oversized and short blocks -> E_MIG_MALFORMED_ARCHIVE naming the block', async () => {
    for (const [name, spec, needle] of [
      ['beyond', { dir: 'Ref:5', index: 4 }, 'Ref:5/00000004'],
      ['big', { dir: 'Ref:3', index: 1, size: MiB + 512 }, 'Ref:3/00000001'],
      ['short', { dir: 'Ref:3', index: 1, size: MiB / 2 }, 'Ref:3/00000001'],
      ['lastlong', { dir: 'Ref:5', index: 3, size: MiB }, 'Ref:5/00000003'],
    ] as const) {
      const xva = makeXva(name, [GOOD[0]!, spec])
      const err = (await thrown(async () => verifyXvaBlocks(xva, await listTarMembers(xva), { vdiSizes: sizes }))) as MigError
      expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
      expect(err.message).toContain(needle)
    }
  })
})

describe('xva_archive importer', () => {
  test('two disks as xva_blocks sources, in userdevice order, with allocation from present blocks', async () => {
    const xva = makeXva('vm', GOOD)
    const man = VmManifest.parse(await importer.inspect(xva, ctx()))
    expect(man.name).toBe('win & data')
    expect(man.source_format).toBe('xva_archive')
    expect(man.guest_os).toEqual({ family: 'windows', id: 'Windows Server 2019 (64-bit)' })
    expect(man.firmware).toBe('efi')
    expect(man.secure_boot).toBe(true)
    expect(man.cpu).toEqual({ count: 4, cores_per_socket: 2 })
    expect(man.memory_bytes).toBe(4 * 1024 * MiB)
    expect(man.disks).toEqual([
      {
        label: 'system_disk',
        capacity_bytes: 8 * MiB,
        allocated_bytes: 3 * MiB,
        disk_format: 'raw',
        source: { path: xva, member: 'Ref:3', layout: 'xva_blocks' },
        controller: 'xen',
        address: '0',
      },
      {
        label: 'data',
        capacity_bytes: 3.5 * MiB,
        allocated_bytes: 1.5 * MiB,
        disk_format: 'raw',
        source: { path: xva, member: 'Ref:5', layout: 'xva_blocks' },
        controller: 'xen',
        address: '1',
      },
    ])
    expect(man.nics).toEqual([{ label: 'nic0', mac: 'aa:bb:cc:00:11:22', model: 'e1000', network: 'Pool-wide network associated with eth0' }])
    expect(man.cbt_available).toBe(false)
  })

  test('a bad .checksum in the first 64 MiB -> E_MIG_MALFORMED_ARCHIVE naming the block', async () => {
    const xva = makeXva('vm-bad', [GOOD[0]!, GOOD[1]!, { dir: 'Ref:5', index: 0, companion: 'bad' }])
    const err = (await thrown(() => importer.inspect(xva, ctx()))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('Ref:5/00000000')
  })

  test('an ova.xml that is not XML-RPC -> E_MIG_MALFORMED_ARCHIVE', async () => {
    const xva = makeXva('notrpc', GOOD, '<?xml version="1.0"?><Envelope><VirtualSystem/></Envelope>')
    const err = (await thrown(() => importer.inspect(xva, ctx()))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('XML-RPC')
  })

  test('a block number beyond the virtual size -> E_MIG_MALFORMED_ARCHIVE', async () => {
    const xva = makeXva('vm-beyond', [...GOOD, { dir: 'Ref:3', index: 8 }])
    const err = (await thrown(() => importer.inspect(xva, ctx()))) as MigError
    expectMig(err, 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toContain('Ref:3/00000008')
  })

  test('a tar without ova.xml -> E_MIG_UNSUPPORTED_FORMAT; not a tar -> E_MIG_MALFORMED_ARCHIVE; outside the root -> E_MIG_HOST_PATH_REJECTED', async () => {
    const stage = path.join(root, 'noova')
    mkdirSync(stage, { recursive: true })
    writeFileSync(path.join(stage, 'readme'), 'x')
    const t = path.join(root, 'noova.xva')
    execFileSync('tar', ['-cf', t, '-C', stage, 'readme'])
    expectMig(await thrown(() => importer.inspect(t, ctx())), 'E_MIG_UNSUPPORTED_FORMAT')
    const junk = path.join(root, 'junk.xva')
    writeFileSync(junk, Buffer.alloc(4096, 0x41))
    expectMig(await thrown(() => importer.inspect(junk, ctx())), 'E_MIG_MALFORMED_ARCHIVE')
    expectMig(await thrown(() => importer.inspect('/etc/passwd', ctx())), 'E_MIG_HOST_PATH_REJECTED')
  })
})
