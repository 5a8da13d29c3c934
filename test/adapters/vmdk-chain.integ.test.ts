/**
 * Decoding VMDK snapshot delta chains (lib/formats/vmdk/chain-reader.ts, through the vim_api boundary
 * lib/adapters/vim/vmdk-chain.ts, whose codes these are) from files of this machine, each checked
 * against `qemu-img convert` of the same chain:
 * - hosted sparse deltas made by qemu-img/qemu-io (two levels, a zeroed grain over parent data);
 * - ESXi vmfsSparse and seSparse deltas over a monolithicFlat base (written by the test helper
 *   test/helpers/esx-delta.ts, since no tool here makes them);
 * - hostile chains: a CID mismatch, a loop, a missing parent, a dirty seSparse journal, a
 *   corrupt grain directory entry, extents leaving the directory, a truncated sparse file.
 * The files are read through a {@link RemoteFile} over a local buffer: the decoding is what is
 * under test; the datastore HTTP transport is tested against the simulator in vim-data.test.ts.
 */
import { describe, expect, test, afterAll } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { closeSync, openSync, readFileSync, readSync, statSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { resolveParent } from '../../lib/adapters/vim/datastore.ts'
import { openVmdkChain, type RemoteFile } from '../../lib/adapters/vim/vmdk-chain.ts'
import { MigError } from '../../lib/errors.ts'
import type { DiskReader } from '../../lib/contracts/disk-reader.ts'
import { copyDisk } from '../../lib/pipeline/copy-disk.ts'
import { FileSink } from '../../lib/sink/file.ts'
import { readAll } from '../helpers/disk-reader.ts'
import { deltaDescriptor, makeFlatBase, writeCowd, writeSeSparse, type DeltaGrain } from '../helpers/esx-delta.ts'
import { makeRawImage } from '../helpers/inputs.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const t = tempDir('mig-vmdk-chain-')
afterAll(() => t.cleanup())

/** Range reads per file name, as a datastore would count its requests. */
const requests = new Map<string, number>()

function local(dir: string, name: string): RemoteFile {
  let buf: Buffer
  try {
    buf = readFileSync(path.join(dir, name))
  } catch {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: not found (test file)`)
  }
  return {
    name,
    size: buf.length,
    read: async (o, l) => {
      requests.set(name, (requests.get(name) ?? 0) + 1)
      if (o + l > buf.length) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: short read`)
      return buf.subarray(o, o + l)
    },
  }
}

/** Opens `name` of `dir` with parents resolved by hint in the same directory. */
function open(dir: string, name: string, capacity = 0): Promise<DiskReader> {
  const sib = async (n: string) => local(dir, n)
  return openVmdkChain(local(dir, name), sib, async (hint) => ({ file: local(dir, hint), openSibling: sib }), { label: 'disk', capacity })
}

function qemuRaw(dir: string, name: string): Buffer {
  const out = path.join(dir, `${name}.qemu.raw`)
  execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'raw', name, out], { cwd: dir })
  return readFileSync(out)
}

function qemuIo(dir: string, name: string, ...cmds: string[]): void {
  execFileSync('qemu-io', ['-f', 'vmdk', ...cmds.flatMap((c) => ['-c', c]), name], { cwd: dir, stdio: 'ignore' })
}

describe('VMDK snapshot delta chains', () => {
  test('a two-level hosted sparse chain made by qemu reads as qemu reads it, zeroed grains hiding parent data', async () => {
    const d = path.join(t.dir, 'hosted')
    execFileSync('mkdir', ['-p', d])
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', 'base.vmdk', '12M'], { cwd: d })
    qemuIo(d, 'base.vmdk', 'write -P 0x11 0 3M', 'write -P 0x12 8M 1M')
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-o', 'zeroed_grain=on', '-b', 'base.vmdk', '-F', 'vmdk', 'c1.vmdk'], { cwd: d })
    qemuIo(d, 'c1.vmdk', 'write -P 0x21 1M 128k', 'write -z 0 64k', 'write -P 0x22 10M 64k')
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-b', 'c1.vmdk', '-F', 'vmdk', 'c2.vmdk'], { cwd: d })
    qemuIo(d, 'c2.vmdk', 'write -P 0x31 1M 4k', 'write -P 0x32 11M 512')
    const r = await open(d, 'c2.vmdk', 12 * MiB)
    expect(r.size).toBe(12 * MiB)
    const { data, zeroBytes } = await readAll(r)
    const want = qemuRaw(d, 'c2.vmdk')
    expect(data.equals(want)).toBe(true)
    expect(data[0]).toBe(0) // the zeroed grain of c1 over base's 0x11
    expect(data[64 * 1024]).toBe(0x11)
    expect(data[MiB]).toBe(0x31)
    expect(data[MiB + 4096]).toBe(0x21)
    // unallocated everywhere: 3M..8M and 9M..10M less c1/c2's grains are zero extents, never read
    expect(zeroBytes).toBeGreaterThanOrEqual(5 * MiB)
    await r.close()
  })

  test('vmfsSparse and seSparse deltas over a flat base read as qemu reads them', async () => {
    const d = path.join(t.dir, 'esx')
    execFileSync('mkdir', ['-p', d])
    const size = 40 * MiB
    const baseCid = makeFlatBase(d, makeRawImage(path.join(d, 'src.raw'), size, 7))
    // snapshot 1: a vmfsSparse delta with 512-byte grains across two grain tables (2 MiB each)
    const cowd = new Map<number, DeltaGrain>()
    for (const g of [0, 1, 7, 4095, 4096, 4097, 20000]) cowd.set(g, Buffer.alloc(512, 0x40 + (g % 50)))
    writeCowd(path.join(d, 'vm-000001-delta.vmdk'), size, 1, cowd)
    writeFileSync(
      path.join(d, 'vm-000001.vmdk'),
      deltaDescriptor({
        createType: 'vmfsSparse',
        extent: 'vm-000001-delta.vmdk',
        capacityBytes: size,
        cid: 'aaaa0001',
        parentCid: baseCid,
        parentHint: 'vm.vmdk',
      }),
    )
    // snapshot 2: a seSparse delta with 4 KiB grains over three grain tables, one zeroed over the vmfsSparse data
    const se = new Map<number, DeltaGrain>()
    se.set(0, 'zero')
    // more than 4096 allocated grains, so grain numbers use both halves of the entry encoding
    const seGrain = (g: number) => {
      const b = Buffer.alloc(4096, 0x80 + (g % 60))
      b.writeUInt32LE(g, 100)
      return b
    }
    for (const g of [2, 3, 4095, 4999]) se.set(g, seGrain(g))
    for (let g = 5000; g < 9300; g++) se.set(g, seGrain(g))
    writeSeSparse(path.join(d, 'vm-000002-sesparse.vmdk'), size, se)
    writeFileSync(
      path.join(d, 'vm-000002.vmdk'),
      deltaDescriptor({
        createType: 'seSparse',
        extent: 'vm-000002-sesparse.vmdk',
        capacityBytes: size,
        cid: 'aaaa0002',
        parentCid: 'aaaa0001',
        parentHint: 'vm-000001.vmdk',
      }),
    )

    const expected = readFileSync(path.join(d, 'src.raw'))
    for (const [g, b] of cowd) (b as Buffer).copy(expected, g * 512)
    const mid = Buffer.from(expected)
    for (const [g, b] of se) (b === 'zero' ? Buffer.alloc(4096) : b).copy(expected, g * 4096)
    // qemu, an independent reader, agrees with the model: the test helper's files are well-formed
    expect(qemuRaw(d, 'vm-000001.vmdk').equals(mid)).toBe(true)
    expect(qemuRaw(d, 'vm-000002.vmdk').equals(expected)).toBe(true)

    const r1 = await open(d, 'vm-000001.vmdk', size)
    expect((await readAll(r1)).data.equals(mid)).toBe(true)
    const r2 = await open(d, 'vm-000002.vmdk', size)
    requests.clear()
    const { data } = await readAll(r2, 3 * MiB)
    expect(data.equals(expected)).toBe(true)
    // the base's bytes between the deltas' grains come in one request per read (14 reads of at
    // most 3 MiB), not one per gap (thousands)
    expect(requests.get('vm-flat.vmdk')).toBeLessThanOrEqual(14)
    // reads across grain and layer boundaries
    const odd = await r2.read(4095 * 512 - 100, 9000)
    expect(odd.equals(expected.subarray(4095 * 512 - 100, 4095 * 512 + 8900))).toBe(true)
  })

  test('an in-order copy reads each grain table once and reads into reused buffers, not a new one per request', async () => {
    // 512 vmfsSparse grain tables (16 KiB each, 8 MiB in all: twice the 4 MiB table cache) over
    // a flat base of 1 GiB (all holes), one 512-byte grain per table; copied as the job copies
    const d = path.join(t.dir, 'wide')
    execFileSync('mkdir', ['-p', d])
    const size = 1024 * MiB
    execFileSync('truncate', ['-s', String(size), path.join(d, 'zeros.raw')])
    const baseCid = makeFlatBase(d, path.join(d, 'zeros.raw'))
    const cowd = new Map<number, DeltaGrain>()
    for (let table = 0; table < 512; table++) cowd.set(table * 4096 + 7, Buffer.alloc(512, 1 + (table % 251)))
    writeCowd(path.join(d, 'wide-delta.vmdk'), size, 1, cowd)
    writeFileSync(
      path.join(d, 'wide.vmdk'),
      deltaDescriptor({ createType: 'vmfsSparse', extent: 'wide-delta.vmdk', capacityBytes: size, cid: '0000bbbb', parentCid: baseCid, parentHint: 'vm.vmdk' }),
    )
    const deltaSize = statSync(path.join(d, 'wide-delta.vmdk')).size
    let deltaBytesRead = 0
    let reads = 0
    let withoutInto = 0
    let copying = false
    const intoBuffers = new Set<ArrayBufferLike>()
    /** A file of `d` that reads into `into` when given (as the datastore transport does) and records what it was given. */
    const recording = (name: string): RemoteFile => {
      const file = path.join(d, name)
      return {
        name,
        size: statSync(file).size,
        read: async (o, l, into) => {
          const dst = into && into.length >= l ? into.subarray(0, l) : Buffer.allocUnsafe(l)
          const fd = openSync(file, 'r')
          try {
            if (readSync(fd, dst, 0, l, o) !== l) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: short read`)
          } finally {
            closeSync(fd)
          }
          if (name === 'wide-delta.vmdk') deltaBytesRead += l
          if (copying) {
            reads++
            if (into) intoBuffers.add(into.buffer)
            else withoutInto++
          }
          return dst
        },
      }
    }
    const sib = async (n: string) => recording(n)
    const r = await openVmdkChain(recording('wide.vmdk'), sib, async (hint) => ({ file: recording(hint), openSibling: sib }), { label: 'disk', capacity: size })
    const sink = new FileSink({ dataDir: d })
    const vol = await sink.create('wide', 'disk0', r.size)
    copying = true
    await copyDisk(r, vol, { from: 0, signal: new AbortController().signal, onProgress() {}, async onWatermark() {} })
    await vol.close()
    await r.close()
    // every grain arrived (the rest of the volume is a hole the sink never wrote)
    const fh = openSync(sink.volumePath('wide', 'disk0'), 'r')
    const got = Buffer.alloc(512)
    let wrong = 0
    for (const [g, b] of cowd) {
      readSync(fh, got, 0, 512, g * 512)
      if (!got.equals(b as Buffer)) wrong++
    }
    closeSync(fh)
    expect(wrong).toBe(0)
    // the 32 table windows of 256 KiB and the grains, each once: a table dropped from the cache
    // while the copy's reads still needed it (the extent walk running too far ahead of them, or
    // the cache dropped whole) would be read again
    expect(deltaBytesRead).toBeLessThanOrEqual(deltaSize)
    // every request of the copy (table windows, grains) came with a buffer to fill, and those
    // buffers are a handful reused from request to request (the copy's chunk pool, the reader's
    // span and window buffers), not a new one per request
    expect(reads).toBeGreaterThan(150)
    expect([withoutInto, intoBuffers.size <= 16]).toEqual([0, true])
    await sink.remove('wide')
  }, 60_000)

  test('hostile chains are refused with the layer named', async () => {
    const d = path.join(t.dir, 'bad')
    execFileSync('mkdir', ['-p', d])
    const size = 4 * MiB
    const baseCid = makeFlatBase(d, makeRawImage(path.join(d, 'src.raw'), size, 3))
    const one = new Map<number, DeltaGrain>([[5, Buffer.alloc(4096, 1)]])
    writeSeSparse(path.join(d, 'ok-sesparse.vmdk'), size, one)
    const desc = (cid: string, parentCid: string, hint: string, extent = 'ok-sesparse.vmdk') =>
      deltaDescriptor({ createType: 'seSparse', extent, capacityBytes: size, cid, parentCid, parentHint: hint })

    // the parent's CID is not the one the child was made against
    writeFileSync(path.join(d, 'cid.vmdk'), desc('00000001', '12345678', 'vm.vmdk'))
    let e = await thrown(() => open(d, 'cid.vmdk'))
    expect([e.code, /expects parent CID 12345678/.test(e.message)]).toEqual(['E_MIG_DISK_READ_FAILED', true])
    // a loop
    writeFileSync(path.join(d, 'a.vmdk'), desc('0000000a', '0000000b', 'b.vmdk'))
    writeFileSync(path.join(d, 'b.vmdk'), desc('0000000b', '0000000a', 'a.vmdk'))
    e = await thrown(() => open(d, 'a.vmdk'))
    expect([e.code, /loops/.test(e.message)]).toEqual(['E_MIG_DISK_READ_FAILED', true])
    // a missing parent
    writeFileSync(path.join(d, 'orphan.vmdk'), desc('00000002', '00000003', 'gone.vmdk'))
    expect((await thrown(() => open(d, 'orphan.vmdk'))).code).toBe('E_MIG_DISK_READ_FAILED')
    // a delta without a parent name
    writeFileSync(path.join(d, 'nohint.vmdk'), desc('00000002', '00000003', 'x').replace(/^parentFileNameHint=.*$/m, ''))
    expect((await thrown(() => open(d, 'nohint.vmdk'))).code).toBe('E_MIG_DISK_READ_FAILED')
    // a seSparse file whose journal was never replayed
    writeSeSparse(path.join(d, 'dirty-sesparse.vmdk'), size, one, { dirty: true })
    writeFileSync(
      path.join(d, 'dirty.vmdk'),
      desc('00000004', 'ffffffff', 'vm.vmdk', 'dirty-sesparse.vmdk').replace('parentCID=ffffffff', `parentCID=${baseCid}`),
    )
    expect((await thrown(() => open(d, 'dirty.vmdk'))).code).toBe('E_MIG_UNSUPPORTED_FORMAT')
    // a grain directory entry that is not an allocated table
    const corrupt = readFileSync(path.join(d, 'ok-sesparse.vmdk'))
    corrupt.writeBigUInt64LE(0x7000000000000000n, 2 * 512)
    writeFileSync(path.join(d, 'corrupt-sesparse.vmdk'), corrupt)
    writeFileSync(
      path.join(d, 'corrupt.vmdk'),
      desc('00000005', 'ffffffff', 'vm.vmdk', 'corrupt-sesparse.vmdk')
        .replace(/^parentCID=.*$/m, 'parentCID=ffffffff')
        .replace(/^parentFileNameHint=.*$/m, ''),
    )
    e = await thrown(() => open(d, 'corrupt.vmdk'))
    expect([e.code, /corrupt-sesparse\.vmdk: grain directory entry 0/.test(e.message)]).toEqual(['E_MIG_DISK_READ_FAILED', true])
    // a vmfsSparse extent cut short: the grain lies beyond the end of the file
    writeCowd(path.join(d, 'cut-delta.vmdk'), size, 1, new Map([[3, Buffer.alloc(512, 9)]]))
    const whole = readFileSync(path.join(d, 'cut-delta.vmdk'))
    writeFileSync(path.join(d, 'cut-delta.vmdk'), whole.subarray(0, whole.length - 512))
    writeFileSync(
      path.join(d, 'cut.vmdk'),
      deltaDescriptor({
        createType: 'vmfsSparse',
        extent: 'cut-delta.vmdk',
        capacityBytes: size,
        cid: '00000006',
        parentCid: 'ffffffff',
        parentHint: 'vm.vmdk',
      }).replace(/^parentFileNameHint=.*$/m, ''),
    )
    e = await thrown(async () => readAll(await open(d, 'cut.vmdk')))
    expect([e.code, /outside the file/.test(e.message)]).toEqual(['E_MIG_DISK_READ_FAILED', true])
  })

  test('hosted and flat files: extent names leaving the directory, stream-optimized, truncated and oversized disks', async () => {
    const d = path.join(t.dir, 'plain')
    execFileSync('mkdir', ['-p', d])
    makeRawImage(path.join(d, 'src.raw'), 6 * MiB, 4)
    const desc = (extent: string) =>
      `# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType="monolithicFlat"\nRW 2048 FLAT "${extent}" 0\n`
    writeFileSync(path.join(d, 'esc.vmdk'), desc('../../etc/passwd'))
    expect((await thrown(() => open(d, 'esc.vmdk', MiB))).code).toBe('E_MIG_DISK_READ_FAILED')
    writeFileSync(path.join(d, 'short-flat.vmdk'), Buffer.alloc(1000))
    writeFileSync(path.join(d, 'short.vmdk'), desc('short-flat.vmdk'))
    expect((await thrown(() => open(d, 'short.vmdk', MiB))).code).toBe('E_MIG_DISK_READ_FAILED')
    execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=streamOptimized', 'src.raw', 'so.vmdk'], { cwd: d })
    expect((await thrown(() => open(d, 'so.vmdk', 6 * MiB))).code).toBe('E_MIG_UNSUPPORTED_FORMAT')
    execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'vmdk', 'src.raw', 'cut.vmdk'], { cwd: d })
    const whole = readFileSync(path.join(d, 'cut.vmdk'))
    writeFileSync(path.join(d, 'cut.vmdk'), whole.subarray(0, Math.floor(whole.length / 2)))
    expect((await thrown(async () => readAll(await open(d, 'cut.vmdk', 6 * MiB)))).code).toBe('E_MIG_DISK_READ_FAILED')
    execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'vmdk', 'src.raw', 'big.vmdk'], { cwd: d })
    expect((await thrown(() => open(d, 'big.vmdk', MiB))).code).toBe('E_MIG_DISK_READ_FAILED')
  })

  test('parent paths: vSphere chain first, then the hint relative to the child or on its own datastore', () => {
    const child = { datastore: 'ds1', path: 'vm/vm-000002.vmdk' }
    expect(resolveParent(child, 'vm-000001.vmdk')).toEqual({ datastore: 'ds1', path: 'vm/vm-000001.vmdk' })
    expect(resolveParent(child, 'ignored.vmdk', '[ds2] base/vm.vmdk')).toEqual({ datastore: 'ds2', path: 'base/vm.vmdk' })
    expect(resolveParent(child, '/vmfs/volumes/ds1/tmpl/base.vmdk')).toEqual({ datastore: 'ds1', path: 'tmpl/base.vmdk' })
    const code = (f: () => unknown) => {
      try {
        f()
        return 'none'
      } catch (e) {
        return (e as MigError).code
      }
    }
    expect(code(() => resolveParent(child, '../../etc/passwd'))).toBe('E_MIG_DISK_READ_FAILED')
    expect(code(() => resolveParent(child, 'a\\b.vmdk'))).toBe('E_MIG_DISK_READ_FAILED')
    expect(code(() => resolveParent(child, '/etc/passwd'))).toBe('E_MIG_DISK_READ_FAILED')
    expect(code(() => resolveParent(child, '/vmfs/volumes/5f1c-uuid/tmpl/base.vmdk'))).toBe('E_MIG_UNSUPPORTED_FORMAT')
  })
})
