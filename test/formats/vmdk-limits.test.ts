/**
 * Hostile input against the one VMDK parser (lib/formats/vmdk/): the limits of `limits.ts` hold
 * for the descriptor parser, the sparse extent reader and the chain reader alike, and one
 * malformed file is the same fault whoever reads it: `E_MIG_MALFORMED_ARCHIVE` from the shared
 * modules and the offline inspection, `E_MIG_DISK_READ_FAILED` (same message) only through the
 * vim_api boundary (`lib/adapters/vim/vmdk-chain.ts`), which maps the code in one place.
 * Files are in memory ({@link VmdkFile} over a Buffer) except where qemu-img makes them.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { openVmdkChain as openForVim } from '../../lib/adapters/vim/vmdk-chain.ts'
import { MigError } from '../../lib/errors.ts'
import { openVmdkChain, type VmdkFile } from '../../lib/formats/vmdk/chain-reader.ts'
import { parseVmdkDescriptor } from '../../lib/formats/vmdk/descriptor.ts'
import { inspectVmdk } from '../../lib/formats/vmdk/inspect.ts'
import { MAX_CHAIN_DEPTH, MAX_EXTENTS, MAX_GD_ENTRIES, SECTOR } from '../../lib/formats/vmdk/limits.ts'
import { openSparseExtent } from '../../lib/formats/vmdk/sparse-extent.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const t = tempDir('i14-vmdk-limits-')
afterAll(() => t.cleanup())

/** A {@link VmdkFile} over `buf`, counting the bytes read. */
function mem(name: string, buf: Buffer, counter = { bytes: 0 }): VmdkFile {
  return {
    name,
    size: buf.length,
    async read(offset, length) {
      if (offset < 0 || offset + length > buf.length) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: short read`)
      counter.bytes += length
      return buf.subarray(offset, offset + length)
    },
  }
}

/** Opens `top` of the in-memory directory `files` with both readers: the shared one and the vim_api boundary. */
function opener(files: Map<string, Buffer>) {
  const get = async (name: string) => {
    const b = files.get(name)
    if (!b) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: not found (test file)`)
    return mem(name, b)
  }
  const parent = async (hint: string) => ({ file: await get(hint), openSibling: get })
  const opts = { label: 'disk', capacity: 0 }
  return {
    shared: async (top: string) => openVmdkChain(await get(top), get, parent, opts),
    vim: async (top: string) => openForVim(await get(top), get, parent, opts),
  }
}

function descriptor(extents: string[], header: string[] = []): Buffer {
  return Buffer.from(
    ['# Disk DescriptorFile', 'version=1', 'CID=0000000a', 'parentCID=ffffffff', 'createType="monolithicFlat"', ...header, ...extents, ''].join('\n'),
  )
}

/** Both readers refuse `top`: the shared one with `E_MIG_MALFORMED_ARCHIVE`, the vim_api one with `E_MIG_DISK_READ_FAILED`, same message. */
async function refusedAlike(files: Map<string, Buffer>, top: string, pattern: RegExp): Promise<void> {
  const o = opener(files)
  const shared = await thrown(() => o.shared(top))
  const vim = await thrown(() => o.vim(top))
  expect([shared.code, pattern.test(shared.message)]).toEqual(['E_MIG_MALFORMED_ARCHIVE', true])
  expect([vim.code, vim.message]).toEqual(['E_MIG_DISK_READ_FAILED', shared.message])
}

describe('VMDK limits, one set for every reader', () => {
  test('extents: MAX_EXTENTS lines are read, one more is refused by the descriptor parser and the chain reader', async () => {
    const lines = (n: number) => Array.from({ length: n }, () => 'RW 1 ZERO')
    const full = parseVmdkDescriptor(descriptor(lines(MAX_EXTENTS)), 'full.vmdk')
    expect(full.extents.length).toBe(MAX_EXTENTS)
    const over = thrownSync(() => parseVmdkDescriptor(descriptor(lines(MAX_EXTENTS + 1)), 'over.vmdk'))
    expect([over.code, over.message]).toEqual(['E_MIG_MALFORMED_ARCHIVE', `over.vmdk: more than ${MAX_EXTENTS} extents`])
    const files = new Map([
      ['full.vmdk', descriptor(lines(MAX_EXTENTS))],
      ['over.vmdk', descriptor(lines(MAX_EXTENTS + 1))],
    ])
    const r = await opener(files).vim('full.vmdk')
    expect(r.size).toBe(MAX_EXTENTS * SECTOR)
    await refusedAlike(files, 'over.vmdk', /more than 32768 extents/)
  })

  test('chains: MAX_CHAIN_DEPTH parents are followed, one more is refused; a loop is refused', async () => {
    const files = new Map<string, Buffer>()
    const n = MAX_CHAIN_DEPTH + 1
    const cid = (i: number) => i.toString(16).padStart(8, '0')
    for (let i = 0; i < n; i++) {
      files.set(`d${i}.vmdk`, descriptor(['RW 8 ZERO'], [`CID=${cid(i)}`, `parentCID=${cid(i + 1)}`, `parentFileNameHint="d${i + 1}.vmdk"`]))
    }
    files.set(`d${n}.vmdk`, descriptor(['RW 8 ZERO'], [`CID=${cid(n)}`]))
    const ok = await opener(files).shared('d1.vmdk')
    expect(ok.size).toBe(8 * SECTOR)
    await refusedAlike(files, 'd0.vmdk', new RegExp(`deeper than ${MAX_CHAIN_DEPTH} disks`))
    files.set('a.vmdk', descriptor(['RW 8 ZERO'], ['CID=0000000a', 'parentCID=0000000b', 'parentFileNameHint="b.vmdk"']))
    files.set('b.vmdk', descriptor(['RW 8 ZERO'], ['CID=0000000b', 'parentCID=0000000a', 'parentFileNameHint="a.vmdk"']))
    await refusedAlike(files, 'a.vmdk', /loops back to a\.vmdk/)
  })

  test('extent names leaving the disk directory are refused before any file is opened', async () => {
    for (const name of ['../../etc/passwd', 'sub/x.bin', 'a\\b.bin', '..', '.']) {
      const files = new Map([['esc.vmdk', descriptor([`RW 8 FLAT "${name}" 0`])]])
      await refusedAlike(files, 'esc.vmdk', /is not a file of the disk's directory/)
    }
  })

  test('oversized: a capacity over 64 TiB, an extent line over it, a grain directory over MAX_GD_ENTRIES (refused before it is read)', async () => {
    const kdmv = (capacity: bigint, grain: bigint, gtes: number) => {
      const b = Buffer.alloc(4 * SECTOR)
      b.write('KDMV', 0, 'latin1')
      b.writeUInt32LE(1, 4)
      b.writeBigUInt64LE(capacity, 12)
      b.writeBigUInt64LE(grain, 20)
      b.writeUInt32LE(gtes, 44)
      b.writeBigUInt64LE(1n, 56) // grain directory at sector 1
      b.writeBigUInt64LE(2n, 64)
      return b
    }
    await refusedAlike(new Map([['huge.vmdk', kdmv(2n ** 37n + 1n, 128n, 512)]]), 'huge.vmdk', /capacity larger than 64 TiB/)
    await refusedAlike(new Map([['long.vmdk', descriptor([`RW ${2 ** 37 + 1} ZERO`])]]), 'long.vmdk', /bad extent size/)
    // 2^37 sectors in grains of 1 sector, 512 per table: 2^28 directory entries (1 GiB of directory)
    const counter = { bytes: 0 }
    const e = await thrown(() => openSparseExtent(mem('gd.vmdk', kdmv(2n ** 37n, 1n, 512), counter)))
    expect([e.code, e.message]).toEqual(['E_MIG_MALFORMED_ARCHIVE', `gd.vmdk: grain directory of ${2 ** 28} entries is too large (at most ${MAX_GD_ENTRIES})`])
    expect(counter.bytes).toBeLessThanOrEqual(2048)
    // the chain's budget is passed on to each extent
    const small = await thrown(() => openSparseExtent(mem('gd2.vmdk', kdmv(2n ** 20n, 128n, 512)), 10))
    expect(small.message).toContain('grain directory of 16 entries is too large (at most 10)')
  })

  test('one damaged file, three readers: offline inspect and the shared chain reader say E_MIG_MALFORMED_ARCHIVE, vim_api E_MIG_DISK_READ_FAILED, one message', async () => {
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', path.join(t.dir, 'g.vmdk'), '1M'])
    const bytes = readFileSync(path.join(t.dir, 'g.vmdk'))
    bytes.writeBigUInt64LE(3n, 20) // grainSize 3 sectors: not a power of two
    writeFileSync(path.join(t.dir, 'g.vmdk'), bytes)
    const offline = await thrown(() => inspectVmdk(path.join(t.dir, 'g.vmdk'), { importRoot: t.dir }))
    expect([offline.code, offline.message]).toEqual([
      'E_MIG_MALFORMED_ARCHIVE',
      `${path.join(t.dir, 'g.vmdk')}: grain size 3 sectors is not a power of two up to 1 GiB`,
    ])
    await refusedAlike(new Map([['g.vmdk', bytes]]), 'g.vmdk', /^g\.vmdk: grain size 3 sectors is not a power of two up to 1 GiB$/)
  })

  test('truncated: a sparse file cut short fails at open or at read, the same way through both readers', async () => {
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', path.join(t.dir, 'c.vmdk'), '4M'])
    const whole = readFileSync(path.join(t.dir, 'c.vmdk'))
    // cut inside the grain tables: the directory names tables past the end
    const cut = whole.subarray(0, 4 * SECTOR)
    await refusedAlike(new Map([['c.vmdk', cut]]), 'c.vmdk', /lies outside the file/)
  })
})

function thrownSync(f: () => unknown): MigError {
  try {
    f()
  } catch (e) {
    return e as MigError
  }
  throw new Error('expected an error, none was thrown')
}
