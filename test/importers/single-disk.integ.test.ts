/**
 * The single-disk importers (`qcow2`, `vhdx` for VHDX and VHD) on corpus images and images made
 * here. qemu 7.2 cannot create differencing VHDX or VHD images (`qemu-img create -f vhdx -b`
 * fails: "Backing file not supported for file format 'vhdx'"), so differencing children are made
 * by patching qemu-made images per MS-VHDX 2.6.2.6 (HasParent + Parent Locator item) and the VHD
 * specification (disk type 4 + parent unicode name).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { closeSync, copyFileSync, mkdirSync, openSync, readFileSync, readSync, statSync, writeFileSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { gunzipSync } from 'node:zlib'
import { MigError } from '../../lib/errors.ts'
import { readVhdInfo } from '../../lib/formats/vhd.ts'
import { readVhdxInfo } from '../../lib/formats/vhdx.ts'
import { inspectInput } from '../../lib/importers/index.ts'
import { DEFAULTS_WARNING, importer as qcow2 } from '../../lib/importers/qcow2.ts'
import { importer as vhdx } from '../../lib/importers/vhdx.ts'
import { VmManifest } from '../../lib/manifest.ts'
import { CORPUS, tempDir, thrown } from '../helpers/tmp.ts'
import { setVhdxLogGuid } from '../helpers/vhdx-log.ts'
import { guidBytes } from '../helpers/guid.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-single-')
const ROOT = path.join(tmp.dir, 'root')
const ctx = { importRoot: ROOT }
const p = (...parts: string[]): string => path.join(ROOT, ...parts)
const qemuImg = (args: string[], cwd = ROOT): void => {
  execFileSync('qemu-img', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] })
}
const allocated = (f: string): number => statSync(f).blocks * 512

async function expectCode(fn: () => Promise<unknown>, code: string): Promise<MigError> {
  const err = await thrown(fn)
  expect(err).toBeInstanceOf(MigError)
  expect(err.code).toBe(code)
  return err
}

/**
 * Turns the qemu-made dynamic VHDX `file` into a differencing child: sets HasParent in File
 * Parameters and adds a required Parent Locator item holding `entries` (MS-VHDX 2.6.2.6).
 */
function makeVhdxChild(file: string, entries: Record<string, string>): void {
  const fd = openSync(file, 'r+')
  try {
    const rt = Buffer.alloc(64 * 1024)
    readSync(fd, rt, 0, rt.length, 192 * 1024)
    const metaGuid = guidBytes('8B7CA206-4790-4B9A-B8FE-575F050F886E')
    let meta = -1
    for (let i = 0; i < rt.readUInt32LE(8); i++) if (rt.subarray(16 + i * 32, 32 + i * 32).equals(metaGuid)) meta = Number(rt.readBigUInt64LE(16 + i * 32 + 16))
    if (meta < 0) throw new Error('no metadata region')
    const mt = Buffer.alloc(64 * 1024)
    readSync(fd, mt, 0, mt.length, meta)
    const count = mt.readUInt16LE(10)
    let end = 0
    const fpGuid = guidBytes('CAA16737-FA36-4D43-B3B6-33F0AA44E76B')
    for (let i = 0; i < count; i++) {
      const at = 32 + i * 32
      const off = mt.readUInt32LE(at + 16)
      const len = mt.readUInt32LE(at + 20)
      end = Math.max(end, off + len)
      if (mt.subarray(at, at + 16).equals(fpGuid)) {
        const fp = Buffer.alloc(8)
        readSync(fd, fp, 0, 8, meta + off)
        fp.writeUInt32LE(fp.readUInt32LE(4) | 2, 4) // HasParent
        writeSync(fd, fp, 0, 8, meta + off)
      }
    }
    // Parent locator: header, 12-byte entries, then UTF-16LE strings.
    const keys = Object.keys(entries)
    const strings: Buffer[] = []
    const table = Buffer.alloc(20 + keys.length * 12)
    guidBytes('B04AEFB7-D19E-4A81-B789-25B8E9445913').copy(table, 0)
    table.writeUInt16LE(keys.length, 18)
    let cursor = table.length
    keys.forEach((k, i) => {
      const kb = Buffer.from(k, 'utf16le')
      const vb = Buffer.from(entries[k]!, 'utf16le')
      table.writeUInt32LE(cursor, 20 + i * 12)
      table.writeUInt32LE(cursor + kb.length, 20 + i * 12 + 4)
      table.writeUInt16LE(kb.length, 20 + i * 12 + 8)
      table.writeUInt16LE(vb.length, 20 + i * 12 + 10)
      strings.push(kb, vb)
      cursor += kb.length + vb.length
    })
    const item = Buffer.concat([table, ...strings])
    const itemOff = Math.ceil(end / 8) * 8
    writeSync(fd, item, 0, item.length, meta + itemOff)
    const entry = Buffer.alloc(32)
    guidBytes('A8D35F2D-B30B-454D-ABF7-D3D84834AB0C').copy(entry, 0)
    entry.writeUInt32LE(itemOff, 16)
    entry.writeUInt32LE(item.length, 20)
    entry.writeUInt32LE(4, 24) // IsRequired
    writeSync(fd, entry, 0, 32, meta + 32 + count * 32)
    const cnt = Buffer.alloc(2)
    cnt.writeUInt16LE(count + 1)
    writeSync(fd, cnt, 0, 2, meta + 10)
  } finally {
    closeSync(fd)
  }
}

/** VHD one's-complement checksum of `buf` with the field at `at` skipped. */
function vhdSum(buf: Buffer, at: number): number {
  let s = 0
  for (let i = 0; i < buf.length; i++) if (i < at || i >= at + 4) s = (s + buf[i]!) >>> 0
  return ~s >>> 0
}

/** Turns the qemu-made dynamic VHD `file` into a differencing disk naming `parentName` with parent unique id `parentId` (hex). */
function makeVhdChild(file: string, parentName: string, parentId: string): void {
  const size = statSync(file).size
  const fd = openSync(file, 'r+')
  try {
    const footer = Buffer.alloc(512)
    readSync(fd, footer, 0, 512, size - 512)
    footer.writeUInt32BE(4, 60)
    footer.writeUInt32BE(vhdSum(footer, 64), 64)
    writeSync(fd, footer, 0, 512, size - 512)
    writeSync(fd, footer, 0, 512, 0)
    const dhOff = Number(footer.readBigUInt64BE(16))
    const dh = Buffer.alloc(1024)
    readSync(fd, dh, 0, 1024, dhOff)
    Buffer.from(parentId, 'hex').copy(dh, 40)
    dh.fill(0, 64, 576)
    Buffer.from(parentName, 'utf16le').swap16().copy(dh, 64)
    dh.writeUInt32BE(vhdSum(dh, 36), 36)
    writeSync(fd, dh, 0, 1024, dhOff)
  } finally {
    closeSync(fd)
  }
}

beforeAll(() => {
  mkdirSync(p('chain'), { recursive: true })
  for (const i of [1, 2, 3])
    writeFileSync(p('chain', `backing-chain-${i}.qcow2`), gunzipSync(readFileSync(path.join(CORPUS, `dissect.hypervisor/backing-chain-${i}.qcow2.gz`))))
  writeFileSync(p('fixed.vhdx'), gunzipSync(readFileSync(path.join(CORPUS, 'dissect.hypervisor/fixed.vhdx.gz'))))
  writeFileSync(p('fixed.vhd'), gunzipSync(readFileSync(path.join(CORPUS, 'dissect.hypervisor/fixed.vhd.gz'))))
  copyFileSync(path.join(CORPUS, 'vagrant-mutate/kvm-box-disk1.qcow2'), p('kvm-box-disk1.qcow2'))
  qemuImg(['create', '-q', '-f', 'vhdx', 'dyn.vhdx', '32M'])
  qemuImg(['create', '-q', '-f', 'vpc', '-o', 'subformat=dynamic', 'dyn.vhd', '10M'])
  qemuImg(['create', '-q', '-f', 'qcow2', 'outside.qcow2', '1M'], tmp.dir)
  qemuImg(['create', '-q', '-f', 'qcow2', '-b', '../outside.qcow2', '-F', 'qcow2', 'escapes.qcow2', '1M'])

  // VHDX differencing chains (Hyper-V layout: child in a subfolder, parent beside it).
  mkdirSync(p('hv', 'snap'), { recursive: true })
  qemuImg(['create', '-q', '-f', 'vhdx', 'hv/base.vhdx', '16M'])
  qemuImg(['create', '-q', '-f', 'vhdx', 'hv/snap/child.vhdx', '16M'])
  qemuImg(['create', '-q', '-f', 'vhdx', 'hv/snap/by-abs.vhdx', '16M'])
  qemuImg(['create', '-q', '-f', 'vhdx', 'hv/snap/stale.vhdx', '16M'])
  qemuImg(['create', '-q', '-f', 'vhdx', 'hv/snap/escape.vhdx', '16M'])
  qemuImg(['create', '-q', '-f', 'vpc', '-o', 'subformat=dynamic', 'hv/base.vhd', '8M'])
  qemuImg(['create', '-q', '-f', 'vpc', '-o', 'subformat=dynamic', 'hv/child.vhd', '8M'])
})

afterAll(() => tmp.cleanup())

describe('qcow2 importer', () => {
  test('corpus kvm-box-disk1.qcow2: one 4 MiB virtio disk with defaults', async () => {
    const f = p('kvm-box-disk1.qcow2')
    const m = await qcow2.inspect(f, ctx)
    expect(VmManifest.safeParse(m).success).toBe(true)
    expect(m).toEqual({
      name: 'kvm-box-disk1',
      source_format: 'qcow2',
      guest_os: { family: 'unknown', id: null },
      firmware: 'bios',
      secure_boot: false,
      cpu: { count: 1, cores_per_socket: 1 },
      memory_bytes: 2 * 1024 * MiB,
      disks: [
        {
          label: 'kvm-box-disk1',
          capacity_bytes: 4194304,
          allocated_bytes: allocated(f),
          disk_format: 'qcow2',
          source: { path: f },
          controller: 'virtio',
          address: '0',
        },
      ],
      nics: [],
      cbt_available: false,
      warnings: [DEFAULTS_WARNING],
    })
    expect(m.warnings[0]).toContain('CPU')
    expect(m.warnings[0]).toContain('memory')
    expect(m.warnings[0]).toContain('firmware')
    expect(m.warnings[0]).toContain('guest OS')
  })

  test('corpus backing chain 1 -> 2 -> 3: absolute backing_chain, nearest first', async () => {
    const m = await qcow2.inspect(p('chain', 'backing-chain-1.qcow2'), ctx)
    expect(m.name).toBe('backing-chain-1')
    expect(m.disks[0]!.capacity_bytes).toBe(512 * MiB)
    expect(m.disks[0]!.allocated_bytes).toBe(allocated(p('chain', 'backing-chain-1.qcow2')))
    expect(m.disks[0]!.backing_chain).toEqual([p('chain', 'backing-chain-2.qcow2'), p('chain', 'backing-chain-3.qcow2')])
  })

  test('inspectInput detects and inspects an unlabelled qcow2', async () => {
    const r = await inspectInput(p('chain', 'backing-chain-2.qcow2'), ctx)
    expect(r.detected_kind).toBe('qcow2')
    expect(r.manifest.disks[0]!.backing_chain).toEqual([p('chain', 'backing-chain-3.qcow2')])
  })

  test('a backing file outside the root is E_MIG_HOST_PATH_REJECTED', async () => {
    await expectCode(() => qcow2.inspect(p('escapes.qcow2'), ctx), 'E_MIG_HOST_PATH_REJECTED')
  })

  test('non-qcow2 inputs are E_MIG_UNSUPPORTED_FORMAT (legacy qcow v1 included)', async () => {
    await expectCode(() => qcow2.inspect(p('fixed.vhdx'), ctx), 'E_MIG_UNSUPPORTED_FORMAT')
    await expectCode(
      () => qcow2.inspect(path.join(CORPUS, 'containerized-data-importer/invalid-qcow-large-size.img'), { importRoot: CORPUS }),
      'E_MIG_UNSUPPORTED_FORMAT',
    )
  })
})

describe('vhdx importer (VHDX and VHD)', () => {
  test('corpus fixed.vhdx: 10 MiB vhdx disk', async () => {
    const m = await vhdx.inspect(p('fixed.vhdx'), ctx)
    expect(VmManifest.safeParse(m).success).toBe(true)
    expect(m.source_format).toBe('vhdx')
    expect(m.name).toBe('fixed')
    expect(m.disks).toEqual([
      {
        label: 'fixed',
        capacity_bytes: 10 * MiB,
        allocated_bytes: allocated(p('fixed.vhdx')),
        disk_format: 'vhdx',
        source: { path: p('fixed.vhdx') },
        controller: 'virtio',
        address: '0',
      },
    ])
    expect(m.firmware).toBe('bios')
    expect(m.memory_bytes).toBe(2 * 1024 * MiB)
    expect(m.nics).toEqual([])
    expect(m.warnings).toEqual([DEFAULTS_WARNING])
  })

  test('corpus fixed.vhd: 10 MiB vpc disk', async () => {
    const m = await vhdx.inspect(p('fixed.vhd'), ctx)
    expect(m.disks[0]).toMatchObject({ label: 'fixed', capacity_bytes: 10 * MiB, disk_format: 'vpc', allocated_bytes: allocated(p('fixed.vhd')) })
  })

  test('generated dynamic VHDX and VHD', async () => {
    expect((await vhdx.inspect(p('dyn.vhdx'), ctx)).disks[0]).toMatchObject({ capacity_bytes: 32 * MiB, disk_format: 'vhdx' })
    expect((await vhdx.inspect(p('dyn.vhd'), ctx)).disks[0]).toMatchObject({ capacity_bytes: 10514432, disk_format: 'vpc' })
  })

  test('differencing VHDX: parent locator read, chain from relative_path', async () => {
    const parent = await readVhdxInfo(p('hv', 'base.vhdx'))
    const child = p('hv', 'snap', 'child.vhdx')
    makeVhdxChild(child, {
      parent_linkage: `{${parent.data_write_guid.toLowerCase()}}`,
      relative_path: '..\\base.vhdx',
      absolute_win32_path: 'D:\\Hyper-V\\Disks\\base.vhdx',
    })
    const info = await readVhdxInfo(child)
    expect(info.has_parent).toBe(true)
    expect(info.parent_locator).toEqual(
      Object.assign(Object.create(null), {
        parent_linkage: `{${parent.data_write_guid.toLowerCase()}}`,
        relative_path: '..\\base.vhdx',
        absolute_win32_path: 'D:\\Hyper-V\\Disks\\base.vhdx',
      }),
    )
    const m = await vhdx.inspect(child, ctx)
    expect(m.disks[0]!.backing_chain).toEqual([p('hv', 'base.vhdx')])
    expect(m.disks[0]!.capacity_bytes).toBe(16 * MiB)
    expect(m.disks[0]!.allocated_bytes).toBeUndefined()
    expect(m.warnings[1]).toContain('differencing')
  })

  test('differencing VHDX: falls back to the file name of absolute_win32_path', async () => {
    const parent = await readVhdxInfo(p('hv', 'base.vhdx'))
    copyFileSync(p('hv', 'base.vhdx'), p('hv', 'snap', 'base-copy.vhdx'))
    makeVhdxChild(p('hv', 'snap', 'by-abs.vhdx'), {
      parent_linkage: `{${parent.data_write_guid}}`,
      relative_path: '.\\missing.vhdx',
      absolute_win32_path: 'C:\\VMs\\base-copy.vhdx',
    })
    const m = await vhdx.inspect(p('hv', 'snap', 'by-abs.vhdx'), ctx)
    expect(m.disks[0]!.backing_chain).toEqual([p('hv', 'snap', 'base-copy.vhdx')])
  })

  test('differencing VHDX: a stale parent_linkage is E_MIG_MALFORMED_ARCHIVE, an escaping locator E_MIG_HOST_PATH_REJECTED', async () => {
    makeVhdxChild(p('hv', 'snap', 'stale.vhdx'), { parent_linkage: '{00000000-1111-2222-3333-444444444444}', relative_path: '..\\base.vhdx' })
    expect((await expectCode(() => vhdx.inspect(p('hv', 'snap', 'stale.vhdx'), ctx), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain('DataWriteGuid')
    makeVhdxChild(p('hv', 'snap', 'escape.vhdx'), { parent_linkage: '{00000000-1111-2222-3333-444444444444}', relative_path: '..\\..\\..\\outside.vhdx' })
    await expectCode(() => vhdx.inspect(p('hv', 'snap', 'escape.vhdx'), ctx), 'E_MIG_HOST_PATH_REJECTED')
  })

  test('differencing VHD: chain from the parent unicode name, checked against the parent unique id', async () => {
    const base = await readVhdInfo(p('hv', 'base.vhd'))
    expect(base.unique_id).toMatch(/^[0-9a-f]{32}$/)
    makeVhdChild(p('hv', 'child.vhd'), 'C:\\VMs\\base.vhd', base.unique_id)
    const info = await readVhdInfo(p('hv', 'child.vhd'))
    expect(info.disk_type).toBe('differencing')
    expect(info.parent_name).toBe('C:\\VMs\\base.vhd')
    expect(info.parent_unique_id).toBe(base.unique_id)
    const m = await vhdx.inspect(p('hv', 'child.vhd'), ctx)
    expect(m.disks[0]).toMatchObject({ disk_format: 'vpc', capacity_bytes: 8390656, backing_chain: [p('hv', 'base.vhd')] })
    expect(m.warnings[1]).toContain('ignores a differencing VHD')

    makeVhdChild(p('hv', 'child.vhd'), 'base.vhd', '00'.repeat(16))
    expect((await expectCode(() => vhdx.inspect(p('hv', 'child.vhd'), ctx), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain('unique id')
  })

  test('a VHDX with an unreplayed log is E_MIG_MALFORMED_ARCHIVE', async () => {
    const f = p('dirty-log.vhdx')
    copyFileSync(p('fixed.vhdx'), f)
    setVhdxLogGuid(f)
    expect((await readVhdxInfo(f)).needs_log_replay).toBe(true)
    expect((await expectCode(() => vhdx.inspect(f, ctx), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain('log')
  })

  test('a qcow2 is E_MIG_UNSUPPORTED_FORMAT for the vhdx importer', async () => {
    const err = await expectCode(() => vhdx.inspect(p('kvm-box-disk1.qcow2'), ctx), 'E_MIG_UNSUPPORTED_FORMAT')
    expect(err.message).toContain('neither a VHDX')
  })
})
