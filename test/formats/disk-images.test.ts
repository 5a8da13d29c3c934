/**
 * Disk image header readers (qcow2, VHDX, VHD, VDI) and `qemu-img info`, against the shared
 * corpus and images made with `qemu-img create` here. Values were read by hand from the files
 * (`xxd`, `qemu-img info`).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, closeSync, copyFileSync, mkdirSync, openSync, readFileSync, readSync, statSync, truncateSync, writeFileSync, writeSync } from 'node:fs'
import * as path from 'node:path'
import { gunzipSync } from 'node:zlib'
import { MigError } from '../../lib/errors.ts'
import { qemuImgInfo, qemuInfoArgs } from '../../lib/formats/qemu-info.ts'
import { QCOW2_MAX_VIRTUAL_SIZE, readQcow2Header, resolveQcow2BackingChain } from '../../lib/formats/qcow2.ts'
import { crc32c, readVhdxInfo, VHDX_MAX_VIRTUAL_SIZE } from '../../lib/formats/vhdx.ts'
import { readVhdInfo, VHD_MAX_VIRTUAL_SIZE } from '../../lib/formats/vhd.ts'
import { readVdiInfo, VDI_MAX_DISK_SIZE } from '../../lib/formats/vdi.ts'
import { CORPUS, tempDir, thrown } from '../helpers/tmp.ts'
import { writeAt } from '../helpers/reader-fixtures.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-disk-')
const ROOT = path.join(tmp.dir, 'root')
const OUT = tmp.dir // parent of the import root, holds files outside it
const ctx = { importRoot: ROOT }

function qemuImg(args: string[], cwd = ROOT): void {
  execFileSync('qemu-img', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] })
}

function gunzipTo(corpusRel: string, dest: string): string {
  writeFileSync(dest, gunzipSync(readFileSync(path.join(CORPUS, corpusRel))))
  return dest
}

/** First `n` bytes of `src` written to a new file. */
function truncatedCopy(src: string, n: number, dest: string): string {
  const buf = Buffer.alloc(n)
  const fd = openSync(src, 'r')
  readSync(fd, buf, 0, n, 0)
  closeSync(fd)
  writeFileSync(dest, buf)
  return dest
}

async function expectCode(p: Promise<unknown>, code: string): Promise<MigError> {
  const err = await thrown(() => p)
  expect(err).toBeInstanceOf(MigError)
  expect(err.code).toBe(code)
  return err
}

beforeAll(() => {
  mkdirSync(ROOT, { recursive: true })
  for (const i of [1, 2, 3]) gunzipTo(`dissect.hypervisor/backing-chain-${i}.qcow2.gz`, path.join(ROOT, `backing-chain-${i}.qcow2`))
  gunzipTo('dissect.hypervisor/fixed.vhdx.gz', path.join(ROOT, 'fixed.vhdx'))
  gunzipTo('dissect.hypervisor/fixed.vhd.gz', path.join(ROOT, 'fixed.vhd'))
  qemuImg(['create', '-q', '-f', 'qcow2', 'v3.qcow2', '10M'])
  qemuImg(['create', '-q', '-f', 'qcow2', '-o', 'compat=0.10,cluster_size=4096', 'v2.qcow2', '3M'])
  qemuImg(['create', '-q', '-f', 'qcow2', '-o', 'cluster_size=2M,lazy_refcounts=on', 'big-cluster.qcow2', '100G'])
  qemuImg(['create', '-q', '-f', 'vhdx', '-o', 'block_size=1M', 'dyn.vhdx', '64M'])
  qemuImg(['create', '-q', '-f', 'vpc', '-o', 'subformat=dynamic', 'dyn.vhd', '10M'])
  qemuImg(['create', '-q', '-f', 'vpc', '-o', 'subformat=dynamic,force_size=on', 'forced.vhd', '10M'])
  qemuImg(['create', '-q', '-f', 'vpc', '-o', 'subformat=fixed', 'fixed-qemu.vhd', '4M'])
  qemuImg(['create', '-q', '-f', 'vdi', 'dyn.vdi', '10M'])
  qemuImg(['create', '-q', '-f', 'vdi', '-o', 'static=on', 'static.vdi', '3M'])
})

afterAll(() => tmp.cleanup())

describe('qcow2 header (docs/interop/qcow2.txt)', () => {
  test('corpus vagrant-mutate/kvm-box-disk1.qcow2: v3, 4 MiB, 64 KiB clusters, no backing file', async () => {
    const h = await readQcow2Header(path.join(CORPUS, 'vagrant-mutate/kvm-box-disk1.qcow2'))
    expect(h.version).toBe(3)
    expect(h.virtual_size).toBe(4194304)
    expect(h.cluster_bits).toBe(16)
    expect(h.cluster_size).toBe(65536)
    expect(h.backing_file).toBeNull()
    expect(h.backing_format).toBeNull()
    expect(h.header_length).toBe(104)
    expect(h.l1_size).toBe(1)
    expect(h.l1_table_offset).toBe(196608)
    expect(h.refcount_order).toBe(4)
    expect(h.file_size).toBe(197120)
    expect(h.dirty).toBe(false)
  })

  test('corpus backing-chain-1: backing file name and format from the header extension', async () => {
    const h = await readQcow2Header(path.join(ROOT, 'backing-chain-1.qcow2'))
    expect(h.version).toBe(3)
    expect(h.virtual_size).toBe(512 * MiB)
    expect(h.backing_file).toBe('backing-chain-2.qcow2')
    expect(h.backing_format).toBe('qcow2')
    expect(h.header_length).toBe(112)
    const base = await readQcow2Header(path.join(ROOT, 'backing-chain-3.qcow2'))
    expect(base.backing_file).toBeNull()
  })

  test('corpus backing chain 1 -> 2 -> 3 resolves inside the root', async () => {
    const chain = await resolveQcow2BackingChain(path.join(ROOT, 'backing-chain-1.qcow2'), ctx)
    expect(chain).toEqual([
      { path: path.join(ROOT, 'backing-chain-2.qcow2'), format: 'qcow2', name: 'backing-chain-2.qcow2' },
      { path: path.join(ROOT, 'backing-chain-3.qcow2'), format: 'qcow2', name: 'backing-chain-3.qcow2' },
    ])
    expect(await resolveQcow2BackingChain(path.join(ROOT, 'backing-chain-3.qcow2'), ctx)).toEqual([])
  })

  test('generated v2 (compat=0.10, 4 KiB clusters) and 2 MiB-cluster dirty v3', async () => {
    const v2 = await readQcow2Header(path.join(ROOT, 'v2.qcow2'))
    expect(v2.version).toBe(2)
    expect(v2.virtual_size).toBe(3 * MiB)
    expect(v2.cluster_bits).toBe(12)
    expect(v2.incompatible_features).toBe('0x0')
    const big = await readQcow2Header(path.join(ROOT, 'big-cluster.qcow2'))
    expect(big.cluster_bits).toBe(21)
    expect(big.virtual_size).toBe(100 * 1024 * MiB)
    expect(big.compatible_features).toBe('0x1') // lazy refcounts
  })

  test('legacy qcow v1 with a 152 TiB size is E_MIG_UNSUPPORTED_FORMAT, without allocating', async () => {
    const before = process.memoryUsage().rss
    const t0 = Date.now()
    const err = await expectCode(readQcow2Header(path.join(CORPUS, 'containerized-data-importer/invalid-qcow-large-size.img')), 'E_MIG_UNSUPPORTED_FORMAT')
    expect(err.message).toContain('version 1')
    expect(Date.now() - t0).toBeLessThan(1000)
    expect(process.memoryUsage().rss - before).toBeLessThan(64 * MiB)
  })

  test('virtual size over 64 TiB and an L1 table outside the file are E_MIG_MALFORMED_ARCHIVE', async () => {
    // A copy of a qemu-written image with one big-endian 64-bit header field set, and the words of the refusal.
    const cases = [
      { name: 'huge.qcow2', from: 'v3.qcow2', field: 24, value: BigInt(QCOW2_MAX_VIRTUAL_SIZE) + 512n, says: '64 TiB' }, // size
      { name: 'l1-out.qcow2', from: 'v3.qcow2', field: 40, value: 1024n * 1024n * 1024n, says: 'L1 table' }, // l1_table_offset
      // 64 TiB needs 256 L1 entries at 2 MiB clusters
      { name: 'l1-small.qcow2', from: 'big-cluster.qcow2', field: 24, value: 64n * 1024n * 1024n * 1024n * 1024n, says: 'cannot map' },
    ]
    for (const c of cases) {
      const img = path.join(ROOT, c.name)
      copyFileSync(path.join(ROOT, c.from), img)
      const b = Buffer.alloc(8)
      b.writeBigUInt64BE(c.value)
      writeAt(img, c.field, b)
      expect((await expectCode(readQcow2Header(img), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain(c.says)
    }
  })

  test('backing file ../outside.qcow2 is E_MIG_HOST_PATH_REJECTED', async () => {
    qemuImg(['create', '-q', '-f', 'qcow2', 'outside.qcow2', '1M'], OUT)
    qemuImg(['create', '-q', '-f', 'qcow2', '-b', '../outside.qcow2', '-F', 'qcow2', 'escapes.qcow2', '1M'])
    expect((await readQcow2Header(path.join(ROOT, 'escapes.qcow2'))).backing_file).toBe('../outside.qcow2')
    await expectCode(resolveQcow2BackingChain(path.join(ROOT, 'escapes.qcow2'), ctx), 'E_MIG_HOST_PATH_REJECTED')
  })

  test('json: and protocol backing names are E_MIG_HOST_PATH_REJECTED', async () => {
    qemuImg(['create', '-q', '-f', 'qcow2', 'proto.qcow2', '1M'])
    qemuImg(['rebase', '-u', '-b', 'nbd://127.0.0.1:10809/x', '-F', 'raw', 'proto.qcow2'])
    await expectCode(resolveQcow2BackingChain(path.join(ROOT, 'proto.qcow2'), ctx), 'E_MIG_HOST_PATH_REJECTED')
  })

  test('a backing loop, a self loop, a missing backing file and a chain deeper than 16 are E_MIG_MALFORMED_ARCHIVE', async () => {
    qemuImg(['create', '-q', '-f', 'qcow2', 'loop-a.qcow2', '1M'])
    qemuImg(['create', '-q', '-f', 'qcow2', 'loop-b.qcow2', '1M'])
    qemuImg(['rebase', '-u', '-b', 'loop-b.qcow2', '-F', 'qcow2', 'loop-a.qcow2'])
    qemuImg(['rebase', '-u', '-b', 'loop-a.qcow2', '-F', 'qcow2', 'loop-b.qcow2'])
    expect((await expectCode(resolveQcow2BackingChain(path.join(ROOT, 'loop-a.qcow2'), ctx), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain('loops')
    qemuImg(['create', '-q', '-f', 'qcow2', 'self.qcow2', '1M'])
    qemuImg(['rebase', '-u', '-b', 'self.qcow2', '-F', 'qcow2', 'self.qcow2'])
    await expectCode(resolveQcow2BackingChain(path.join(ROOT, 'self.qcow2'), ctx), 'E_MIG_MALFORMED_ARCHIVE')
    qemuImg(['create', '-q', '-f', 'qcow2', 'orphan.qcow2', '1M'])
    qemuImg(['rebase', '-u', '-b', 'gone.qcow2', '-F', 'qcow2', 'orphan.qcow2'])
    expect((await expectCode(resolveQcow2BackingChain(path.join(ROOT, 'orphan.qcow2'), ctx), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain('gone.qcow2')

    const deep = path.join(ROOT, 'deep')
    mkdirSync(deep)
    qemuImg(['create', '-q', '-f', 'qcow2', 'd0.qcow2', '1M'], deep)
    for (let i = 1; i <= 17; i++) {
      copyFileSync(path.join(deep, 'd0.qcow2'), path.join(deep, `d${i}.qcow2`))
      qemuImg(['rebase', '-u', '-b', `d${i - 1}.qcow2`, '-F', 'qcow2', `d${i}.qcow2`], deep)
    }
    expect((await resolveQcow2BackingChain(path.join(deep, 'd16.qcow2'), ctx)).length).toBe(16)
    expect((await expectCode(resolveQcow2BackingChain(path.join(deep, 'd17.qcow2'), ctx), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain('deeper than 16')
  })
})

describe('VHDX (MS-VHDX)', () => {
  test('CRC-32C matches the Castagnoli check value', () => {
    expect(crc32c(Buffer.from('123456789'))).toBe(0xe3069283)
  })

  test('corpus dissect.hypervisor/fixed.vhdx: fixed 10 MiB, 2 MiB blocks, 512-byte logical sectors', async () => {
    const v = await readVhdxInfo(path.join(ROOT, 'fixed.vhdx'))
    expect(v.virtual_size).toBe(10 * MiB)
    expect(v.block_size).toBe(2 * MiB)
    expect(v.logical_sector_size).toBe(512)
    expect(v.physical_sector_size).toBe(4096)
    expect(v.fixed).toBe(true)
    expect(v.has_parent).toBe(false)
    expect(v.parent_locator).toBeNull()
    expect(v.creator).toBe('Microsoft Windows 10.0.18363.0')
    expect(v.virtual_disk_id).toBe('4A49D245-DB0A-4634-9818-9F93DB5BA6C1')
    expect(v.data_write_guid).toBe('BFC189A1-751C-44FF-B60F-98D07B2950C0')
    expect(v.header_sequence).toBe('7')
    expect(v.needs_log_replay).toBe(false)
  })

  test('generated dynamic VHDX: 64 MiB, 1 MiB blocks', async () => {
    const v = await readVhdxInfo(path.join(ROOT, 'dyn.vhdx'))
    expect(v.virtual_size).toBe(64 * MiB)
    expect(v.block_size).toBe(MiB)
    expect(v.logical_sector_size).toBe(512)
    expect(v.fixed).toBe(false)
    expect(v.creator).toStartWith('QEMU v')
  })

  test('a corrupt current header falls back to the other; both corrupt is E_MIG_MALFORMED_ARCHIVE', async () => {
    const f = path.join(ROOT, 'hdr.vhdx')
    copyFileSync(path.join(ROOT, 'fixed.vhdx'), f)
    const fd = openSync(f, 'r+')
    // Header 1 (seq 6) and header 2 (seq 7): break header 2, header 1 must be used.
    writeSync(fd, Buffer.from([0xff]), 0, 1, 128 * 1024 + 100)
    expect((await readVhdxInfo(f)).header_sequence).toBe('6')
    writeSync(fd, Buffer.from([0xff]), 0, 1, 64 * 1024 + 100)
    closeSync(fd)
    await expectCode(readVhdxInfo(f), 'E_MIG_MALFORMED_ARCHIVE')
  })
})

describe('VHD footer (Virtual Hard Disk Image Format Specification)', () => {
  test('corpus dissect.hypervisor/fixed.vhd: fixed 10 MiB from Windows', async () => {
    const v = await readVhdInfo(path.join(ROOT, 'fixed.vhd'))
    expect(v.disk_type).toBe('fixed')
    expect(v.virtual_size).toBe(10 * MiB)
    expect(v.current_size).toBe(10 * MiB)
    expect(v.creator_app).toBe('win ')
    expect(v.geometry).toEqual({ cylinders: 301, heads: 4, sectors: 17 })
    expect(v.parent_name).toBeNull()
    expect(v.footer_offset).toBe(10 * MiB)
  })

  test('a 511-byte footer (old Virtual PC) is accepted', async () => {
    const f = path.join(ROOT, 'short-footer.vhd')
    copyFileSync(path.join(ROOT, 'fixed.vhd'), f)
    truncateSync(f, 10 * MiB + 511) // the footer's last reserved byte is zero
    const v = await readVhdInfo(f)
    expect(v.disk_type).toBe('fixed')
    expect(v.virtual_size).toBe(10 * MiB)
    expect(v.footer_offset).toBe(10 * MiB)
  })

  test('generated dynamic VHD: CHS size for creator qemu, current size for qem2 (force_size)', async () => {
    const d = await readVhdInfo(path.join(ROOT, 'dyn.vhd'))
    expect(d.disk_type).toBe('dynamic')
    expect(d.creator_app).toBe('qemu')
    expect(d.virtual_size).toBe(10514432) // 302 * 4 * 17 * 512, what qemu-img info reports
    expect(d.block_size).toBe(2 * MiB)
    const forced = await readVhdInfo(path.join(ROOT, 'forced.vhd'))
    expect(forced.creator_app).toBe('qem2')
    expect(forced.virtual_size).toBe(10 * MiB)
    const fx = await readVhdInfo(path.join(ROOT, 'fixed-qemu.vhd'))
    expect(fx.disk_type).toBe('fixed')
  })

  test('a footer checksum mismatch with no intact copy is E_MIG_MALFORMED_ARCHIVE', async () => {
    const f = path.join(ROOT, 'badsum.vhd')
    copyFileSync(path.join(ROOT, 'fixed.vhd'), f)
    const fd = openSync(f, 'r+')
    writeSync(fd, Buffer.from([0x7f]), 0, 1, 10 * MiB + 48) // current size byte
    closeSync(fd)
    expect((await expectCode(readVhdInfo(f), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain('checksum')
  })

  test('a dynamic VHD whose last sector is damaged is read from the footer copy at offset 0', async () => {
    const f = path.join(ROOT, 'copy0.vhd')
    copyFileSync(path.join(ROOT, 'dyn.vhd'), f)
    const size = statSync(f).size
    const fd = openSync(f, 'r+')
    writeSync(fd, Buffer.from([0x7f]), 0, 1, size - 512 + 48)
    closeSync(fd)
    const v = await readVhdInfo(f)
    expect(v.footer_offset).toBe(0)
    expect(v.virtual_size).toBe(10514432)
  })
})

describe('VDI (VirtualBox VDICore.h)', () => {
  test('generated dynamic and static VDI', async () => {
    const d = await readVdiInfo(path.join(ROOT, 'dyn.vdi'))
    expect(d.image_type).toBe('dynamic')
    expect(d.virtual_size).toBe(10 * MiB)
    expect(d.block_size).toBe(MiB)
    expect(d.blocks).toBe(10)
    expect(d.blocks_allocated).toBe(0)
    expect(d.parent_uuid).toBeNull()
    expect(d.uuid).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$/)
    const s = await readVdiInfo(path.join(ROOT, 'static.vdi'))
    expect(s.image_type).toBe('fixed')
    expect(s.virtual_size).toBe(3 * MiB)
    expect(s.blocks_allocated).toBe(3)
  })

  test('a VDI that is not one is E_MIG_UNSUPPORTED_FORMAT', async () => {
    await expectCode(readVdiInfo(path.join(ROOT, 'v3.qcow2')), 'E_MIG_UNSUPPORTED_FORMAT')
  })
})

describe('truncated headers (first 100 bytes) are E_MIG_MALFORMED_ARCHIVE', () => {
  test('qcow2', async () => {
    await expectCode(
      readQcow2Header(truncatedCopy(path.join(CORPUS, 'vagrant-mutate/kvm-box-disk1.qcow2'), 100, path.join(ROOT, 't.qcow2'))),
      'E_MIG_MALFORMED_ARCHIVE',
    )
  })
  test('vhdx', async () => {
    await expectCode(readVhdxInfo(truncatedCopy(path.join(ROOT, 'fixed.vhdx'), 100, path.join(ROOT, 't.vhdx'))), 'E_MIG_MALFORMED_ARCHIVE')
  })
  test('vhd (dynamic: footer copy kept, dynamic header cut off)', async () => {
    await expectCode(readVhdInfo(truncatedCopy(path.join(ROOT, 'dyn.vhd'), 100, path.join(ROOT, 't.vhd'))), 'E_MIG_MALFORMED_ARCHIVE')
  })
  test('vdi', async () => {
    await expectCode(readVdiInfo(truncatedCopy(path.join(ROOT, 'dyn.vdi'), 100, path.join(ROOT, 't.vdi'))), 'E_MIG_MALFORMED_ARCHIVE')
  })
})

/** Deterministic PRNG (mulberry32) so a failing mutation can be replayed. */
function prng(seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/**
 * Mutates 1-4 bytes inside `ranges` of a private copy of `src`, `rounds` times, calling `read`
 * each time; restores the bytes afterwards. Every outcome must be a MigError or pass `sane`.
 */
async function fuzz(
  src: string,
  ranges: Array<[number, number]>,
  rounds: number,
  seed: number,
  read: (f: string) => Promise<unknown>,
  sane: (v: any) => boolean,
): Promise<{ ok: number; rejected: number }> {
  const f = path.join(ROOT, `fuzz-${path.basename(src)}`)
  copyFileSync(src, f)
  const rnd = prng(seed)
  const fd = openSync(f, 'r+')
  let ok = 0
  let rejected = 0
  try {
    for (let r = 0; r < rounds; r++) {
      const saved: Array<[number, Buffer]> = []
      const n = 1 + Math.floor(rnd() * 4)
      for (let i = 0; i < n; i++) {
        const [lo, hi] = ranges[Math.floor(rnd() * ranges.length)]!
        const pos = lo + Math.floor(rnd() * (hi - lo))
        const old = Buffer.alloc(1)
        readSync(fd, old, 0, 1, pos)
        saved.push([pos, old])
        const v = rnd() < 0.3 ? [0x00, 0xff, 0x80, 0x7f][Math.floor(rnd() * 4)]! : Math.floor(rnd() * 256)
        writeSync(fd, Buffer.from([v]), 0, 1, pos)
      }
      try {
        const v = await read(f)
        if (!sane(v)) throw new Error(`round ${r}: insane result ${JSON.stringify(v)}`)
        ok++
      } catch (e) {
        if (!(e instanceof MigError)) throw new Error(`round ${r} (seed ${seed}): non-MigError ${(e as Error)?.stack ?? e}`)
        rejected++
      }
      for (const [pos, old] of saved.reverse()) writeSync(fd, old, 0, 1, pos)
    }
  } finally {
    closeSync(fd)
  }
  return { ok, rejected }
}

const saneSize = (max: number) => (v: any) => Number.isSafeInteger(v.virtual_size) && v.virtual_size >= 0 && v.virtual_size <= max

describe('random header mutations: a MigError or sane values, never anything else', () => {
  test('qcow2 (header cluster of the corpus chain top)', async () => {
    const r = await fuzz(
      path.join(ROOT, 'backing-chain-1.qcow2'),
      [
        [0, 120],
        [0x70, 0x240],
      ],
      400,
      1,
      readQcow2Header,
      (v) => saneSize(QCOW2_MAX_VIRTUAL_SIZE)(v) && v.cluster_bits >= 9 && v.cluster_bits <= 21 && (v.backing_file === null || v.backing_file.length <= 1023),
    )
    expect(r.ok + r.rejected).toBe(400)
    expect(r.rejected).toBeGreaterThan(0)
  })

  test('vhdx (headers, region table, metadata table and items)', async () => {
    const src = path.join(ROOT, 'dyn.vhdx')
    const v = await readVhdxInfo(src)
    expect(v.virtual_size).toBe(64 * MiB)
    // Find the metadata region from the region table to mutate its (unchecksummed) table and items.
    const rt = Buffer.alloc(64 * 1024)
    const fd = openSync(src, 'r')
    readSync(fd, rt, 0, rt.length, 192 * 1024)
    closeSync(fd)
    let metaOff = 0
    for (let i = 0; i < rt.readUInt32LE(8); i++) if (rt.readUInt32LE(16 + i * 32) === 0x8b7ca206) metaOff = Number(rt.readBigUInt64LE(16 + i * 32 + 16))
    expect(metaOff).toBeGreaterThan(0)
    const r = await fuzz(
      src,
      [
        [0, 16],
        [64 * 1024, 64 * 1024 + 80],
        [192 * 1024, 192 * 1024 + 80],
        [metaOff, metaOff + 32 * 6],
        [metaOff + 64 * 1024, metaOff + 64 * 1024 + 64],
      ],
      400,
      2,
      readVhdxInfo,
      (x) => saneSize(VHDX_MAX_VIRTUAL_SIZE)(x) && x.block_size >= MiB && x.block_size <= 256 * MiB && [512, 4096].includes(x.logical_sector_size),
    )
    expect(r.ok).toBeGreaterThan(0)
    expect(r.rejected).toBeGreaterThan(0)
  })

  test('vhd (footer copy, dynamic header, footer)', async () => {
    const src = path.join(ROOT, 'dyn.vhd')
    const size = statSync(src).size
    const r = await fuzz(
      src,
      [
        [0, 512],
        [512, 1536],
        [size - 512, size],
      ],
      400,
      3,
      readVhdInfo,
      (x) => saneSize(VHD_MAX_VIRTUAL_SIZE)(x) && ['fixed', 'dynamic', 'differencing'].includes(x.disk_type),
    )
    expect(r.ok).toBeGreaterThan(0)
    expect(r.rejected).toBeGreaterThan(0)
  })

  test('vdi (pre-header and header)', async () => {
    const r = await fuzz(path.join(ROOT, 'dyn.vdi'), [[0x40, 0x1c8]], 400, 4, readVdiInfo, (x) => saneSize(VDI_MAX_DISK_SIZE)(x))
    expect(r.ok).toBeGreaterThan(0)
    expect(r.rejected).toBeGreaterThan(0)
  })
})

describe('qemu-img info', () => {
  test('corpus qcow2: format, sizes, cluster size', async () => {
    const f = path.join(CORPUS, 'vagrant-mutate/kvm-box-disk1.qcow2')
    const i = await qemuImgInfo(f)
    expect(i.format).toBe('qcow2')
    expect(i.virtual_size).toBe(4194304)
    expect(i.cluster_size).toBe(65536)
    expect(i.actual_size).toBe(statSync(f).blocks * 512)
    expect(i.backing_filename).toBeNull()
    expect(i.backing_format).toBeNull()
    expect(i.dirty).toBe(false)
  })

  test('backing chain of the corpus qcow2 chain, top first', async () => {
    const chain = await qemuImgInfo(path.join(ROOT, 'backing-chain-1.qcow2'), { backingChain: true })
    expect(chain.map((c) => c.backing_filename)).toEqual(['backing-chain-2.qcow2', 'backing-chain-3.qcow2', null])
    expect(chain.map((c) => c.virtual_size)).toEqual([512 * MiB, 512 * MiB, 512 * MiB])
    expect(chain[0]!.backing_format).toBe('qcow2')
  })

  test('fixed VHD needs -f vpc (qemu probes it as raw otherwise)', async () => {
    expect((await qemuImgInfo(path.join(ROOT, 'fixed.vhd'))).format).toBe('raw')
    const i = await qemuImgInfo(path.join(ROOT, 'fixed.vhd'), { format: 'vpc' })
    expect(i.format).toBe('vpc')
    expect(i.virtual_size).toBe(10 * MiB)
  })

  test('an embedded image is probed in place through the raw driver offset/size', async () => {
    const inner = path.join(CORPUS, 'vagrant-mutate/kvm-box-disk1.qcow2')
    const wrapped = path.join(ROOT, 'wrapped,name.bin')
    writeFileSync(wrapped, Buffer.concat([Buffer.alloc(1536), readFileSync(inner), Buffer.alloc(512)]))
    const size = statSync(inner).size
    const probed = await qemuImgInfo(wrapped, { offset: 1536, length: size })
    expect(probed.format).toBe('qcow2')
    expect(probed.virtual_size).toBe(4194304)
    const forced = await qemuImgInfo(wrapped, { offset: 1536, length: size - 100, format: 'qcow2' })
    expect(forced.virtual_size).toBe(4194304)
    expect(qemuInfoArgs(wrapped, { offset: 1536, length: 1000, format: 'qcow2' })).toEqual([
      'info',
      '--output=json',
      '-U',
      '--image-opts',
      `driver=qcow2,file.driver=raw,file.offset=1536,file.size=1024,file.file.driver=file,file.file.filename=${wrapped.replace(',', ',,')}`,
    ])
  })

  test("a failure is E_MIG_MALFORMED_ARCHIVE naming the file and qemu-img's first error line", async () => {
    const f = path.join(ROOT, 'no-such-file.qcow2')
    const err = await expectCode(qemuImgInfo(f), 'E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toStartWith(`${f}: qemu-img info failed: Could not open`)
    expect(err.message).toContain('No such file or directory')
    await expectCode(qemuImgInfo(path.join(ROOT, 'v3.qcow2'), { format: 'vhdx' }), 'E_MIG_MALFORMED_ARCHIVE')
  })

  test('a missing binary is E_MIG_INTERNAL "qemu-img is not installed"', async () => {
    const err = await expectCode(qemuImgInfo(path.join(ROOT, 'v3.qcow2'), { qemuImg: path.join(ROOT, 'no-qemu-img') }), 'E_MIG_INTERNAL')
    expect(err.message).toContain('qemu-img is not installed')
  })

  test('a hung run is killed at the time limit, an endless output at 1 MiB', async () => {
    const slow = path.join(OUT, 'slow-qemu-img')
    writeFileSync(slow, '#!/bin/sh\nexec sleep 30\n')
    chmodSync(slow, 0o755)
    const t0 = Date.now()
    expect((await expectCode(qemuImgInfo(path.join(ROOT, 'v3.qcow2'), { qemuImg: slow, timeoutMs: 300 }), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain(
      'did not finish',
    )
    expect(Date.now() - t0).toBeLessThan(5000)
    const chatty = path.join(OUT, 'chatty-qemu-img')
    writeFileSync(chatty, '#!/bin/sh\nexec yes\n')
    chmodSync(chatty, 0o755)
    expect((await expectCode(qemuImgInfo(path.join(ROOT, 'v3.qcow2'), { qemuImg: chatty }), 'E_MIG_MALFORMED_ARCHIVE')).message).toContain('1048576 bytes')
  })
})
