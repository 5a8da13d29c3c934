/**
 * Tar walking (lib/formats/tar.ts) against real archives: the corpus OVAs and archives GNU tar
 * writes here in ustar, pax and gnu formats, plus hand-made headers (base-256 size, bad
 * checksums, truncation).
 */
import { describe, test, expect, beforeAll, afterAll } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdirSync, writeFileSync, truncateSync, statSync } from 'node:fs'
import * as path from 'node:path'
import type { MigError } from '../../lib/errors.ts'
import { hashRange, listTarMembers, readTarMember } from '../../lib/formats/tar.ts'
import { InputScope } from '../../lib/hostpath.ts'
import { CORPUS, tempDir } from '../helpers/tmp.ts'
import { bytesAt } from '../helpers/reader-fixtures.ts'
import { expectMigThrown } from '../helpers/mig-error.ts'

let tmp: { dir: string; cleanup(): void }
beforeAll(() => {
  tmp = tempDir('mig-tar-')
})
afterAll(() => tmp.cleanup())

function tar(args: string[], cwd: string) {
  execFileSync('tar', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] })
}

/** A ustar header block with a correct checksum. */
function header(name: string, size: number | Buffer, type = '0'): Buffer {
  const h = Buffer.alloc(512)
  h.write(name, 0, 'utf8')
  h.write('0000644\0', 100)
  h.write('0000000\0', 108)
  h.write('0000000\0', 116)
  if (typeof size === 'number') h.write(size.toString(8).padStart(11, '0') + '\0', 124)
  else size.copy(h, 124)
  h.write('00000000000\0', 136)
  h.write(type, 156)
  h.write('ustar\0', 257, 'latin1')
  h.write('00', 263)
  h.fill(0x20, 148, 156)
  let sum = 0
  for (const b of h) sum += b
  h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'latin1')
  return h
}
const pad = (b: Buffer) => Buffer.concat([b, Buffer.alloc((512 - (b.length % 512)) % 512)])

describe('corpus archives', () => {
  const cases = [
    {
      file: 'govmomi/ttylinux-pc_i486-16.1.ova',
      members: [
        { name: 'ttylinux-pc_i486-16.1.ovf', size: 5005, offset: 512, type: 'file' },
        { name: 'ttylinux-pc_i486-16.1.mf', size: 159, offset: 6144, type: 'file' },
        { name: 'ttylinux-pc_i486-16.1-disk1.vmdk', size: 1048576, offset: 7168, type: 'file' },
      ],
    },
    {
      file: 'glance/testserver-bad-ovf.ova',
      members: [
        { name: 'illegal-xml.ovf', size: 62, offset: 512, type: 'file' },
        { name: 'testserver-disk1.vmdk', size: 4, offset: 1536, type: 'file' },
      ],
    },
  ]
  for (const c of cases) {
    test(`lists ${c.file}`, async () => {
      const members = await listTarMembers(path.join(CORPUS, c.file))
      expect(members).toEqual(c.members as any)
    })
  }

  test('member offsets point at the data: ttylinux VMDK starts with KDMV, descriptor with <?xml', async () => {
    const f = path.join(CORPUS, 'govmomi/ttylinux-pc_i486-16.1.ova')
    const [ovf, mf, vmdk] = await listTarMembers(f)
    expect(bytesAt(f, vmdk!.offset, 4).toString('latin1')).toBe('KDMV')
    expect((await readTarMember(f, ovf!, 4 << 20)).subarray(0, 5).toString()).toBe('<?xml')
    expect((await readTarMember(f, mf!, 4096)).toString()).toContain('SHA1 (ttylinux-pc_i486-16.1-disk1.vmdk) = 648e20a1e1625b1bb963b08c926bc18e62f15dfc')
    // sha1 of the member range equals the manifest's digest
    expect(await hashRange(f, vmdk!.offset, vmdk!.size, 'sha1')).toBe('648e20a1e1625b1bb963b08c926bc18e62f15dfc')
    expect(await hashRange(f, ovf!.offset, ovf!.size, 'sha1')).toBe('06271f767e0d5671c67e4edeaa2c157cabb66c2b')
  })

  test('a PNG named .ova is "not a tar archive"', async () => {
    await expectMigThrown(
      () => listTarMembers(path.join(CORPUS, 'glance/testserver-not-tar.ova')),
      'E_MIG_MALFORMED_ARCHIVE',
      'not a tar archive',
      'testserver-not-tar.ova',
    )
  })

  test('a gzip tar (Vagrant box) is E_MIG_UNSUPPORTED_FORMAT', async () => {
    await expectMigThrown(
      () => listTarMembers(path.join(CORPUS, 'vagrant-mutate/virtualbox-mutate-test.box')),
      'E_MIG_UNSUPPORTED_FORMAT',
      'gzip-compressed archive: decompress it first',
    )
  })
})

describe('archives written by GNU tar', () => {
  const long150 = 'd'.repeat(60) + '/' + 'n'.repeat(80) + '-long.vmdk' // 151 chars with a slash
  const long150flat = 'f'.repeat(145) + '.vmdk' // 150 chars, no slash: cannot use the ustar prefix

  function build(format: string, names: string[]): string {
    const src = path.join(tmp.dir, `src-${format}`)
    for (const [i, n] of names.entries()) {
      mkdirSync(path.dirname(path.join(src, n)), { recursive: true })
      writeFileSync(path.join(src, n), Buffer.alloc(1000 + i * 700, i + 1))
    }
    const out = path.join(tmp.dir, `${format}.tar`)
    tar([`--format=${format}`, '-cf', out, ...names], src)
    return out
  }

  for (const format of ['pax', 'gnu', 'ustar']) {
    test(`${format}: long names, sizes, offsets`, async () => {
      const names = format === 'ustar' ? ['a.ovf', long150] : ['a.ovf', long150, long150flat]
      const file = build(format, names)
      const members = (await listTarMembers(file)).filter((m) => m.type === 'file')
      expect(members.map((m) => m.name)).toEqual(names)
      for (const [i, m] of members.entries()) {
        expect(m.size).toBe(1000 + i * 700)
        expect(m.offset % 512).toBe(0)
        const data = bytesAt(file, m.offset, m.size)
        expect(data.every((b) => b === i + 1)).toBe(true)
        expect(bytesAt(file, m.offset + m.size, 1)[0]).toBe(0) // padding follows the data
      }
    })
  }

  test('directories and symlinks are typed; symlink target kept', async () => {
    const src = path.join(tmp.dir, 'src-links')
    mkdirSync(path.join(src, 'sub'), { recursive: true })
    writeFileSync(path.join(src, 'sub', 'x.vmdk'), 'xyz')
    execFileSync('ln', ['-s', 'sub/x.vmdk', path.join(src, 'link')])
    const out = path.join(tmp.dir, 'links.tar')
    tar(['--format=pax', '-cf', out, 'sub', 'link'], src)
    const m = await listTarMembers(out)
    expect(m.map((x) => [x.name, x.type, x.size])).toEqual([
      ['sub/', 'directory', 0],
      ['sub/x.vmdk', 'file', 3],
      ['link', 'symlink', 0],
    ])
    expect(m[2]!.linkname).toBe('sub/x.vmdk')
  })

  test('maxMembers bounds the listing', async () => {
    const file = build(
      'gnu',
      ['m1', 'm2', 'm3'].map((n) => `many/${n}`),
    )
    expect((await listTarMembers(file, { maxMembers: 3 })).length).toBe(3)
    await expectMigThrown(() => listTarMembers(file, { maxMembers: 2 }), 'E_MIG_MALFORMED_ARCHIVE', 'more than 2 members')
  })

  test('600 members (more than one turn of 256 headers): all listed in order; inside an input scope walked once per file, offset and bound', async () => {
    const names = Array.from({ length: 600 }, (_, i) => `many600/${String(i).padStart(4, '0')}`)
    const file = build('ustar', names)
    const all = await listTarMembers(file)
    expect(all.filter((m) => m.type === 'file').map((m) => m.name)).toEqual(names)
    expect(await listTarMembers(file)).not.toBe(all) // no scope: walked again
    const scope = new InputScope(tmp.dir)
    try {
      const [a, b] = await scope.run(() => Promise.all([listTarMembers(file), listTarMembers(file)]))
      expect(a).toBe(b)
      expect(a).toEqual(all)
      const later = await scope.run(() => listTarMembers(file, { offset: all[1]!.offset - 512 }))
      expect(later).not.toBe(a)
      expect(later.length).toBe(all.length - 1)
      expect(await scope.run(() => listTarMembers(file, { maxMembers: 5 })).catch((e: MigError) => e.code)).toBe('E_MIG_MALFORMED_ARCHIVE')
    } finally {
      scope.close()
    }
  })

  test('opts.offset starts the walk at a later header', async () => {
    const file = build('ustar', ['o1', 'o2'])
    const all = await listTarMembers(file)
    const rest = await listTarMembers(file, { offset: all[1]!.offset - 512 })
    expect(rest).toEqual([all[1]!])
  })
})

describe('hand-made headers', () => {
  test('base-256 size field', async () => {
    const size = Buffer.alloc(12)
    size[0] = 0x80
    size.writeUInt32BE(1536, 8)
    const file = path.join(tmp.dir, 'b256.tar')
    writeFileSync(file, Buffer.concat([header('big.img', size), Buffer.alloc(1536, 7), Buffer.alloc(1024)]))
    expect(await listTarMembers(file)).toEqual([{ name: 'big.img', size: 1536, offset: 512, type: 'file' }])
  })

  test('base-256 size of 8 GiB with 1 KiB of data: truncated member', async () => {
    const size = Buffer.alloc(12)
    size[0] = 0x80
    size.writeUInt32BE(2, 4) // byte 7 = 2: 2 * 2^32 = 8 GiB
    const file = path.join(tmp.dir, 'b256-trunc.tar')
    writeFileSync(file, Buffer.concat([header('huge.img', size), Buffer.alloc(1024)]))
    await expectMigThrown(() => listTarMembers(file), 'E_MIG_MALFORMED_ARCHIVE', 'truncated member huge.img: declares 8589934592 bytes, archive holds 1024')
  })

  test('PAX path/size override the ustar fields', async () => {
    // PAX records: "<len> <key>=<value>\n" where len counts the whole record
    const rec = (k: string, v: string) => {
      for (let n = 1; n < 400; n++) if (`${n} ${k}=${v}\n`.length === n) return `${n} ${k}=${v}\n`
      throw new Error('no length')
    }
    const body = rec('path', 'p'.repeat(200) + '.vmdk') + rec('size', '700')
    const pax = Buffer.from(body)
    const file = path.join(tmp.dir, 'pax-manual.tar')
    writeFileSync(file, Buffer.concat([header('PaxHeader', pax.length, 'x'), pad(pax), header('short', 5), pad(Buffer.alloc(700, 1)), Buffer.alloc(1024)]))
    const m = await listTarMembers(file)
    expect(m).toEqual([{ name: 'p'.repeat(200) + '.vmdk', size: 700, offset: 512 * 3, type: 'file' }])
  })

  test('PAX record over 1 MiB is refused', async () => {
    const file = path.join(tmp.dir, 'pax-big.tar')
    writeFileSync(file, Buffer.concat([header('PaxHeader', 2 * 1024 * 1024, 'x'), Buffer.alloc(2 * 1024 * 1024 + 1024)]))
    await expectMigThrown(() => listTarMembers(file), 'E_MIG_MALFORMED_ARCHIVE', 'limit 1048576')
  })

  test('malformed PAX record', async () => {
    const pax = Buffer.from('99 path=x\n')
    const file = path.join(tmp.dir, 'pax-bad.tar')
    writeFileSync(file, Buffer.concat([header('PaxHeader', pax.length, 'x'), pad(pax), header('a', 0), Buffer.alloc(1024)]))
    await expectMigThrown(() => listTarMembers(file), 'E_MIG_MALFORMED_ARCHIVE', 'bad PAX record')
  })

  test('bad checksum on a later header names the previous member', async () => {
    const bad = header('second', 10)
    bad[0] = 0x58 // change the name after the checksum was computed
    const file = path.join(tmp.dir, 'badsum.tar')
    writeFileSync(file, Buffer.concat([header('first.ovf', 3), pad(Buffer.from('abc')), bad, pad(Buffer.alloc(10)), Buffer.alloc(1024)]))
    await expectMigThrown(() => listTarMembers(file), 'E_MIG_MALFORMED_ARCHIVE', 'bad tar header checksum at offset 1024 after member first.ovf')
  })

  test('archive truncated mid-header', async () => {
    const file = path.join(tmp.dir, 'midheader.tar')
    writeFileSync(file, Buffer.concat([header('first.ovf', 3), pad(Buffer.from('abc')), header('second', 10).subarray(0, 300)]))
    await expectMigThrown(() => listTarMembers(file), 'E_MIG_MALFORMED_ARCHIVE', 'header at offset 1024 cut short by end of file (300 of 512 bytes)')
  })

  test('archive truncated inside member data (real tar, cut)', async () => {
    const src = path.join(tmp.dir, 'src-cut')
    mkdirSync(src, { recursive: true })
    writeFileSync(path.join(src, 'disk.vmdk'), Buffer.alloc(100_000, 3))
    const file = path.join(tmp.dir, 'cut.tar')
    tar(['-cf', file, 'disk.vmdk'], src)
    truncateSync(file, 512 + 40_000)
    await expectMigThrown(() => listTarMembers(file), 'E_MIG_MALFORMED_ARCHIVE', 'truncated member disk.vmdk: declares 100000 bytes, archive holds 40000')
  })

  test('missing end-of-archive blocks is a clean EOF; empty file lists nothing', async () => {
    const file = path.join(tmp.dir, 'noeof.tar')
    writeFileSync(file, Buffer.concat([header('only', 3), pad(Buffer.from('abc'))]))
    expect(await listTarMembers(file)).toEqual([{ name: 'only', size: 3, offset: 512, type: 'file' }])
    const empty = path.join(tmp.dir, 'empty.tar')
    writeFileSync(empty, '')
    expect(await listTarMembers(empty)).toEqual([])
  })

  test('GNU long name without its member', async () => {
    const ln = Buffer.from('x'.repeat(300) + '\0')
    const file = path.join(tmp.dir, 'dangling-L.tar')
    writeFileSync(file, Buffer.concat([header('././@LongLink', ln.length, 'L'), pad(ln)]))
    await expectMigThrown(() => listTarMembers(file), 'E_MIG_MALFORMED_ARCHIVE')
  })

  test('non-octal size field', async () => {
    const h = header('weird', Buffer.from('12345678x01\0'))
    const file = path.join(tmp.dir, 'nonoctal.tar')
    writeFileSync(file, Buffer.concat([h, Buffer.alloc(1024)]))
    await expectMigThrown(() => listTarMembers(file), 'E_MIG_MALFORMED_ARCHIVE', 'bad size field')
  })

  test('unreadable path is E_MIG_DISK_READ_FAILED', async () => {
    await expectMigThrown(() => listTarMembers(path.join(tmp.dir, 'does-not-exist.tar')), 'E_MIG_DISK_READ_FAILED')
  })
})

describe('readTarMember and hashRange', () => {
  test('readTarMember refuses members over maxBytes', async () => {
    const f = path.join(CORPUS, 'govmomi/ttylinux-pc_i486-16.1.ova')
    const members = await listTarMembers(f)
    await expectMigThrown(() => readTarMember(f, members[2]!, 4096), 'E_MIG_MALFORMED_ARCHIVE', 'ttylinux-pc_i486-16.1-disk1.vmdk is 1048576 bytes')
  })

  test('hashRange matches node crypto over a 5 MiB range spanning several reads', async () => {
    const file = path.join(tmp.dir, 'hash.bin')
    const data = Buffer.alloc(6 * 1024 * 1024)
    for (let i = 0; i < data.length; i += 4096) data.writeUInt32LE((i * 2654435761) >>> 0, i)
    writeFileSync(file, data)
    const [off, len] = [12345, 5 * 1024 * 1024 + 77]
    for (const alg of ['sha1', 'sha256', 'sha512'] as const) {
      expect(await hashRange(file, off, len, alg)).toBe(
        createHash(alg)
          .update(data.subarray(off, off + len))
          .digest('hex'),
      )
    }
    expect(await hashRange(file, 0, 0, 'sha256')).toBe(createHash('sha256').digest('hex'))
    await expectMigThrown(() => hashRange(file, statSync(file).size - 10, 20, 'sha1'), 'E_MIG_MALFORMED_ARCHIVE')
  })
})
