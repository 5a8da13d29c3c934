/**
 * The qcow2 reader by its L1 and L2 tables (lib/pipeline/readers/qcow2-clusters.ts), against
 * real qcow2 files written by qemu-img and qemu-io: bytes equal to `qemu-img convert -f qcow2 -O
 * raw`, only the clusters read, version 2 and 3, cluster sizes from 512 bytes to 2 MiB, zero
 * clusters, clusters stored out of order, a tar member, the corpus's qcow2 files; the images left
 * to qemu-nbd (compressed clusters, a backing file, subclusters, the dirty bit); and the
 * refusals before any copy (reserved bits, tables and clusters not aligned to a cluster, a cluster
 * beyond the end of the file, a file cut short after open).
 */
import { describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { closeSync, openSync, readSync, statSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { qcow2L1EntryAt, readQcow2Header } from '../../lib/formats/qcow2.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { openQcow2ClustersReader } from '../../lib/pipeline/readers/qcow2-clusters.ts'
import { migErrorOf } from '../helpers/mig-error.ts'
import { manifestDisk, qemuImageOf, qemuRawOf, sha256File, expectCutShortReadFails, expectZeroedAt7MiB, bytesAt, writeAt } from '../helpers/reader-fixtures.ts'
import { copyIntoSink, expectTarMemberCopied, scatteredBench, SCATTERED_DATA_BYTES, SCATTERED_SIZE, writeScatteredRaw } from '../helpers/scattered-disk.ts'

const KiB = 1024
const MiB = 1024 * 1024
const SIZE = SCATTERED_SIZE
const CORPUS = path.resolve(import.meta.dir, '../../../shared/corpus')

const { tmp, sink, src: scattered } = scatteredBench('mig-qcow2-clusters-')

const qcowDisk = (p: string, capacity = SIZE, src: Partial<ManifestDisk['source']> = {}) => manifestDisk('qcow2', { path: p, ...src }, capacity)
/** A qcow2 of `raw` written by qemu-img with `opts`. */
const qcowOf = (raw: string, name: string, opts: string[] = []) => qemuImageOf(raw, path.join(tmp.dir, name), 'qcow2', opts)
const copy = (d: ManifestDisk) => copyIntoSink(sink, d)
const qemuIo = (img: string, ...cmds: string[]) => execFileSync('qemu-io', ['-f', 'qcow2', ...cmds.flatMap((c) => ['-c', c]), img])

/** File offset of the L2 entry of cluster `c` (mapped by L1 entry 0) of `img`. */
async function l2EntryOffset(img: string, c: number): Promise<number> {
  const h = await readQcow2Header(img)
  const b = Buffer.alloc(8)
  const fd = openSync(img, 'r')
  readSync(fd, b, 0, 8, h.l1_table_offset)
  closeSync(fd)
  return qcow2L1EntryAt(b, 0).l2Offset + c * 8
}

/** Reads (`value` undefined) or overwrites the 8 big-endian bytes at `at` of `file`. */
function entryAt(file: string, at: number, value?: bigint): bigint {
  if (value !== undefined) {
    const b = Buffer.alloc(8)
    b.writeBigUInt64BE(value)
    writeAt(file, at, b)
  }
  return bytesAt(file, at, 8).readBigUInt64BE()
}

describe('qcow2 read by its clusters, without qemu-nbd', () => {
  for (const [cs, opts] of [
    ['64 KiB, version 3', []],
    ['512 bytes', ['-o', 'cluster_size=512']],
    ['2 MiB', ['-o', 'cluster_size=2M']],
    ['64 KiB, version 2', ['-o', 'compat=0.10']],
  ] as Array<[string, string[]]>) {
    test(`clusters of ${cs}: bit-exact, only the data read, no qemu node`, async () => {
      const img = qcowOf(scattered.raw, `c-${cs.replace(/\W+/g, '_')}.qcow2`, opts)
      const out = await copy(qcowDisk(img))
      expect(out.qemuNode).toBeUndefined() // the cluster reader (node engine), not qemu-nbd
      expect(sha256File(out.path)).toBe(scattered.sha)
      // qemu-img convert allocates only the clusters holding data: clusters up to 64 KiB hold
      // nothing else here; a 2 MiB cluster holds the zeros around its data too, read (what the
      // file holds of a cluster is read) but never written.
      if (cs === '2 MiB') expect(out.res.bytes_read).toBeGreaterThan(SCATTERED_DATA_BYTES)
      else expect(out.res.bytes_read).toBe(SCATTERED_DATA_BYTES)
      expect(out.res.bytes_read).toBeLessThanOrEqual(statSync(img).blocks * 512)
      expect(out.res.bytes_written).toBe(SCATTERED_DATA_BYTES)
    })
  }

  test('zero clusters (the zero flag of version 3): zero extents, never read; bytes as qemu-img reads them', async () => {
    const img = qcowOf(scattered.raw, 'zero-flag.qcow2')
    qemuIo(img, 'write -z 7M 512k') // half of the 1 MiB piece at 7 MiB: its clusters keep a host offset, flagged zero
    expect(entryAt(img, await l2EntryOffset(img, 112)) & 1n).toBe(1n)
    await expectZeroedAt7MiB(img, openQcow2ClustersReader)
    const out = await copy(qcowDisk(img))
    expect(out.res.bytes_read).toBe(SCATTERED_DATA_BYTES - 512 * KiB)
    expect(sha256File(out.path)).toBe(sha256File(qemuRawOf(img, path.join(tmp.dir, 'zero-flag.raw'), 'qcow2')))
  })

  test('clusters stored out of disk order (written last to first by qemu-io): bit-exact', async () => {
    const img = path.join(tmp.dir, 'reversed.qcow2')
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', img, String(SIZE)])
    qemuIo(img, 'write -P 0x5a 40M 64k', 'write -P 0xa5 20M 1M', 'write -P 0x11 0 128k')
    const raw = qemuRawOf(img, path.join(tmp.dir, 'reversed.raw'), 'qcow2')
    const out = await copy(qcowDisk(img))
    expect(out.qemuNode).toBeUndefined()
    expect(out.res.bytes_read).toBe(64 * KiB + MiB + 128 * KiB)
    expect(sha256File(out.path)).toBe(sha256File(raw))
  })

  test('a tar member read in place, and a read across clusters stored one after another', async () => {
    await expectTarMemberCopied(sink, qcowOf(scattered.raw, 'member.qcow2'), (src) => qcowDisk(src.path, SIZE, src), scattered.sha)
    const reader = (await openQcow2ClustersReader(qcowOf(scattered.raw, 'across.qcow2')))!
    try {
      const want = Buffer.alloc(2 * MiB)
      const fd = openSync(scattered.raw, 'r')
      readSync(fd, want, 0, want.length, 33 * MiB - MiB)
      closeSync(fd)
      expect((await reader.read(33 * MiB - MiB, 2 * MiB)).equals(want)).toBe(true)
    } finally {
      await reader.close()
    }
  })

  test('corpus: vagrant-mutate kvm-box-disk1.qcow2 and the base of dissect.hypervisor backing chain, bit-exact', async () => {
    const base = path.join(tmp.dir, 'backing-chain-3.qcow2')
    writeFileSync(base, execFileSync('gzip', ['-dc', path.join(CORPUS, 'dissect.hypervisor/backing-chain-3.qcow2.gz')]))
    for (const img of [path.join(CORPUS, 'vagrant-mutate/kvm-box-disk1.qcow2'), base]) {
      const h = await readQcow2Header(img)
      const reader = await openQcow2ClustersReader(img)
      expect(reader).not.toBeNull()
      await reader!.close()
      const out = await copy(qcowDisk(img, h.virtual_size))
      expect(out.qemuNode).toBeUndefined()
      expect(sha256File(out.path)).toBe(sha256File(qemuRawOf(img, path.join(tmp.dir, `${path.basename(img)}.raw`), 'qcow2')))
    }
  })
})

describe('qcow2 images left to qemu-nbd', () => {
  test('compressed clusters: the check at open finds them; qemu-nbd reads the image, bit-exact', async () => {
    const hex = writeScatteredRaw(path.join(tmp.dir, 'hex.raw'), 'hex')
    const img = qcowOf(hex, 'compressed.qcow2', ['-c'])
    expect(await openQcow2ClustersReader(img)).toBeNull()
    const out = await copy(qcowDisk(img))
    expect(out.qemuNode).toBeDefined()
    expect(sha256File(out.path)).toBe(sha256File(hex))
  })

  test('a backing file, extended L2 entries (subclusters) and the dirty bit: null here', async () => {
    const base = qcowOf(scattered.raw, 'base.qcow2')
    const child = path.join(tmp.dir, 'child.qcow2')
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-b', base, '-F', 'qcow2', child])
    expect(await openQcow2ClustersReader(child)).toBeNull()
    expect(await openQcow2ClustersReader(qcowOf(scattered.raw, 'extl2.qcow2', ['-o', 'extended_l2=on']))).toBeNull()
    const dirty = qcowOf(scattered.raw, 'dirty.qcow2')
    entryAt(dirty, 72, entryAt(dirty, 72) | 1n) // incompatible feature bit 0
    expect((await readQcow2Header(dirty)).dirty).toBe(true)
    expect(await openQcow2ClustersReader(dirty)).toBeNull()
  })
})

describe('qcow2 table refusals: before any copy, naming the cluster', () => {
  // Cluster 112 holds data (the piece at 7 MiB); its L2 entry is patched from its real value.
  const cases: Array<[string, (e: bigint, size: number) => bigint, string]> = [
    ['a cluster beyond the end of the file', (e, size) => (e & (1n << 63n)) | BigInt(size + 64 * KiB), 'cluster 112 at file offset'],
    ['a cluster not aligned to a cluster', (e) => e + 512n, 'not aligned'],
    ['reserved bits', (e) => e | (1n << 57n), 'reserved bits'],
  ]
  for (const [name, patch, words] of cases) {
    test(`${name}: E_MIG_DISK_READ_FAILED`, async () => {
      const img = qcowOf(scattered.raw, `bad-${name.replace(/\W+/g, '_')}.qcow2`)
      const at = await l2EntryOffset(img, 112)
      entryAt(img, at, patch(entryAt(img, at), statSync(img).size))
      const err = await migErrorOf(openDiskReader(qcowDisk(img)))
      expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
      expect(err.message).toContain(img)
      expect(err.message).toContain(words)
      expect(err.message).toContain('cluster 112')
    })
  }

  test('an L1 entry with reserved bits, and one whose L2 table lies beyond the end of the file', async () => {
    for (const [name, patch, words] of [
      ['l1-reserved', (e: bigint) => e | 2n, 'L1 entry 0 has reserved bits set'],
      ['l1-beyond', (e: bigint) => (e & (1n << 63n)) | (1n << 40n), 'the L2 table of L1 entry 0 at file offset'],
    ] as Array<[string, (e: bigint) => bigint, string]>) {
      const img = qcowOf(scattered.raw, `${name}.qcow2`)
      const at = (await readQcow2Header(img)).l1_table_offset
      entryAt(img, at, patch(entryAt(img, at)))
      const err = await migErrorOf(openDiskReader(qcowDisk(img)))
      expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
      expect(err.message).toContain(words)
    }
  })

  test('a file cut short after it was opened: the read fails, no zeros copied', async () => {
    await expectCutShortReadFails(qcowOf(scattered.raw, 'shrinks.qcow2'), openQcow2ClustersReader)
  })
})
