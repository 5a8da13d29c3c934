/**
 * The `ova_archive` and `ovf_folder` importers (lib/importers/ova-archive.ts, ovf-folder.ts):
 * corpus OVAs, and OVF packages built here with qemu-img (streamOptimized VMDK), GNU tar and a
 * hand-written DSP0243 1.0 descriptor and SHA256 `.mf`.
 */
import { describe, test, expect, beforeAll, afterAll } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdirSync, readFileSync, writeFileSync, symlinkSync, copyFileSync, statSync, truncateSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { VmManifest } from '../../lib/manifest.ts'
import { importer as ova } from '../../lib/importers/ova-archive.ts'
import { importer as ovfFolder } from '../../lib/importers/ovf-folder.ts'
import { CORPUS, tempDir } from '../helpers/tmp.ts'
import { bytesAt } from '../helpers/reader-fixtures.ts'
import { expectMigThrown } from '../helpers/mig-error.ts'

const MiB = 2 ** 20
let tmp: { dir: string; cleanup(): void }
let root: string // import root of the generated packages
let vmdk1: string
let vmdk2: string

function run(cmd: string, args: string[], cwd?: string) {
  execFileSync(cmd, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] })
}
const sha256 = (b: Buffer | string) => createHash('sha256').update(b).digest('hex')

interface FileSpec {
  href: string
  id: string
  size: number
  extra?: string
}
/** DSP0243 1.0 descriptor of a two-disk VM (disk 1 on SCSI 0 unit 0, disk 2 on IDE 1 unit 1). */
function descriptor(files: FileSpec[], opts: { disk2Format?: string } = {}): string {
  const [f1, f2] = files
  return `<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1"
  xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData"
  xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData"
  xmlns:vmw="http://www.vmware.com/schema/ovf">
  <References>
    ${files.map((f) => `<File ovf:href="${f.href}" ovf:id="${f.id}" ovf:size="${f.size}" ${f.extra ?? ''}/>`).join('\n    ')}
  </References>
  <DiskSection><Info>disks</Info>
    <Disk ovf:diskId="vmdisk1" ovf:fileRef="${f1!.id}" ovf:capacity="3" ovf:capacityAllocationUnits="byte * 2^20" ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>
    <Disk ovf:diskId="vmdisk2" ovf:fileRef="${f2!.id}" ovf:capacity="1048576" ovf:format="${opts.disk2Format ?? 'http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized'}"/>
  </DiskSection>
  <NetworkSection><Info>nets</Info><Network ovf:name="lan"><Description>LAN</Description></Network></NetworkSection>
  <VirtualSystem ovf:id="two-disks">
    <Info>vm</Info><Name>two-disks</Name>
    <OperatingSystemSection ovf:id="96" vmw:osType="debian10_64Guest"><Info>os</Info></OperatingSystemSection>
    <VirtualHardwareSection><Info>hw</Info>
      <System><vssd:ElementName>Virtual Hardware Family</vssd:ElementName><vssd:InstanceID>0</vssd:InstanceID><vssd:VirtualSystemType>vmx-14</vssd:VirtualSystemType></System>
      <Item><rasd:ElementName>2 CPU</rasd:ElementName><rasd:InstanceID>1</rasd:InstanceID><rasd:ResourceType>3</rasd:ResourceType><rasd:VirtualQuantity>2</rasd:VirtualQuantity></Item>
      <Item><rasd:AllocationUnits>byte * 2^20</rasd:AllocationUnits><rasd:ElementName>mem</rasd:ElementName><rasd:InstanceID>2</rasd:InstanceID><rasd:ResourceType>4</rasd:ResourceType><rasd:VirtualQuantity>768</rasd:VirtualQuantity></Item>
      <Item><rasd:Address>0</rasd:Address><rasd:ElementName>SCSI 0</rasd:ElementName><rasd:InstanceID>3</rasd:InstanceID><rasd:ResourceSubType>lsilogic</rasd:ResourceSubType><rasd:ResourceType>6</rasd:ResourceType></Item>
      <Item><rasd:Address>1</rasd:Address><rasd:ElementName>IDE 1</rasd:ElementName><rasd:InstanceID>4</rasd:InstanceID><rasd:ResourceType>5</rasd:ResourceType></Item>
      <Item><rasd:AddressOnParent>0</rasd:AddressOnParent><rasd:ElementName>Hard disk 1</rasd:ElementName><rasd:HostResource>ovf:/disk/vmdisk1</rasd:HostResource><rasd:InstanceID>5</rasd:InstanceID><rasd:Parent>3</rasd:Parent><rasd:ResourceType>17</rasd:ResourceType></Item>
      <Item><rasd:AddressOnParent>1</rasd:AddressOnParent><rasd:ElementName>Hard disk 2</rasd:ElementName><rasd:HostResource>ovf:/disk/vmdisk2</rasd:HostResource><rasd:InstanceID>6</rasd:InstanceID><rasd:Parent>4</rasd:Parent><rasd:ResourceType>17</rasd:ResourceType></Item>
      <Item><rasd:Address>00:50:56:9A:BC:01</rasd:Address><rasd:Connection>lan</rasd:Connection><rasd:ElementName>Network adapter 1</rasd:ElementName><rasd:InstanceID>7</rasd:InstanceID><rasd:ResourceSubType>VmxNet3</rasd:ResourceSubType><rasd:ResourceType>10</rasd:ResourceType></Item>
      <Item ovf:required="false"><rasd:AddressOnParent>0</rasd:AddressOnParent><rasd:ElementName>CD</rasd:ElementName><rasd:InstanceID>8</rasd:InstanceID><rasd:Parent>4</rasd:Parent><rasd:ResourceType>15</rasd:ResourceType></Item>
      <vmw:Config ovf:required="false" vmw:key="firmware" vmw:value="efi"/>
      <vmw:Config ovf:required="false" vmw:key="uefi.secureBoot.enabled" vmw:value="true"/>
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>
`
}

/**
 * Writes a package into `<root>/<name>/` (descriptor `vm.ovf`, manifest `vm.mf` unless
 * `mf === null`, the disks) and, unless `noTar`, `<root>/<name>.ova` from `members` (default:
 * ovf, mf, disks). Returns the folder and the archive paths.
 */
function pkg(
  name: string,
  o: {
    files?: { href: string; src: string; extra?: string; declared?: number }[]
    ovfText?: (files: FileSpec[]) => string
    mf?: ((digests: Record<string, string>) => string) | null
    members?: string[]
    tarFormat?: string
  } = {},
): { dir: string; ova: string } {
  const dir = path.join(root, name)
  mkdirSync(dir, { recursive: true })
  const files = o.files ?? [
    { href: 'd1.vmdk', src: vmdk1 },
    { href: 'd2.vmdk', src: vmdk2 },
  ]
  const specs: FileSpec[] = []
  const digests: Record<string, string> = {}
  for (const [i, f] of files.entries()) {
    const dst = path.join(dir, f.href)
    mkdirSync(path.dirname(dst), { recursive: true })
    copyFileSync(f.src, dst)
    specs.push({ href: f.href, id: `file${i + 1}`, size: f.declared ?? statSync(dst).size, extra: f.extra })
    digests[f.href] = sha256(readFileSync(dst))
  }
  const text = (o.ovfText ?? ((s) => descriptor(s)))(specs)
  writeFileSync(path.join(dir, 'vm.ovf'), text)
  digests['vm.ovf'] = sha256(text)
  const mfNames = ['vm.ovf', ...files.map((f) => f.href)]
  if (o.mf !== null) writeFileSync(path.join(dir, 'vm.mf'), o.mf ? o.mf(digests) : mfNames.map((n) => `SHA256(${n})= ${digests[n]}\n`).join(''))
  const ovaPath = path.join(root, `${name}.ova`)
  const members = o.members ?? ['vm.ovf', ...(o.mf === null ? [] : ['vm.mf']), ...files.map((f) => f.href)]
  run('tar', [`--format=${o.tarFormat ?? 'gnu'}`, '-cf', ovaPath, ...members], dir)
  return { dir, ova: ovaPath }
}

const ctx = () => ({ importRoot: root })

beforeAll(() => {
  tmp = tempDir('mig-ova-')
  root = path.join(tmp.dir, 'imports')
  mkdirSync(root)
  const raw1 = path.join(tmp.dir, 'r1.raw')
  const raw2 = path.join(tmp.dir, 'r2.raw')
  const b1 = Buffer.alloc(3 * MiB)
  b1.write('DISK ONE', 0)
  for (let i = MiB; i < 2 * MiB; i += 512) b1.writeUInt32LE(i ^ 0x5a5a5a5a, i)
  writeFileSync(raw1, b1)
  const b2 = Buffer.alloc(MiB)
  b2.write('DISK TWO', 4096)
  writeFileSync(raw2, b2)
  vmdk1 = path.join(tmp.dir, 'one.vmdk')
  vmdk2 = path.join(tmp.dir, 'two.vmdk')
  run('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=streamOptimized', raw1, vmdk1])
  run('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=streamOptimized', raw2, vmdk2])
})
afterAll(() => tmp.cleanup())

describe('corpus OVAs', () => {
  test('ttylinux: disk member truncated to 1 MiB of the declared 10595840 bytes', async () => {
    await expectMigThrown(
      () => ova.inspect(path.join(CORPUS, 'govmomi/ttylinux-pc_i486-16.1.ova'), { importRoot: CORPUS }),
      'E_MIG_MALFORMED_ARCHIVE',
      'ttylinux-pc_i486-16.1-disk1.vmdk',
      'declares 10595840 bytes, archive holds 1048576',
    )
  })
  test('glance testserver-bad-ovf.ova: descriptor is not well-formed XML', async () => {
    await expectMigThrown(
      () => ova.inspect(path.join(CORPUS, 'glance/testserver-bad-ovf.ova'), { importRoot: CORPUS }),
      'E_MIG_MALFORMED_ARCHIVE',
      'illegal-xml.ovf',
      'not well-formed XML',
    )
  })
  test('glance testserver-not-tar.ova: a PNG', async () => {
    await expectMigThrown(
      () => ova.inspect(path.join(CORPUS, 'glance/testserver-not-tar.ova'), { importRoot: CORPUS }),
      'E_MIG_MALFORMED_ARCHIVE',
      'not a tar archive',
    )
  })
  test('Vagrant .box (gzip tar)', async () => {
    await expectMigThrown(
      () => ova.inspect(path.join(CORPUS, 'vagrant-mutate/virtualbox-mutate-test.box'), { importRoot: CORPUS }),
      'E_MIG_UNSUPPORTED_FORMAT',
      'gzip-compressed archive: decompress it first',
    )
  })
  test('the Vagrant box decompressed is a VirtualBox OVA (./-prefixed members)', async () => {
    const gunz = path.join(root, 'box.ova')
    writeFileSync(gunz, execFileSync('gzip', ['-dc', path.join(CORPUS, 'vagrant-mutate/virtualbox-mutate-test.box')]))
    const m = await ova.inspect(gunz, ctx())
    expect(m).toMatchObject({
      name: 'mutate-test',
      source_format: 'ova_archive',
      guest_os: { family: 'linux', id: 'Linux26' },
      memory_bytes: 256 * MiB,
      firmware: 'bios',
    })
    expect(m.disks).toEqual([
      {
        label: 'disk1',
        capacity_bytes: 4 * MiB,
        disk_format: 'vmdk',
        source: { path: gunz, offset: 13824, length: 68096, member: './box-disk1.vmdk' },
        controller: 'sata',
        address: '0:0',
      },
    ])
    expect(bytesAt(gunz, 13824, 4).toString('latin1')).toBe('KDMV')
    expect(m.nics[0]!.mac).toBe('08:00:27:55:b8:8d')
    expect(m.warnings).toContain('box.ova: no .mf manifest; file digests not verified')
  })
})

describe('generated OVA', () => {
  test('two streamOptimized disks: manifest, member offsets, verified .mf', async () => {
    const { ova: file } = pkg('two')
    const m = await ova.inspect(file, ctx())
    expect(VmManifest.safeParse(m).success).toBe(true)
    expect(m).toMatchObject({
      name: 'two-disks',
      source_format: 'ova_archive',
      guest_os: { family: 'linux', id: 'debian10_64Guest' },
      firmware: 'efi',
      secure_boot: true,
      cpu: { count: 2, cores_per_socket: 1 },
      memory_bytes: 768 * MiB,
      cbt_available: false,
      nics: [{ label: 'Network adapter 1', mac: '00:50:56:9a:bc:01', model: 'vmxnet3', network: 'lan' }],
    })
    expect(m.disks.map((d) => [d.label, d.capacity_bytes, d.disk_format, d.controller, d.address, d.source.member, d.source.length])).toEqual([
      ['Hard disk 1', 3 * MiB, 'vmdk', 'scsi', '0:0', 'd1.vmdk', statSync(vmdk1).size],
      ['Hard disk 2', MiB, 'vmdk', 'ide', '1:1', 'd2.vmdk', statSync(vmdk2).size],
    ])
    for (const [i, src] of [vmdk1, vmdk2].entries()) {
      const s = m.disks[i]!.source
      expect(s.path).toBe(file)
      expect(s.digest).toBeUndefined() // small: verified at inspect
      expect(bytesAt(file, s.offset!, 4).toString('latin1')).toBe('KDMV')
      expect(sha256(bytesAt(file, s.offset!, s.length!))).toBe(sha256(readFileSync(src)))
    }
    expect(m.warnings).toEqual([])
  })

  test('PAX archive with a 150-character disk name', async () => {
    const long = 'x'.repeat(145) + '.vmdk'
    const { ova: file } = pkg('pax', {
      files: [
        { href: long, src: vmdk1 },
        { href: 'd2.vmdk', src: vmdk2 },
      ],
      tarFormat: 'pax',
    })
    const m = await ova.inspect(file, ctx())
    expect(m.disks[0]!.source.member).toBe(long)
    expect(sha256(bytesAt(file, m.disks[0]!.source.offset!, m.disks[0]!.source.length!))).toBe(sha256(readFileSync(vmdk1)))
  })

  test('GNU archive with a long name in a subfolder, descriptor in the subfolder too', async () => {
    const sub = 'folder/' + 'y'.repeat(120)
    const dir = path.join(root, 'gnusub')
    pkg('gnusub-src', {
      files: [
        { href: 'long-' + 'z'.repeat(110) + '.vmdk', src: vmdk1 },
        { href: 'd2.vmdk', src: vmdk2 },
      ],
    })
    mkdirSync(path.join(dir, sub), { recursive: true })
    run('cp', ['-r', path.join(root, 'gnusub-src') + '/.', path.join(dir, sub)])
    const file = path.join(root, 'gnusub.ova')
    run('tar', ['--format=gnu', '-cf', file, `${sub}/vm.ovf`, `${sub}/vm.mf`, `${sub}/long-${'z'.repeat(110)}.vmdk`, `${sub}/d2.vmdk`], dir)
    const m = await ova.inspect(file, ctx())
    expect(m.disks.map((d) => d.source.member)).toEqual([`${sub}/long-${'z'.repeat(110)}.vmdk`, `${sub}/d2.vmdk`])
  })

  test('.mf digest mismatch names the file, algorithm, expected and actual digests', async () => {
    const wrong = '0'.repeat(64)
    const { ova: file } = pkg('mismatch', { mf: (d) => `SHA256(vm.ovf)= ${d['vm.ovf']}\nSHA256(d1.vmdk)= ${d['d1.vmdk']}\nSHA256(d2.vmdk)= ${wrong}\n` })
    const err = await expectMigThrown(() => ova.inspect(file, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'd2.vmdk', 'SHA256', wrong, sha256(readFileSync(vmdk2)))
    expect(err.details).toMatchObject({ file: 'd2.vmdk', algorithm: 'sha256', expected: wrong })
  })

  test('.mf naming a file that is not in the archive', async () => {
    const { ova: file } = pkg('mfghost', {
      mf: (d) =>
        `SHA1(vm.ovf)= ${createHash('sha1')
          .update(readFileSync(path.join(root, 'mfghost', 'vm.ovf')))
          .digest('hex')}\nSHA256(ghost.vmdk)= ${d['d1.vmdk']}\n`,
    })
    await expectMigThrown(() => ova.inspect(file, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'ghost.vmdk')
  })

  test('a disk member missing from the archive', async () => {
    const { ova: file } = pkg('missing', { mf: null, members: ['vm.ovf', 'd1.vmdk'] })
    await expectMigThrown(() => ova.inspect(file, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'd2.vmdk', 'not in the archive')
  })

  test('a member shorter than ovf:size', async () => {
    const { ova: file } = pkg('short', {
      mf: null,
      files: [
        { href: 'd1.vmdk', src: vmdk1 },
        { href: 'd2.vmdk', src: vmdk2, declared: statSync(vmdk2).size + 4096 },
      ],
    })
    await expectMigThrown(() => ova.inspect(file, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'truncated member d2.vmdk')
  })

  test('href ../../etc/passwd, an absolute path or a URL is E_MIG_HOST_PATH_REJECTED', async () => {
    for (const [n, href] of [
      ['dotdot', '../../etc/passwd'],
      ['abs', '/etc/passwd'],
      ['url', 'http://example.com/d2.vmdk'],
    ] as const) {
      const { ova: file } = pkg(`href-${n}`, { mf: null, ovfText: (s) => descriptor([s[0]!, { ...s[1]!, href }]) })
      await expectMigThrown(() => ova.inspect(file, ctx()), 'E_MIG_HOST_PATH_REJECTED', href)
    }
  })

  test('descriptor not first: accepted with a warning', async () => {
    const { ova: file } = pkg('notfirst', { members: ['d1.vmdk', 'vm.ovf', 'vm.mf', 'd2.vmdk'] })
    const m = await ova.inspect(file, ctx())
    expect(m.disks.length).toBe(2)
    expect(m.warnings).toEqual(['notfirst.ova: the descriptor vm.ovf is not the first member (DSP0243 5.3 wants it first)'])
  })

  test('two descriptors are refused, listing them', async () => {
    const { dir } = pkg('twoovf', { mf: null })
    writeFileSync(path.join(dir, 'other.ovf'), '<x/>')
    const file = path.join(root, 'twoovf2.ova')
    run('tar', ['-cf', file, 'vm.ovf', 'other.ovf', 'd1.vmdk', 'd2.vmdk'], dir)
    await expectMigThrown(() => ova.inspect(file, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'several .ovf descriptors: vm.ovf, other.ovf')
  })

  test('no descriptor at all', async () => {
    const file = path.join(root, 'nodesc.ova')
    run('tar', ['-cf', file, '-C', path.dirname(vmdk1), path.basename(vmdk1)])
    await expectMigThrown(() => ova.inspect(file, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'no .ovf descriptor')
  })

  test('a disk over 64 MiB: digest handed to DiskSource.digest, not hashed at inspect', async () => {
    const big = path.join(tmp.dir, 'big.raw')
    writeFileSync(big, '')
    truncateSync(big, 65 * MiB)
    const { ova: file } = pkg('bigdisk', {
      files: [
        { href: 'd1.vmdk', src: vmdk1 },
        { href: 'big.img', src: big },
      ],
      ovfText: (s) => descriptor(s, { disk2Format: '' }).replace('ovf:capacity="1048576"', `ovf:capacity="${65 * MiB}"`),
    })
    const m = await ova.inspect(file, ctx())
    expect(m.disks[1]).toMatchObject({ disk_format: 'raw', capacity_bytes: 65 * MiB, source: { member: 'big.img', length: 65 * MiB } })
    expect(m.disks[1]!.source.digest).toEqual({ algorithm: 'sha256', hex: sha256(Buffer.alloc(65 * MiB)) })
    expect(m.warnings).toContain('big.img: format not declared and not recognized; reading it as raw')
  })

  test('ovf:chunkSize: every chunk member present gives layout ovf_chunks; a missing chunk is refused', async () => {
    const size = statSync(vmdk1).size
    const chunk = 8192
    const n = Math.ceil(size / chunk)
    const dir = path.join(root, 'chunks')
    mkdirSync(dir, { recursive: true })
    const data = readFileSync(vmdk1)
    const names: string[] = []
    for (let i = 0; i < n; i++) {
      const nm = `d1.vmdk.${String(i).padStart(9, '0')}`
      writeFileSync(path.join(dir, nm), data.subarray(i * chunk, (i + 1) * chunk))
      names.push(nm)
    }
    copyFileSync(vmdk2, path.join(dir, 'd2.vmdk'))
    writeFileSync(
      path.join(dir, 'vm.ovf'),
      descriptor([
        { href: 'd1.vmdk', id: 'file1', size, extra: `ovf:chunkSize="${chunk}"` },
        { href: 'd2.vmdk', id: 'file2', size: statSync(vmdk2).size },
      ]),
    )
    const file = path.join(root, 'chunks.ova')
    run('tar', ['-cf', file, 'vm.ovf', ...names, 'd2.vmdk'], dir)
    const m = await ova.inspect(file, ctx())
    expect(m.disks[0]).toMatchObject({
      disk_format: 'vmdk',
      capacity_bytes: 3 * MiB,
      source: { path: file, member: 'd1.vmdk', length: size, layout: 'ovf_chunks' },
    })
    const holey = path.join(root, 'chunks-missing.ova')
    run('tar', ['-cf', holey, 'vm.ovf', ...names.filter((_, i) => i !== 1), 'd2.vmdk'], dir)
    await expectMigThrown(() => ova.inspect(holey, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'd1.vmdk.000000001')
  })

  test('ovf:compression="gzip": compression recorded, format read from the inflated magic', async () => {
    const gz = path.join(tmp.dir, 'two.vmdk.gz')
    writeFileSync(gz, execFileSync('gzip', ['-c', vmdk2]))
    const { ova: file } = pkg('gzip', {
      files: [
        { href: 'd1.vmdk', src: vmdk1 },
        { href: 'd2.vmdk.gz', src: gz, extra: 'ovf:compression="gzip"' },
      ],
    })
    const m = await ova.inspect(file, ctx())
    expect(m.disks[1]!.source).toMatchObject({ member: 'd2.vmdk.gz', compression: 'gzip' })
    expect(m.disks[1]!.disk_format).toBe('vmdk')
  })

  test('a disk whose data lacks the declared VMDK signature', async () => {
    const junk = path.join(tmp.dir, 'junk.bin')
    writeFileSync(junk, Buffer.alloc(4096, 0x41))
    const { ova: file } = pkg('junk', {
      mf: null,
      files: [
        { href: 'd1.vmdk', src: vmdk1 },
        { href: 'd2.vmdk', src: junk },
      ],
    })
    await expectMigThrown(() => ova.inspect(file, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'd2.vmdk', 'no vmdk signature')
  })

  test('tar truncated mid-header', async () => {
    const { ova: file } = pkg('midhdr', { mf: null })
    const cut = path.join(root, 'midhdr-cut.ova')
    const b = readFileSync(file)
    const ovfSize = statSync(path.join(root, 'midhdr', 'vm.ovf')).size
    const secondHeader = 512 + Math.ceil(ovfSize / 512) * 512
    writeFileSync(cut, b.subarray(0, secondHeader + 200))
    await expectMigThrown(() => ova.inspect(cut, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'cut short by end of file')
  })

  test('random byte mutations give a MigError or a valid manifest, in bounded time', async () => {
    const { ova: file } = pkg('fuzz')
    const orig = readFileSync(file)
    const hot = 512 + Math.ceil(statSync(path.join(root, 'fuzz', 'vm.ovf')).size / 512) * 512 + 2048 // headers, descriptor, .mf
    let seed = 0x12345678
    const rnd = (n: number) => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0
      return seed % n
    }
    const target = path.join(root, 'fuzz-mut.ova')
    let ok = 0
    let failed = 0
    const t0 = Date.now()
    for (let i = 0; i < 150; i++) {
      const b = Buffer.from(orig)
      const k = 1 + rnd(6)
      for (let j = 0; j < k; j++) {
        const at = rnd(4) === 0 ? rnd(b.length) : rnd(hot)
        b[at] = rnd(3) === 0 ? 0 : rnd(256)
      }
      writeFileSync(target, rnd(10) === 0 ? b.subarray(0, rnd(b.length)) : b)
      const started = Date.now()
      try {
        const m = await ova.inspect(target, ctx())
        expect(VmManifest.safeParse(m).success).toBe(true)
        ok++
      } catch (e) {
        if (!(e instanceof MigError)) throw new Error(`mutation ${i}: non-MigError ${String(e)}`)
        expect(['E_MIG_MALFORMED_ARCHIVE', 'E_MIG_UNSUPPORTED_FORMAT', 'E_MIG_HOST_PATH_REJECTED']).toContain(e.code)
        failed++
      }
      expect(Date.now() - started).toBeLessThan(2000)
    }
    expect(ok + failed).toBe(150)
    expect(failed).toBeGreaterThan(0)
    expect(Date.now() - t0).toBeLessThan(15000)
  })
})

describe('OVF folder', () => {
  test('folder or .ovf input; disk sources are the absolute files', async () => {
    const { dir } = pkg('folder')
    for (const input of [dir, path.join(dir, 'vm.ovf')]) {
      const m = await ovfFolder.inspect(input, ctx())
      expect(VmManifest.safeParse(m).success).toBe(true)
      expect(m).toMatchObject({ name: 'two-disks', source_format: 'ovf_folder', firmware: 'efi', secure_boot: true, memory_bytes: 768 * MiB })
      expect(m.disks.map((d) => [d.source, d.disk_format, d.controller, d.address])).toEqual([
        [{ path: path.join(dir, 'd1.vmdk') }, 'vmdk', 'scsi', '0:0'],
        [{ path: path.join(dir, 'd2.vmdk') }, 'vmdk', 'ide', '1:1'],
      ])
      expect(m.warnings).toEqual([])
    }
  })

  test('several .ovf in the folder are listed', async () => {
    const { dir } = pkg('folder2', { mf: null })
    writeFileSync(path.join(dir, 'b.ovf'), '<x/>')
    await expectMigThrown(() => ovfFolder.inspect(dir, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'several .ovf descriptors: b.ovf, vm.ovf')
  })

  test('.mf mismatch and missing file', async () => {
    const { dir } = pkg('folder3', { mf: (d) => `SHA256(vm.ovf)= ${d['vm.ovf']}\nSHA256(d1.vmdk)= ${'1'.repeat(64)}\n` })
    await expectMigThrown(() => ovfFolder.inspect(dir, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'd1.vmdk', 'SHA256', '1'.repeat(64))
    const { dir: d4 } = pkg('folder4', { mf: null })
    run('rm', [path.join(d4, 'd2.vmdk')])
    await expectMigThrown(() => ovfFolder.inspect(d4, ctx()), 'E_MIG_MALFORMED_ARCHIVE', 'd2.vmdk', 'not in the folder')
  })

  test('a disk that is a symlink out of the import root is E_MIG_HOST_PATH_REJECTED', async () => {
    const { dir } = pkg('folder5', { mf: null })
    run('rm', [path.join(dir, 'd2.vmdk')])
    symlinkSync(vmdk2, path.join(dir, 'd2.vmdk')) // vmdk2 lives outside <root>
    await expectMigThrown(() => ovfFolder.inspect(dir, ctx()), 'E_MIG_HOST_PATH_REJECTED', 'd2.vmdk')
  })

  test('href ../../etc/passwd', async () => {
    const { dir } = pkg('folder6', { mf: null, ovfText: (s) => descriptor([s[0]!, { ...s[1]!, href: '../../etc/passwd' }]) })
    await expectMigThrown(() => ovfFolder.inspect(dir, ctx()), 'E_MIG_HOST_PATH_REJECTED', '../../etc/passwd')
  })
})
