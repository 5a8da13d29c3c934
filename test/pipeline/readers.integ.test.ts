/**
 * Disk readers end to end with real tools: images built with qemu-img from a raw file holding
 * random data at scattered offsets, opened with openDiskReader, copied with copyDisk into the
 * file sink; the destination must be sha256-equal to `qemu-img convert -O raw` of the source
 * and no more allocated than the source's data + 5%. Also tar members read in place, XVA
 * blocks, the corpus images, and the refusals. VHDX and dynamic VHD read by their BAT, VDI by its
 * block map, a stream-optimized VMDK by its grain tables: vhdx-blocks.test.ts, vhd-blocks.test.ts,
 * vdi-blocks.test.ts, stream-vmdk.test.ts.
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { closeSync, mkdirSync, openSync, readFileSync, readSync, statSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { listTarMembers } from '../../lib/formats/tar.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { xxh64Upper } from '../helpers/inputs.ts'
import { copyIntoSink, scatteredBench, SCATTERED_DATA_BYTES, SCATTERED_SIZE } from '../helpers/scattered-disk.ts'
import { manifestDisk, qemuRawOf, sha256File } from '../helpers/reader-fixtures.ts'
import { CORPUS } from '../helpers/tmp.ts'
import { migErrorOf } from '../helpers/mig-error.ts'

const KiB = 1024
const MiB = 1024 * 1024
const SIZE = SCATTERED_SIZE
const DATA_BYTES = SCATTERED_DATA_BYTES

const { tmp, sink, src: scattered } = scatteredBench('mig-readers-')

const allocated = (p: string) => statSync(p).blocks * 512

/** `qemu-img convert -O raw` of `src` (the reference bytes). */
const qemuRaw = (src: string, fmt?: string) => qemuRawOf(src, path.join(tmp.dir, `ref-${path.basename(src)}-${Math.random().toString(36).slice(2)}.raw`), fmt)

const disk = (format: ManifestDisk['disk_format'], source: ManifestDisk['source'], capacity = SIZE, extra: Partial<ManifestDisk> = {}) =>
  manifestDisk(format, source, capacity, extra)

/** openDiskReader + copyDisk into a fresh file-sink volume (default engine: qemu-img where the reader allows it). */
const copy = (d: ManifestDisk, engine: 'auto' | 'node' = 'auto') => copyIntoSink(sink, d, engine)

describe('qemu formats through qemu-nbd', () => {
  const cases: Array<[string, ManifestDisk['disk_format'], string[]]> = [
    // Images the readers by block table leave to qemu (qcow2-clusters.ts, vmdk-grains.ts).
    ['qcow2 with subclusters (extended L2)', 'qcow2', ['-o', 'extended_l2=on']],
    ['vmdk twoGbMaxExtentSparse', 'vmdk', ['-o', 'subformat=twoGbMaxExtentSparse']],
  ]
  for (const [name, fmt, opts] of cases) {
    for (const engine of ['auto', 'node'] as const) {
      test(`${name} (${engine === 'auto' ? 'qemu-img engine' : 'node engine'}): bit-exact, sparse destination`, async () => {
        const img = path.join(tmp.dir, `src-${name.replace(/\W+/g, '_')}-${engine}.${fmt}`)
        execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', fmt, ...opts, scattered.raw, img])
        const ref = qemuRaw(img, fmt)
        const out = await copy(disk(fmt, { path: img }, statSync(ref).size), engine)
        expect(out.qemuNode).toBeDefined()
        expect(out.size).toBe(statSync(ref).size)
        expect(sha256File(out.path)).toBe(sha256File(ref))
        if (out.size === SIZE) expect(sha256File(out.path)).toBe(scattered.sha)
        // Zeros inside allocated blocks are not written either way.
        expect(allocated(out.path)).toBeLessThanOrEqual(DATA_BYTES * 1.05)
        // The node engine counts what it wrote; the qemu-img engine the data extents it handed over.
        if (engine === 'node') expect(out.res.bytes_written).toBe(DATA_BYTES)
        else expect(out.res.bytes_written).toBeGreaterThanOrEqual(DATA_BYTES)
      })
    }
  }

  test('a text-descriptor vmdk inside a tar is refused (E_MIG_UNSUPPORTED_FORMAT)', async () => {
    const dir = path.join(tmp.dir, 'ova2')
    mkdirSync(dir)
    writeFileSync(path.join(dir, 'd.vmdk'), '# Disk DescriptorFile\nversion=1\ncreateType="monolithicFlat"\nRW 8 FLAT "/etc/passwd" 0\n')
    const ova = path.join(tmp.dir, 'evil.ova')
    execFileSync('tar', ['-C', dir, '-cf', ova, 'd.vmdk'])
    const m = (await listTarMembers(ova))[0]
    const err = await migErrorOf(openDiskReader(disk('vmdk', { path: ova, offset: m.offset, length: m.size, member: m.name }, 4096)))
    expect(err.code).toBe('E_MIG_UNSUPPORTED_FORMAT')
  })

  test('a qcow2 with an external data file is refused (E_MIG_UNSUPPORTED_FORMAT)', async () => {
    const img = path.join(tmp.dir, 'ext.qcow2')
    execFileSync('qemu-img', ['create', '-f', 'qcow2', '-o', `data_file=${path.join(tmp.dir, 'ext.data')}`, img, '1M'])
    const err = await migErrorOf(openDiskReader(disk('qcow2', { path: img }, MiB)))
    expect(err.code).toBe('E_MIG_UNSUPPORTED_FORMAT')
    expect(err.message).toContain('external data file')
  })

  test('an image larger than the manifest capacity is refused', async () => {
    const img = path.join(tmp.dir, 'cap.qcow2')
    execFileSync('qemu-img', ['create', '-f', 'qcow2', img, '8M'])
    const err = await migErrorOf(openDiskReader(disk('qcow2', { path: img }, 4 * MiB)))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('8388608')
  })
})

describe("damaged images are refused before any copy (qemu-img check; for VHDX and VDI the block table reader's own check)", () => {
  for (const fmt of ['qcow2', 'vdi', 'vhdx', 'vmdk'] as const) {
    test(`${fmt} cut short: E_MIG_DISK_READ_FAILED instead of zeros where the data was`, async () => {
      const img = path.join(tmp.dir, `cut.${fmt}`)
      execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', fmt, scattered.raw, img])
      execFileSync('truncate', ['-s', String(Math.floor(statSync(img).size / 3)), img])
      const err = await migErrorOf(openDiskReader(disk(fmt, { path: img })))
      expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
      expect(err.message).toContain(img)
    })
  }

  test('an intact qcow2 passes the check and opens', async () => {
    const img = path.join(tmp.dir, 'intact.qcow2')
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', scattered.raw, img])
    const r = await openDiskReader(disk('qcow2', { path: img }))
    expect(r.size).toBe(SIZE)
    await r.close()
  })
})

describe('raw and XVA readers', () => {
  test('a raw image inside a tar is read by positioned reads at its member offset', async () => {
    const dir = path.join(tmp.dir, 'rawtar')
    mkdirSync(dir)
    execFileSync('cp', ['--sparse=always', scattered.raw, path.join(dir, 'disk.img')])
    writeFileSync(path.join(dir, 'a.txt'), 'x'.repeat(700))
    const tar = path.join(tmp.dir, 'raw.tar')
    execFileSync('tar', ['-C', dir, '-cf', tar, 'a.txt', 'disk.img'])
    const m = (await listTarMembers(tar)).find((x) => x.name === 'disk.img')!
    expect(m.offset).toBe(2048)
    const out = await copy(disk('raw', { path: tar, offset: m.offset, length: m.size, member: m.name }))
    expect(sha256File(out.path)).toBe(scattered.sha)
    expect(allocated(out.path)).toBeLessThanOrEqual(DATA_BYTES * 1.05)
    expect(out.res.bytes_read).toBe(SIZE) // a tar member has no holes (qemu-img map): all of it is data
  })

  test('a raw member range beyond the archive is E_MIG_DISK_READ_FAILED', async () => {
    const err = await migErrorOf(openDiskReader(disk('raw', { path: scattered.raw, offset: SIZE - 512, length: 1024 })))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
  })

  test('XVA: Ref:N/NNNNNNNN 1 MiB blocks at N MiB, missing blocks read as zeros and are never read', async () => {
    const dir = path.join(tmp.dir, 'xva')
    mkdirSync(path.join(dir, 'Ref:5'), { recursive: true })
    mkdirSync(path.join(dir, 'Ref:9'), { recursive: true })
    writeFileSync(path.join(dir, 'ova.xml'), '<value/>')
    const capacity = 10 * MiB
    const expected = Buffer.alloc(capacity)
    const blocks: Record<number, Buffer> = {
      0: randomBytes(MiB),
      3: Buffer.concat([randomBytes(MiB / 2), Buffer.alloc(MiB / 2)]),
      4: randomBytes(MiB),
      9: randomBytes(MiB),
    }
    for (const [i, b] of Object.entries(blocks)) {
      const name = String(i).padStart(8, '0')
      writeFileSync(path.join(dir, 'Ref:5', name), b)
      // Both companion kinds: SHA-1 (older xapi) and XXH64 (xapi today).
      if (Number(i) % 2 === 0) writeFileSync(path.join(dir, 'Ref:5', `${name}.checksum`), createHash('sha1').update(b).digest('hex'))
      else writeFileSync(path.join(dir, 'Ref:5', `${name}.xxhash`), xxh64Upper(b))
      b.copy(expected, Number(i) * MiB)
    }
    writeFileSync(path.join(dir, 'Ref:9', '00000001'), randomBytes(MiB)) // another VDI: ignored
    const xva = path.join(tmp.dir, 'vm.xva')
    execFileSync('tar', ['-C', dir, '-cf', xva, 'ova.xml', 'Ref:5', 'Ref:9'])
    const d = disk('raw', { path: xva, member: 'Ref:5', layout: 'xva_blocks' }, capacity)
    const reader = await openDiskReader(d)
    const ext: Array<[number, number, boolean]> = []
    for await (const e of reader.extents(0)) ext.push([e.offset / MiB, e.length / MiB, e.zero])
    expect(ext).toEqual([
      [0, 1, false],
      [1, 2, true],
      [3, 2, false],
      [5, 4, true],
      [9, 1, false],
    ])
    // A read across a block edge and a missing block.
    expect((await reader.read(MiB - 100, 200)).equals(expected.subarray(MiB - 100, MiB + 100))).toBe(true)
    await reader.close()
    const out = await copy(d)
    expect(out.res.bytes_read).toBe(4 * MiB)
    expect(out.res.bytes_written).toBe(3.5 * MiB)
    expect(createHash('sha256').update(readFileSync(out.path)).digest('hex')).toBe(createHash('sha256').update(expected).digest('hex'))
  })

  test('XVA: an xapi keep-alive (a zero-length chunk re-sent in full later) reads as the full chunk', async () => {
    const dir = path.join(tmp.dir, 'xva-ka')
    mkdirSync(path.join(dir, 'Ref:2'), { recursive: true })
    writeFileSync(path.join(dir, 'Ref:2', '00000001'), '')
    writeFileSync(path.join(dir, 'Ref:2', '00000001.xxhash'), 'EF46DB3751D8E999')
    const xva = path.join(tmp.dir, 'ka.xva')
    execFileSync('tar', ['-C', dir, '-cf', xva, '--no-recursion', 'Ref:2/00000001', 'Ref:2/00000001.xxhash'])
    const full = randomBytes(MiB)
    writeFileSync(path.join(dir, 'Ref:2', '00000001'), full)
    writeFileSync(path.join(dir, 'Ref:2', '00000001.checksum'), createHash('sha1').update(full).digest('hex'))
    execFileSync('tar', ['-C', dir, '-rf', xva, '--no-recursion', 'Ref:2/00000001', 'Ref:2/00000001.checksum'])
    const reader = await openDiskReader(disk('raw', { path: xva, member: 'Ref:2', layout: 'xva_blocks' }, 2 * MiB))
    const ext: Array<[number, number, boolean]> = []
    for await (const e of reader.extents(0)) ext.push([e.offset / MiB, e.length / MiB, e.zero])
    expect(ext).toEqual([
      [0, 1, true],
      [1, 1, false],
    ])
    expect((await reader.read(MiB, MiB)).equals(full)).toBe(true)
    await reader.close()
  })

  for (const [ext, digest, name] of [
    ['checksum', (b: Uint8Array) => createHash('sha1').update(b).digest('hex'), 'SHA-1'],
    ['xxhash', xxh64Upper, 'XXH64'],
  ] as const) {
    test(`XVA: a block whose bytes differ from its .${ext} fails the read that holds it whole, and the copy, naming the member`, async () => {
      const dir = path.join(tmp.dir, `xva-bad-${ext}`)
      mkdirSync(path.join(dir, 'Ref:7'), { recursive: true })
      const good = randomBytes(MiB)
      const bad = randomBytes(MiB)
      writeFileSync(path.join(dir, 'Ref:7', '00000000'), good)
      writeFileSync(path.join(dir, 'Ref:7', `00000000.${ext}`), digest(good))
      writeFileSync(path.join(dir, 'Ref:7', '00000002'), bad)
      writeFileSync(path.join(dir, 'Ref:7', `00000002.${ext}`), digest(randomBytes(16)))
      const xva = path.join(tmp.dir, `tampered-${ext}.xva`)
      execFileSync('tar', ['-C', dir, '-cf', xva, '--sort=name', 'Ref:7'])
      const d = disk('raw', { path: xva, member: 'Ref:7', layout: 'xva_blocks' }, 4 * MiB)
      const reader = await openDiskReader(d)
      expect((await reader.read(0, MiB)).equals(good)).toBe(true)
      // Part of the block: not checked (a resumed copy may start inside a block).
      expect((await reader.read(2 * MiB + 512, 1024)).equals(bad.subarray(512, 1536))).toBe(true)
      const err = await migErrorOf(reader.read(2 * MiB, MiB))
      expect(err.code).toBe('E_MIG_MALFORMED_ARCHIVE')
      expect(err.message).toContain(`block Ref:7/00000002: ${name}`)
      await reader.close()
      const copied = await migErrorOf(copy(d))
      expect(copied.code).toBe('E_MIG_MALFORMED_ARCHIVE')
    })
  }

  test('XVA: a block beyond the capacity is E_MIG_MALFORMED_ARCHIVE', async () => {
    const dir = path.join(tmp.dir, 'xva2')
    mkdirSync(path.join(dir, 'Ref:1'), { recursive: true })
    writeFileSync(path.join(dir, 'Ref:1', '00000005'), Buffer.alloc(MiB, 1))
    const xva = path.join(tmp.dir, 'bad.xva')
    execFileSync('tar', ['-C', dir, '-cf', xva, 'Ref:1'])
    const err = await migErrorOf(openDiskReader(disk('raw', { path: xva, member: 'Ref:1', layout: 'xva_blocks' }, 2 * MiB)))
    expect(err.code).toBe('E_MIG_MALFORMED_ARCHIVE')
  })

  test('gzip-compressed and chunked OVF disks are E_MIG_UNSUPPORTED_FORMAT', async () => {
    expect((await migErrorOf(openDiskReader(disk('vmdk', { path: scattered.raw, compression: 'gzip' })))).code).toBe('E_MIG_UNSUPPORTED_FORMAT')
    expect((await migErrorOf(openDiskReader(disk('vmdk', { path: scattered.raw, layout: 'ovf_chunks', member: 'x.vmdk' })))).code).toBe(
      'E_MIG_UNSUPPORTED_FORMAT',
    )
  })
})

describe('corpus images', () => {
  const gunzip = (rel: string, name: string) => {
    const out = path.join(tmp.dir, name)
    writeFileSync(out, execFileSync('gzip', ['-dc', path.join(CORPUS, rel)], { maxBuffer: 64 * MiB }))
    return out
  }

  test('vagrant-mutate qcow2 v3 (4 MiB) and VirtualBox streamOptimized vmdk (4 MiB) are bit-exact', async () => {
    for (const [rel, fmt] of [
      ['vagrant-mutate/kvm-box-disk1.qcow2', 'qcow2'],
      ['vagrant-mutate/virtualbox-box-disk1.vmdk', 'vmdk'],
    ] as const) {
      const src = path.join(CORPUS, rel)
      const ref = qemuRaw(src, fmt)
      expect(statSync(ref).size).toBe(4 * MiB)
      const out = await copy(disk(fmt, { path: src }, 4 * MiB))
      expect(sha256File(out.path)).toBe(sha256File(ref))
    }
  })

  test('Hyper-V fixed VHDX and fixed VHD (10 MiB) are bit-exact', async () => {
    for (const [rel, fmt] of [
      ['dissect.hypervisor/fixed.vhdx.gz', 'vhdx'],
      ['dissect.hypervisor/fixed.vhd.gz', 'vpc'],
    ] as const) {
      const src = gunzip(rel, path.basename(rel, '.gz'))
      const ref = qemuRaw(src, fmt)
      const out = await copy(disk(fmt, { path: src }, 10 * MiB))
      expect(out.size).toBe(statSync(ref).size)
      expect(sha256File(out.path)).toBe(sha256File(ref))
    }
  })

  test('qcow2 backing chain: the validated chain is followed; without it the header reference is ignored', async () => {
    const dir = path.join(tmp.dir, 'chain')
    mkdirSync(dir)
    const files = [1, 2, 3].map((i) => {
      const out = path.join(dir, `backing-chain-${i}.qcow2`)
      writeFileSync(out, execFileSync('gzip', ['-dc', path.join(CORPUS, `dissect.hypervisor/backing-chain-${i}.qcow2.gz`)]))
      return out
    })
    // 512 MiB virtual, data only in the first 5 MiB (qemu-img map): compare the first 8 MiB and
    // check that the rest is unallocated (reads as zeros) in every file.
    const head = (p: string) => {
      const fd = openSync(p, 'r')
      const b = Buffer.alloc(8 * MiB)
      readSync(fd, b, 0, b.length, 0)
      closeSync(fd)
      return createHash('sha256').update(b).digest('hex')
    }
    const full = qemuRaw(files[0], 'qcow2')
    const size = statSync(full).size
    expect(size).toBe(512 * MiB)
    const withChain = await copy(disk('qcow2', { path: files[0] }, size, { backing_chain: [files[1], files[2]] }))
    expect(statSync(withChain.path).size).toBe(size)
    expect(head(withChain.path)).toBe(head(full))
    expect(allocated(withChain.path)).toBeLessThanOrEqual(8 * MiB)
    expect(withChain.res.bytes_read).toBe(5 * 64 * KiB)
    const topOnly = qemuRaw(`json:${JSON.stringify({ driver: 'qcow2', backing: null, file: { driver: 'file', filename: files[0] } })}`)
    const noChain = await copy(disk('qcow2', { path: files[0] }, size))
    expect(head(noChain.path)).toBe(head(topOnly))
    expect(allocated(noChain.path)).toBeLessThanOrEqual(8 * MiB)
    expect(head(topOnly)).not.toBe(head(full))
  })

  test('legacy qcow v1 with a 152 TiB header opened as qcow2: the header reader refuses it before qemu-nbd, naming the fix', async () => {
    const err = await migErrorOf(openDiskReader(disk('qcow2', { path: path.join(CORPUS, 'containerized-data-importer/invalid-qcow-large-size.img') }, 0)))
    expect(err.code).toBe('E_MIG_UNSUPPORTED_FORMAT')
    expect(err.message).toContain('legacy qcow (version 1) image is not supported; convert it to qcow2 first')
  })

  test('govmomi ttylinux OVA: its truncated streamOptimized vmdk member fails with E_MIG_DISK_READ_FAILED', async () => {
    const ova = path.join(CORPUS, 'govmomi/ttylinux-pc_i486-16.1.ova')
    const m = (await listTarMembers(ova)).find((x) => x.name.endsWith('.vmdk'))!
    expect([m.offset, m.size]).toEqual([7168, 1048576])
    const err = await migErrorOf(openDiskReader(disk('vmdk', { path: ova, offset: m.offset, length: m.size, member: m.name }, 61440 * 512)))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toContain('stream-optimized extent has no footer and end-of-stream marker (truncated?); refusing to copy it')
  })
})
