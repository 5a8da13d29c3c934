/**
 * Staging of gzip-compressed and chunked OVF files (lib/pipeline/readers/ovf-staged.ts) and the
 * readers opened over the staged file (openDiskReader with a staging directory): bytes as
 * `gzip -d` and `cat` give them, zero blocks left as holes, the staged file removed on close;
 * hostile or changed input: a gzip bomb, a corrupt gzip stream, chunks missing or changed since
 * inspection, a cancelled staging, no staging directory.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { gzipSync } from 'node:zlib'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { stageOvfFile } from '../../lib/pipeline/readers/ovf-staged.ts'
import { openDiskReader } from '../../lib/pipeline/readers/open.ts'
import { makeRawImage } from '../helpers/inputs.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const t = tempDir('mig-staged-')
afterAll(() => t.cleanup())

const disk = (source: ManifestDisk['source'], format: ManifestDisk['disk_format'], capacity: number): ManifestDisk =>
  ({ label: 'disk0', capacity_bytes: capacity, disk_format: format, source, controller: 'virtio', address: '0' }) as ManifestDisk

function split(file: string, chunk: number): string[] {
  const data = readFileSync(file)
  const names: string[] = []
  for (let k = 0; k * chunk < data.length; k++) {
    const name = `${file}.${String(k).padStart(9, '0')}`
    writeFileSync(name, data.subarray(k * chunk, (k + 1) * chunk))
    names.push(name)
  }
  return names
}

describe('staging gzip-compressed and chunked OVF files', () => {
  test('a gzip-compressed streamOptimized VMDK in 300 KiB chunks reads as its source; the staged file is sparse and removed on close', async () => {
    const d = path.join(t.dir, 'a')
    mkdirSync(d)
    const raw = makeRawImage(path.join(d, 'src.raw'), 24 * MiB, 5)
    execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=streamOptimized', raw, path.join(d, 'disk.vmdk')])
    execFileSync('gzip', ['-n', path.join(d, 'disk.vmdk')])
    const gz = path.join(d, 'disk.vmdk.gz')
    split(gz, 300 * 1024)
    const staging = path.join(d, 'staging')
    const r = await openDiskReader(
      disk({ path: gz, member: 'disk.vmdk.gz', length: statSync(gz).size, layout: 'ovf_chunks', compression: 'gzip' }, 'vmdk', 24 * MiB),
      { stagingDir: staging },
    )
    expect(r.size).toBe(24 * MiB)
    const staged = readdirSync(staging)
    expect(staged.length).toBe(1)
    // the staged VMDK is the inflated file, zero blocks left as holes
    expect(readFileSync(path.join(staging, staged[0]!)).equals(execFileSync('gzip', ['-dc', gz], { maxBuffer: 64 * MiB }))).toBe(true)
    expect(statSync(path.join(staging, staged[0]!)).blocks * 512).toBeLessThanOrEqual(statSync(path.join(staging, staged[0]!)).size + 4096)
    const src = readFileSync(raw)
    for (let o = 0; o < r.size; o += 8 * MiB) expect((await r.read(o, 8 * MiB)).equals(src.subarray(o, o + 8 * MiB))).toBe(true)
    await r.close()
    expect(readdirSync(path.join(d)).includes('staging')).toBe(false)
  })

  test('a gzip-compressed raw disk: all-zero blocks become holes', async () => {
    const d = path.join(t.dir, 'b')
    mkdirSync(d)
    const raw = makeRawImage(path.join(d, 'src.raw'), 16 * MiB, 6)
    writeFileSync(path.join(d, 'disk.img.gz'), gzipSync(readFileSync(raw)))
    const staged = await stageOvfFile(
      { path: path.join(d, 'disk.img.gz'), compression: 'gzip' },
      { dir: path.join(d, 's'), label: 'disk.img.gz', maxBytes: 17 * MiB },
    )
    expect(readFileSync(staged).equals(readFileSync(raw))).toBe(true)
    expect(statSync(staged).blocks * 512).toBeLessThan(4 * MiB)
  })

  test('hostile or changed input: gzip bomb, corrupt stream, missing or changed chunks, cancellation, no staging directory', async () => {
    const d = path.join(t.dir, 'c')
    mkdirSync(d)
    const dir = path.join(d, 's')
    // 64 MiB of zeros in 64 KiB of gzip, for a disk of 1 MiB
    writeFileSync(path.join(d, 'bomb.gz'), gzipSync(Buffer.alloc(64 * MiB)))
    let e = await thrown(() => stageOvfFile({ path: path.join(d, 'bomb.gz'), compression: 'gzip' }, { dir, label: 'bomb.gz', maxBytes: MiB }))
    expect([e.code, /inflates to more than 1048576 bytes/.test(e.message)]).toEqual(['E_MIG_MALFORMED_ARCHIVE', true])
    const good = gzipSync(Buffer.alloc(2 * MiB, 7))
    writeFileSync(path.join(d, 'cut.gz'), good.subarray(0, good.length - 100))
    e = await thrown(() => stageOvfFile({ path: path.join(d, 'cut.gz'), compression: 'gzip' }, { dir, label: 'cut.gz', maxBytes: 4 * MiB }))
    expect([e.code, /gzip/.test(e.message)]).toEqual(['E_MIG_MALFORMED_ARCHIVE', true])
    writeFileSync(path.join(d, 'junk.gz'), Buffer.alloc(4096, 0x41))
    expect((await thrown(() => stageOvfFile({ path: path.join(d, 'junk.gz'), compression: 'gzip' }, { dir, label: 'junk.gz', maxBytes: 4 * MiB }))).code).toBe(
      'E_MIG_MALFORMED_ARCHIVE',
    )
    // chunks: one removed, then the set changed in size since inspection
    writeFileSync(path.join(d, 'c.img'), Buffer.alloc(3 * MiB, 1))
    const chunks = split(path.join(d, 'c.img'), MiB)
    execFileSync('rm', [chunks[1]!])
    e = await thrown(() =>
      stageOvfFile({ path: path.join(d, 'c.img'), member: 'c.img', length: 3 * MiB, layout: 'ovf_chunks' }, { dir, label: 'c.img', maxBytes: 4 * MiB }),
    )
    expect([e.code, /c\.img\.000000001/.test(e.message)]).toEqual(['E_MIG_MALFORMED_ARCHIVE', true])
    writeFileSync(chunks[1]!, Buffer.alloc(MiB - 512, 1))
    expect(
      (
        await thrown(() =>
          stageOvfFile({ path: path.join(d, 'c.img'), member: 'c.img', length: 3 * MiB, layout: 'ovf_chunks' }, { dir, label: 'c.img', maxBytes: 4 * MiB }),
        )
      ).code,
    ).toBe('E_MIG_MALFORMED_ARCHIVE')
    // cancellation
    writeFileSync(path.join(d, 'big.gz'), gzipSync(Buffer.alloc(256 * MiB, 3)))
    const ac = new AbortController()
    setTimeout(() => ac.abort(), 50)
    e = await thrown(() =>
      stageOvfFile({ path: path.join(d, 'big.gz'), compression: 'gzip' }, { dir, label: 'big.gz', maxBytes: 512 * MiB, signal: ac.signal }),
    )
    expect(e.code).toBe('E_MIG_CANCELLED')
    // nothing is left in the staging directory after any failure
    expect(readdirSync(dir)).toEqual([])
    // without a staging directory the reader refuses, as before
    expect((await thrown(() => openDiskReader(disk({ path: path.join(d, 'bomb.gz'), compression: 'gzip' }, 'raw', MiB)))).code).toBe('E_MIG_UNSUPPORTED_FORMAT')
  })
})
