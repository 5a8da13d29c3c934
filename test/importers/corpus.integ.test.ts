/**
 * The shared corpus (`../shared/corpus`, listed in its `SOURCES.tsv`), one table row per input:
 * every descriptor and image is inspected through `inspectInput` (the entry point of both HTTP
 * inspect endpoints) and compared with the manifest fields read BY HAND from the file (CPU count,
 * memory, disk count and capacities, firmware, guest family, NIC MACs), or, for the negative
 * files, with the exact `E_MIG_*` code and the words its message must carry.
 *
 * Inputs are assembled in a temporary import root at test time (never in the repo or the corpus):
 * `.gz` images are decompressed; descriptors whose disks are not in the corpus (the virt-v2v and
 * govmomi OVFs, the VMX files, the GOAD .vbox, the Hyper-V .vmcx) get placeholder disks made here
 * with `qemu-img create`, of the capacity (and, for OVF, the `ovf:size` file length) the
 * descriptor declares, so the descriptor's own fields are asserted positively. Each descriptor is
 * also inspected alone, in place, where the importer rightly refuses the missing disk naming it.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { copyFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { gunzipSync } from 'node:zlib'
import type { ErrorCode } from '../../lib/errors.ts'
import { inspectInput } from '../../lib/importers/index.ts'
import type { ImporterKind } from '../../lib/kinds.ts'
import type { VmManifest } from '../../lib/manifest.ts'
import { CORPUS, tempDir } from '../helpers/tmp.ts'

const KiB = 1024
const MiB = 1024 * KiB
const GiB = 1024 * MiB

const tmp = tempDir('mig-corpus-')
afterAll(() => tmp.cleanup())

// ------------------------------------------------------------------------------------------
// Input builders (all under the temporary import root `tmp.dir`)

/** `<tmp>/<parts>`, its folder created. */
function at(...parts: string[]): string {
  const p = path.join(tmp.dir, ...parts)
  mkdirSync(path.dirname(p), { recursive: true })
  return p
}

/** A corpus file's absolute path. */
const corpus = (rel: string) => path.join(CORPUS, rel)

/** Copies a corpus file to `<tmp>/<dest>`; returns the copy. */
function copy(rel: string, ...dest: string[]): string {
  const p = at(...dest)
  copyFileSync(corpus(rel), p)
  return p
}

/** Decompresses a corpus `.gz` to `<tmp>/<dest>`; returns the result. */
function gunzip(rel: string, ...dest: string[]): string {
  const p = at(...dest)
  writeFileSync(p, gunzipSync(readFileSync(corpus(rel))))
  return p
}

/**
 * A placeholder disk made with `qemu-img create -f <fmt> [-o opts] <file> <virtual size>`,
 * optionally padded with a sparse tail to `fileBytes` (an OVF `ovf:size`). The data is empty:
 * only the header (virtual size, format) matters to inspect.
 */
function placeholder(file: string, fmt: string, virtualBytes: number, o: { opts?: string; fileBytes?: number; backing?: string } = {}): string {
  const args = ['create', '-q', '-f', fmt]
  if (o.opts) args.push('-o', o.opts)
  if (o.backing) args.push('-b', o.backing, '-F', fmt)
  execFileSync('qemu-img', [...args, file, String(virtualBytes)], { stdio: ['ignore', 'ignore', 'pipe'] })
  if (o.fileBytes !== undefined) execFileSync('truncate', ['-s', String(o.fileBytes), file])
  return file
}

/**
 * The members of a corpus `.gz` tar re-packed under new names (`tar --transform <sed>`, `-P` to
 * keep absolute names) into `<tmp>/<dir>/x.ova`; returns the archive.
 */
function retar(rel: string, dir: string, sed: string, absolute: boolean): string {
  const x = at(dir, 'x', 'members')
  mkdirSync(x, { recursive: true })
  const plain = gunzip(rel, dir, 'plain.tar')
  execFileSync('tar', ['-xf', plain, '-C', x])
  const names = execFileSync('tar', ['-tf', plain], { encoding: 'utf8' })
    .split('\n')
    .filter((n) => n !== '' && !n.endsWith('/'))
  const out = at(dir, 'x.ova')
  execFileSync('tar', ['--format=ustar', ...(absolute ? ['-P'] : []), `--transform=${sed}`, '-cf', out, '-C', x, ...names], {
    stdio: ['ignore', 'ignore', 'ignore'],
  })
  return out
}

/** An OVF descriptor from the corpus in its own folder, with a placeholder streamOptimized VMDK. */
function ovfWithPlaceholder(rel: string, folder: string, href: string, capacity: number, fileBytes: number): string {
  copy(rel, folder, path.basename(rel))
  placeholder(at(folder, href), 'vmdk', capacity, { opts: 'subformat=streamOptimized', fileBytes })
  return at(folder)
}

// ------------------------------------------------------------------------------------------
// The table

/** One expected disk: the fields read by hand; `backing` lists the parents' file names, nearest first. */
interface ExpDisk {
  label: string
  capacity_bytes: number
  disk_format: VmManifest['disks'][number]['disk_format']
  controller: VmManifest['disks'][number]['controller']
  address: string
  allocated_bytes?: number
  member?: string
  backing?: string[]
}

/** Expected manifest fields. `warnings`: substrings that some warning must contain. */
interface ExpManifest {
  name: string
  guest: [VmManifest['guest_os']['family'], string | null]
  firmware: 'bios' | 'efi'
  secure_boot: boolean
  cpu: [number, number]
  memory_bytes: number
  disks: ExpDisk[]
  nics: Array<{ mac: string | null; model: string; network: string | null }>
  warnings?: string[]
}

/**
 * One row: `source` is the SOURCES.tsv `local_path` the row exercises; `input` builds the input
 * and returns the path to inspect with the import root; `kind` the importer kind. Either
 * `manifest` (positive; the input is also probed without a kind and must be detected as `kind`)
 * or `error` (the exact code and message words; `detectError` when probing alone already fails
 * differently).
 */
interface Row {
  source: string
  what: string
  kind: ImporterKind
  input: () => { path: string; root: string }
  manifest?: ExpManifest
  error?: { code: ErrorCode; mentions: string[] }
  detectError?: { code: ErrorCode; mentions: string[] }
}

const inTmp = (p: string) => ({ path: p, root: tmp.dir })
const inPlace = (rel: string) => ({ path: corpus(rel), root: CORPUS })
/** The manifest of a lone disk image: CPU, memory, firmware and guest are the documented defaults. */
const lone = (name: string, disk: ExpDisk): ExpManifest => ({
  name,
  guest: ['unknown', null],
  firmware: 'bios',
  secure_boot: false,
  cpu: [1, 1],
  memory_bytes: 2 * GiB,
  disks: [disk],
  nics: [],
})

const GOAD_BASE = 'WindowsServer2019-disk001.vmdk'
const GOAD_SNAP1 = '{3c72ec80-dc73-4448-a63e-97970cdd87e5}.vmdk'
const GOAD_SNAP2 = '{e6800503-8273-4f16-b584-c7ba2c1df698}.vmdk'
const GOAD_BRANCH1 = '{35bf5129-1caa-4117-b20a-d73868d9d5d2}.vmdk'
const GOAD_BRANCH2 = '{706a96fe-0e11-4985-af32-7561d26612d4}.vmdk'

const ROWS: Row[] = [
  // virt-v2v test-i-ova.ovf: OVF 1.0 from vSphere, Windows 7 x64, capacity "32" x "byte * 2^30",
  // lsilogicsas SCSI + 2 IDE controllers, CD-ROM and floppy (not disks), one E1000 NIC with no
  // rasd:Address (MAC generated at deploy), firmware=bios. Placeholder file padded to ovf:size.
  {
    source: 'virt-v2v/test-i-ova.ovf',
    what: 'OVF 1.0 vSphere export, Windows 7, byte * 2^30 capacity, SCSI disk beside IDE CD-ROM/floppy',
    kind: 'ovf_folder',
    input: () => inTmp(ovfWithPlaceholder('virt-v2v/test-i-ova.ovf', 'v2v-ova', 'test-ova.vmdk', 32 * GiB, 349405696)),
    manifest: {
      name: 'TestOva',
      guest: ['windows', 'windows7_64Guest'],
      firmware: 'bios',
      secure_boot: false,
      cpu: [1, 1],
      memory_bytes: 2048 * MiB,
      disks: [{ label: 'Hard Disk 1', capacity_bytes: 32 * GiB, allocated_bytes: 1008926720, disk_format: 'vmdk', controller: 'scsi', address: '0:0' }],
      nics: [{ mac: null, model: 'e1000', network: 'VM Network' }],
      warnings: ['no test-i-ova.mf manifest'],
    },
  },
  // Mutation: the image header says 1 GiB, less than the declared 32 GiB: refused, naming both
  // figures (a volume is never grown past the image).
  {
    source: 'virt-v2v/test-i-ova.ovf',
    what: 'mutation: image smaller than the declared ovf:capacity (refused, both figures named)',
    kind: 'ovf_folder',
    input: () => inTmp(ovfWithPlaceholder('virt-v2v/test-i-ova.ovf', 'v2v-ova-small', 'test-ova.vmdk', 1 * GiB, 349405696)),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: [`${32 * GiB} bytes`, `${GiB}-byte image`] },
  },
  // The same descriptor alone in the corpus: its References/File test-ova.vmdk is absent.
  {
    source: 'virt-v2v/test-i-ova.ovf',
    what: 'descriptor without its disk file',
    kind: 'ovf_folder',
    input: () => inPlace('virt-v2v/test-i-ova.ovf'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['test-ova.vmdk', 'not in the folder'] },
  },
  // virt-v2v test-i-ova-formats.ovf: vmx-10, Windows Server 2008 R2, 50 GiB, firmware=efi, 1 GiB.
  {
    source: 'virt-v2v/test-i-ova-formats.ovf',
    what: 'OVF with vmw:Config firmware=efi, 50 GiB disk, network PG-VLAN60',
    kind: 'ovf_folder',
    input: () => inTmp(ovfWithPlaceholder('virt-v2v/test-i-ova-formats.ovf', 'v2v-fmt', 'disk1.vmdk', 50 * GiB, 7804077568)),
    manifest: {
      name: '2K8R2EESP1_2_Medium',
      guest: ['windows', 'windows7Server64Guest'],
      firmware: 'efi',
      secure_boot: false,
      cpu: [1, 1],
      memory_bytes: 1024 * MiB,
      disks: [{ label: 'Hard disk 1', capacity_bytes: 50 * GiB, allocated_bytes: 18975752192, disk_format: 'vmdk', controller: 'scsi', address: '0:0' }],
      nics: [{ mac: null, model: 'e1000', network: 'PG-VLAN60' }],
    },
  },
  // Mutation: the same descriptor with an image whose header says 64 GiB, more than the declared
  // 50 GiB: the data does not fit the declared capacity.
  {
    source: 'virt-v2v/test-i-ova-formats.ovf',
    what: 'mutation: image larger than the declared ovf:capacity',
    kind: 'ovf_folder',
    input: () => inTmp(ovfWithPlaceholder('virt-v2v/test-i-ova-formats.ovf', 'v2v-fmt-big', 'disk1.vmdk', 64 * GiB, 7804077568)),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['disk1.vmdk', String(50 * GiB), String(64 * GiB), 'does not fit'] },
  },
  {
    source: 'virt-v2v/test-i-ova-formats.ovf',
    what: 'descriptor without its disk file',
    kind: 'ovf_folder',
    input: () => inPlace('virt-v2v/test-i-ova-formats.ovf'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['disk1.vmdk'] },
  },
  // virt-v2v test-i-vmx-3.vmx: ESXi RHEL 7.1, memSize 2048, no numvcpus (1), firmware "efi",
  // pvscsi scsi0:0 disk RHEL-7.1-UEFI.vmdk, ide1:0 is a cdrom-image (not a disk), one vmxnet3
  // NIC with generatedAddress 00:0c:29:4b:2b:8c on "VM Network". Placeholder: a 16 GiB sparse VMDK.
  {
    source: 'virt-v2v/test-i-vmx-3.vmx',
    what: 'VMX with firmware=efi, pvscsi disk, vmxnet3 generated MAC, CD-ROM ignored',
    kind: 'vmx_folder',
    input: () => {
      copy('virt-v2v/test-i-vmx-3.vmx', 'vmx3', 'test-i-vmx-3.vmx')
      placeholder(at('vmx3', 'RHEL-7.1-UEFI.vmdk'), 'vmdk', 16 * GiB)
      return inTmp(at('vmx3'))
    },
    manifest: {
      name: 'RHEL 7.1 UEFI',
      guest: ['linux', 'rhel6-64'],
      firmware: 'efi',
      secure_boot: false,
      cpu: [1, 1],
      memory_bytes: 2048 * MiB,
      disks: [{ label: 'RHEL-7.1-UEFI', capacity_bytes: 16 * GiB, disk_format: 'vmdk', controller: 'scsi', address: 'scsi0:0' }],
      nics: [{ mac: '00:0c:29:4b:2b:8c', model: 'vmxnet3', network: 'VM Network' }],
      warnings: ['pvscsi'],
    },
  },
  {
    source: 'virt-v2v/test-i-vmx-3.vmx',
    what: 'VMX without its VMDK',
    kind: 'vmx_folder',
    input: () => inPlace('virt-v2v/test-i-vmx-3.vmx'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['scsi0:0.fileName', 'RHEL-7.1-UEFI.vmdk', 'does not exist'] },
  },
  // virt-v2v test-i-vmx-5.vmx: Workstation appliance, lower-case "memsize" 2048, guestOS
  // windows9-64, cpuid.coresPerSocket 1, no firmware key (BIOS), lsisas1068 scsi0:0 disk, e1000e
  // NIC 00:0c:29:bf:e4:5d (bridged, no networkName). Placeholder: a 40 GiB sparse VMDK.
  {
    source: 'virt-v2v/test-i-vmx-5.vmx',
    what: 'VMX with lower-case memsize, Windows 10, e1000e, no firmware key',
    kind: 'vmx_folder',
    input: () => {
      copy('virt-v2v/test-i-vmx-5.vmx', 'vmx5', 'test-i-vmx-5.vmx')
      placeholder(at('vmx5', 'MSEdge-Win10_preview.vmdk'), 'vmdk', 40 * GiB)
      return inTmp(at('vmx5'))
    },
    manifest: {
      name: 'MSEdge - Win10_preview',
      guest: ['windows', 'windows9-64'],
      firmware: 'bios',
      secure_boot: false,
      cpu: [1, 1],
      memory_bytes: 2048 * MiB,
      disks: [{ label: 'MSEdge-Win10_preview', capacity_bytes: 40 * GiB, disk_format: 'vmdk', controller: 'scsi', address: 'scsi0:0' }],
      nics: [{ mac: '00:0c:29:bf:e4:5d', model: 'e1000e', network: null }],
    },
  },
  {
    source: 'virt-v2v/test-i-vmx-5.vmx',
    what: 'VMX without its VMDK',
    kind: 'vmx_folder',
    input: () => inPlace('virt-v2v/test-i-vmx-5.vmx'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['MSEdge-Win10_preview.vmdk', 'does not exist'] },
  },
  // govmomi ttylinux OVA: real tar (ovf, mf, vmdk), but the VMDK member holds 1048576 bytes
  // while ovf:size says 10595840: a truncated member.
  {
    source: 'govmomi/ttylinux-pc_i486-16.1.ova',
    what: 'NEGATIVE: OVA whose disk member is truncated',
    kind: 'ova_archive',
    input: () => inPlace('govmomi/ttylinux-pc_i486-16.1.ova'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['truncated member ttylinux-pc_i486-16.1-disk1.vmdk', '10595840', '1048576'] },
  },
  // The same archive extracted to a folder (ovf + mf + the truncated vmdk): the folder importer
  // refuses the short file the same way.
  {
    source: 'govmomi/ttylinux-pc_i486-16.1.ova',
    what: 'NEGATIVE: the OVA extracted, truncated disk file in an OVF folder',
    kind: 'ovf_folder',
    input: () => {
      mkdirSync(at('tty-x', 'x'), { recursive: true })
      execFileSync('tar', ['-xf', corpus('govmomi/ttylinux-pc_i486-16.1.ova'), '-C', at('tty-x')])
      return inTmp(at('tty-x'))
    },
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['truncated file ttylinux-pc_i486-16.1-disk1.vmdk', '10595840', '1048576'] },
  },
  // Its descriptor (read from the archive) with a placeholder disk: 1 vCPU, 32 MB, IDE disk of
  // 30 x "byte * 2^20", firmware=efi, otherLinuxGuest, E1000 NIC on "nat" without MAC.
  {
    source: 'govmomi/ttylinux-pc_i486-16.1.ova',
    what: 'the OVA descriptor with a whole placeholder disk: efi, 30 MiB IDE disk',
    kind: 'ovf_folder',
    input: () => {
      mkdirSync(at('tty', 'x'), { recursive: true })
      execFileSync('tar', ['-xf', corpus('govmomi/ttylinux-pc_i486-16.1.ova'), '-C', at('tty'), 'ttylinux-pc_i486-16.1.ovf'])
      placeholder(at('tty', 'ttylinux-pc_i486-16.1-disk1.vmdk'), 'vmdk', 30 * MiB, { opts: 'subformat=streamOptimized', fileBytes: 10595840 })
      return inTmp(at('tty'))
    },
    manifest: {
      name: 'ttylinux-pc_i486-16.1',
      guest: ['linux', 'otherLinuxGuest'],
      firmware: 'efi',
      secure_boot: false,
      cpu: [1, 1],
      memory_bytes: 32 * MiB,
      disks: [{ label: 'disk0', capacity_bytes: 30 * MiB, allocated_bytes: 18743296, disk_format: 'vmdk', controller: 'ide', address: '0:0' }],
      nics: [{ mac: null, model: 'e1000', network: 'nat' }],
    },
  },
  // govmomi configspec.ovf: vmx-13, 2 vCPU with vmw:CoresPerSocket 2, 4096 MB, one 20 GiB disk
  // with data on lsilogic; Hard Disks 2-5 (pvscsi, 2 SATA, NVMe) have no HostResource (empty disks
  // to create: not imported, warned); NICs Management and Workload, Frontend only in the
  // non-default "frontend" DeploymentOption; firmware=bios.
  {
    source: 'govmomi/configspec.ovf',
    what: 'OVF with DeploymentOptions, NVMe/SATA/pvscsi controllers, empty disks, CoresPerSocket',
    kind: 'ovf_folder',
    input: () => inTmp(ovfWithPlaceholder('govmomi/configspec.ovf', 'configspec', 'haproxy.ova.vmdk', 20 * GiB, 625911296)),
    manifest: {
      name: 'haproxy',
      guest: ['linux', 'other3xLinux64Guest'],
      firmware: 'bios',
      secure_boot: false,
      cpu: [2, 2],
      memory_bytes: 4096 * MiB,
      disks: [{ label: 'Hard Disk 1', capacity_bytes: 20 * GiB, allocated_bytes: 1287454720, disk_format: 'vmdk', controller: 'scsi', address: '0:0' }],
      nics: [
        { mac: null, model: 'vmxnet3', network: 'Management' },
        { mac: null, model: 'vmxnet3', network: 'Workload' },
      ],
      warnings: ['Hard Disk 2: no HostResource', 'Hard Disk 3: no HostResource', 'Hard Disk 4: no HostResource', 'Hard Disk 5: no HostResource'],
    },
  },
  {
    source: 'govmomi/configspec.ovf',
    what: 'descriptor without its disk file',
    kind: 'ovf_folder',
    input: () => inPlace('govmomi/configspec.ovf'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['haproxy.ova.vmdk'] },
  },
  // glance testserver-bad-ovf.ova: a tar whose illegal-xml.ovf is not well-formed XML.
  {
    source: 'glance/testserver-bad-ovf.ova',
    what: 'NEGATIVE: OVA with a malformed descriptor',
    kind: 'ova_archive',
    input: () => inPlace('glance/testserver-bad-ovf.ova'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['illegal-xml.ovf', 'not well-formed XML'] },
  },
  // glance testserver-not-tar.ova: a PNG named .ova. As an OVA it is not a tar; probed, a PNG.
  {
    source: 'glance/testserver-not-tar.ova',
    what: 'NEGATIVE: a PNG named .ova',
    kind: 'ova_archive',
    input: () => inPlace('glance/testserver-not-tar.ova'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['testserver-not-tar.ova', 'not a tar archive'] },
    detectError: { code: 'E_MIG_UNSUPPORTED_FORMAT', mentions: ['PNG image'] },
  },
  // vagrant-mutate box: a gzip-compressed tar; refused as is.
  {
    source: 'vagrant-mutate/virtualbox-mutate-test.box',
    what: 'NEGATIVE as is: gzip-compressed OVA',
    kind: 'ova_archive',
    input: () => inPlace('vagrant-mutate/virtualbox-mutate-test.box'),
    error: { code: 'E_MIG_UNSUPPORTED_FORMAT', mentions: ['gzip-compressed archive', 'decompress it first'] },
    detectError: { code: 'E_MIG_UNSUPPORTED_FORMAT', mentions: ['gzip-compressed archive'] },
  },
  // ... decompressed: a VirtualBox export tar (./box.ovf, ./box-disk1.vmdk, ./Vagrantfile; no
  // .mf). OVF: 1 vCPU, 256 "MegaBytes", Linux26, SATA (AHCI) disk of 4194304 bytes, E1000 NIC
  // whose MAC only the embedded vbox:Machine has (enabled adapter 0: 08002755B88D).
  {
    source: 'vagrant-mutate/virtualbox-mutate-test.box',
    what: 'decompressed box: VirtualBox OVA with ./ member names, vbox:Machine MAC',
    kind: 'ova_archive',
    input: () => inTmp(gunzip('vagrant-mutate/virtualbox-mutate-test.box', 'box', 'mutate-test.ova')),
    manifest: {
      name: 'mutate-test',
      guest: ['linux', 'Linux26'],
      firmware: 'bios',
      secure_boot: false,
      cpu: [1, 1],
      memory_bytes: 256 * MiB,
      disks: [{ label: 'disk1', capacity_bytes: 4 * MiB, disk_format: 'vmdk', controller: 'sata', address: '0:0', member: './box-disk1.vmdk' }],
      nics: [{ mac: '08:00:27:55:b8:8d', model: 'e1000', network: 'NAT' }],
      warnings: ['no .mf manifest'],
    },
  },
  // Mutations of the decompressed box: its members renamed "../box.ovf" ... or "/tmp/box.ovf"
  // ... (tar slip names): the whole archive is refused, naming the member.
  {
    source: 'vagrant-mutate/virtualbox-mutate-test.box',
    what: 'mutation: members named ../ (tar slip)',
    kind: 'ova_archive',
    input: () => inTmp(retar('vagrant-mutate/virtualbox-mutate-test.box', 'box-dotdot', 's,^\\./,../,', false)),
    error: { code: 'E_MIG_HOST_PATH_REJECTED', mentions: ['"../box.ovf"', '".." path segment'] },
  },
  {
    source: 'vagrant-mutate/virtualbox-mutate-test.box',
    what: 'mutation: members named with an absolute path',
    kind: 'ova_archive',
    input: () => inTmp(retar('vagrant-mutate/virtualbox-mutate-test.box', 'box-abs', 's,^\\./,/tmp/,', true)),
    error: { code: 'E_MIG_HOST_PATH_REJECTED', mentions: ['"/tmp/box.ovf"', 'absolute path'] },
  },
  // vagrant-mutate box.ovf + box-disk1.vmdk (the box's members, derived in the corpus) as an
  // OVF folder: same VM, the real streamOptimized disk read from its KDMV header.
  {
    source: 'vagrant-mutate/virtualbox-box.ovf',
    what: 'VirtualBox OVF 1.0 folder with its real streamOptimized disk',
    kind: 'ovf_folder',
    input: () => {
      copy('vagrant-mutate/virtualbox-box.ovf', 'vbox-ovf', 'box.ovf')
      copy('vagrant-mutate/virtualbox-box-disk1.vmdk', 'vbox-ovf', 'box-disk1.vmdk')
      return inTmp(at('vbox-ovf'))
    },
    manifest: {
      name: 'mutate-test',
      guest: ['linux', 'Linux26'],
      firmware: 'bios',
      secure_boot: false,
      cpu: [1, 1],
      memory_bytes: 256 * MiB,
      disks: [{ label: 'disk1', capacity_bytes: 4 * MiB, disk_format: 'vmdk', controller: 'sata', address: '0:0' }],
      nics: [{ mac: '08:00:27:55:b8:8d', model: 'e1000', network: 'NAT' }],
    },
  },
  {
    source: 'vagrant-mutate/virtualbox-box.ovf',
    what: 'descriptor without its disk (the corpus names it virtualbox-box-disk1.vmdk)',
    kind: 'ovf_folder',
    input: () => inPlace('vagrant-mutate/virtualbox-box.ovf'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['box-disk1.vmdk', 'not in the folder'] },
  },
  // vagrant-mutate box-disk1.vmdk alone: KDMV v3, capacity 0x2000 sectors = 4 MiB, adapterType ide.
  {
    source: 'vagrant-mutate/virtualbox-box-disk1.vmdk',
    what: 'lone streamOptimized VMDK, ddb.adapterType ide',
    kind: 'vmdk',
    input: () => inPlace('vagrant-mutate/virtualbox-box-disk1.vmdk'),
    manifest: lone('virtualbox-box-disk1', {
      label: 'virtualbox-box-disk1',
      capacity_bytes: 4 * MiB,
      disk_format: 'vmdk',
      controller: 'ide',
      address: 'ide0:0',
    }),
  },
  // vagrant-mutate kvm-box-disk1.qcow2: qcow2 v3, size field 0x400000 = 4 MiB, no backing file.
  {
    source: 'vagrant-mutate/kvm-box-disk1.qcow2',
    what: 'qcow2 v3 without backing file',
    kind: 'qcow2',
    input: () => inPlace('vagrant-mutate/kvm-box-disk1.qcow2'),
    manifest: lone('kvm-box-disk1', { label: 'kvm-box-disk1', capacity_bytes: 4 * MiB, disk_format: 'qcow2', controller: 'virtio', address: '0' }),
  },
  // containerized-data-importer invalid-qcow-large-size.img: legacy qcow v1 header (QFI, version
  // 1) declaring ~152 TiB: refused without allocating an L1 table.
  {
    source: 'containerized-data-importer/invalid-qcow-large-size.img',
    what: 'NEGATIVE: malicious legacy qcow v1 header',
    kind: 'qcow2',
    input: () => inPlace('containerized-data-importer/invalid-qcow-large-size.img'),
    error: { code: 'E_MIG_UNSUPPORTED_FORMAT', mentions: ['legacy qcow', 'version 1'] },
    detectError: { code: 'E_MIG_UNSUPPORTED_FORMAT', mentions: ['qcow v1'] },
  },
  // dissect.hypervisor test.vmcx in a Hyper-V export layout: Gen 1 (Microsoft Virtual BIOS), the
  // VM "Other Location" whose IDE 0:0 disk is C:\...\Virtual Hard Disks\Other Location.vhdx (a
  // UTF-16 string in the file), one synthetic NIC with a dynamic MAC (none stored), 1 vCPU and
  // 1024 MB (as dissect.hypervisor reads them); no guest OS recorded. Placeholder: 8 GiB VHDX.
  {
    source: 'dissect.hypervisor/test.vmcx',
    what: 'Hyper-V export: VMCX disk path mapped onto Virtual Hard Disks, Gen 1 BIOS',
    kind: 'vmcx_export',
    input: () => {
      copy('dissect.hypervisor/test.vmcx', 'hyperv', 'Virtual Machines', '282874FC-59D6-4F30-BC04-5FDD909C82E0.vmcx')
      placeholder(at('hyperv', 'Virtual Hard Disks', 'Other Location.vhdx'), 'vhdx', 8 * GiB)
      return inTmp(at('hyperv'))
    },
    manifest: {
      name: 'Other Location',
      guest: ['unknown', null],
      firmware: 'bios',
      secure_boot: false,
      cpu: [1, 1],
      memory_bytes: 1024 * MiB,
      disks: [{ label: 'Other_Location', capacity_bytes: 8 * GiB, disk_format: 'vhdx', controller: 'ide', address: '0:0' }],
      nics: [{ mac: null, model: 'virtio', network: null }],
      warnings: ['virt-v2v', 'does not record the guest OS'],
    },
  },
  {
    source: 'dissect.hypervisor/test.vmcx',
    what: 'the .vmcx alone: no Virtual Hard Disks',
    kind: 'vmcx_export',
    input: () => inPlace('dissect.hypervisor/test.vmcx'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['Virtual Hard Disks', 'Other Location.vhdx'] },
  },
  // dissect.hypervisor GOAD-DC01.vbox: settings 1.19, Windows2016_64, RAMSize 3000, CPU count 2,
  // <Firmware/> without type (BIOS); the current state attaches {e6800503} on "IDE Controller"
  // port 0 device 0, a differencing child of {3c72ec80}, child of the base
  // WindowsServer2019-disk001.vmdk (a second, hand-added branch {35bf5129}/{706a96fe} is not
  // attached); two enabled NICs 0800277AA2FC (NAT) and 0800278CC821 (host-only vboxnet0).
  // Placeholders: a real differencing chain made with `qemu-img create -b`.
  {
    source: 'dissect.hypervisor/GOAD-DC01.vbox',
    what: 'VirtualBox 7 .vbox with a snapshot tree: the attached differencing child and its chain',
    kind: 'vbox_folder',
    input: () => {
      copy('dissect.hypervisor/GOAD-DC01.vbox', 'goad', 'GOAD-DC01.vbox')
      placeholder(at('goad', GOAD_BASE), 'vmdk', 50 * GiB)
      placeholder(at('goad', 'Snapshots', GOAD_SNAP1), 'vmdk', 50 * GiB, { backing: `../${GOAD_BASE}` })
      placeholder(at('goad', 'Snapshots', GOAD_SNAP2), 'vmdk', 50 * GiB, { backing: GOAD_SNAP1 })
      placeholder(at('goad', 'Snapshots', GOAD_BRANCH1), 'vmdk', 50 * GiB, { backing: `../${GOAD_BASE}` })
      placeholder(at('goad', 'Snapshots', GOAD_BRANCH2), 'vmdk', 50 * GiB, { backing: GOAD_BRANCH1 })
      return inTmp(at('goad'))
    },
    manifest: {
      name: 'GOAD-DC01',
      guest: ['windows', 'Windows2016_64'],
      firmware: 'bios',
      secure_boot: false,
      cpu: [2, 1],
      memory_bytes: 3000 * MiB,
      disks: [
        {
          label: 'WindowsServer2019-disk001',
          capacity_bytes: 50 * GiB,
          disk_format: 'vmdk',
          controller: 'ide',
          address: '0:0:0',
          backing: [GOAD_SNAP1, GOAD_BASE],
        },
      ],
      nics: [
        { mac: '08:00:27:7a:a2:fc', model: 'e1000', network: 'NAT' },
        { mac: '08:00:27:8c:c8:21', model: 'e1000', network: 'vboxnet0' },
      ],
      warnings: ['differencing image over 2 parent(s)'],
    },
  },
  {
    source: 'dissect.hypervisor/GOAD-DC01.vbox',
    what: 'the .vbox alone: the attached image is missing',
    kind: 'vbox_folder',
    input: () => inPlace('dissect.hypervisor/GOAD-DC01.vbox'),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: [`Snapshots/${GOAD_SNAP2}`, 'does not exist'] },
  },
  // dissect.hypervisor fixed.vhdx.gz: VHDX fixed, 10 MiB virtual (Windows 10 Hyper-V).
  {
    source: 'dissect.hypervisor/fixed.vhdx.gz',
    what: 'fixed VHDX written by Hyper-V',
    kind: 'vhdx',
    input: () => inTmp(gunzip('dissect.hypervisor/fixed.vhdx.gz', 'vhdx', 'fixed.vhdx')),
    manifest: lone('fixed', { label: 'fixed', capacity_bytes: 10 * MiB, disk_format: 'vhdx', controller: 'virtio', address: '0' }),
  },
  // dissect.hypervisor fixed.vhd.gz: VHD fixed; footer "conectix", current size (offset 48)
  // 0x00a00000 = 10 MiB; read by the vhdx importer as qemu's vpc.
  {
    source: 'dissect.hypervisor/fixed.vhd.gz',
    what: 'fixed VHD (footer only)',
    kind: 'vhdx',
    input: () => inTmp(gunzip('dissect.hypervisor/fixed.vhd.gz', 'vhd', 'fixed.vhd')),
    manifest: lone('fixed', { label: 'fixed', capacity_bytes: 10 * MiB, disk_format: 'vpc', controller: 'virtio', address: '0' }),
  },
  // dissect.hypervisor backing-chain-{1,2,3}.qcow2.gz: qcow2 v3, size 0x20000000 = 512 MiB each;
  // 1 -> backing-chain-2.qcow2 -> backing-chain-3.qcow2 (backing names at header offset 0x210).
  {
    source: 'dissect.hypervisor/backing-chain-1.qcow2.gz',
    what: 'qcow2 top of a 3-level backing chain',
    kind: 'qcow2',
    input: () => {
      for (const i of [1, 2, 3]) gunzip(`dissect.hypervisor/backing-chain-${i}.qcow2.gz`, 'chain', `backing-chain-${i}.qcow2`)
      return inTmp(at('chain', 'backing-chain-1.qcow2'))
    },
    manifest: lone('backing-chain-1', {
      label: 'backing-chain-1',
      capacity_bytes: 512 * MiB,
      disk_format: 'qcow2',
      controller: 'virtio',
      address: '0',
      backing: ['backing-chain-2.qcow2', 'backing-chain-3.qcow2'],
    }),
  },
  {
    source: 'dissect.hypervisor/backing-chain-1.qcow2.gz',
    what: 'NEGATIVE: chain top without its parents',
    kind: 'qcow2',
    input: () => inTmp(gunzip('dissect.hypervisor/backing-chain-1.qcow2.gz', 'chain-alone', 'backing-chain-1.qcow2')),
    error: { code: 'E_MIG_MALFORMED_ARCHIVE', mentions: ['backing-chain-2.qcow2'] },
  },
  {
    source: 'dissect.hypervisor/backing-chain-2.qcow2.gz',
    what: 'qcow2 middle of the chain',
    kind: 'qcow2',
    input: () => {
      for (const i of [2, 3]) gunzip(`dissect.hypervisor/backing-chain-${i}.qcow2.gz`, 'chain2', `backing-chain-${i}.qcow2`)
      return inTmp(at('chain2', 'backing-chain-2.qcow2'))
    },
    manifest: lone('backing-chain-2', {
      label: 'backing-chain-2',
      capacity_bytes: 512 * MiB,
      disk_format: 'qcow2',
      controller: 'virtio',
      address: '0',
      backing: ['backing-chain-3.qcow2'],
    }),
  },
  {
    source: 'dissect.hypervisor/backing-chain-3.qcow2.gz',
    what: 'qcow2 base of the chain',
    kind: 'qcow2',
    input: () => inTmp(gunzip('dissect.hypervisor/backing-chain-3.qcow2.gz', 'chain3', 'backing-chain-3.qcow2')),
    manifest: lone('backing-chain-3', { label: 'backing-chain-3', capacity_bytes: 512 * MiB, disk_format: 'qcow2', controller: 'virtio', address: '0' }),
  },
]

/** The manifest projected onto the fields a row states. */
function project(m: VmManifest, exp: ExpManifest): ExpManifest {
  return {
    name: m.name,
    guest: [m.guest_os.family, m.guest_os.id],
    firmware: m.firmware,
    secure_boot: m.secure_boot,
    cpu: [m.cpu.count, m.cpu.cores_per_socket],
    memory_bytes: m.memory_bytes,
    disks: m.disks.map((d, i) => {
      const e = exp.disks[i]
      const out: ExpDisk = { label: d.label, capacity_bytes: d.capacity_bytes, disk_format: d.disk_format, controller: d.controller, address: d.address }
      if (e?.allocated_bytes !== undefined) out.allocated_bytes = d.allocated_bytes
      if (e?.member !== undefined) out.member = d.source.member
      if (d.backing_chain) out.backing = d.backing_chain.map((p) => path.basename(p))
      return out
    }),
    nics: m.nics.map((n) => ({ mac: n.mac, model: n.model, network: n.network })),
    ...(exp.warnings ? { warnings: exp.warnings.filter((w) => m.warnings.some((x) => x.includes(w))) } : {}),
  }
}

/** Runs `fn`, returns the error it throws (an error itself when nothing is thrown). */
async function failure(fn: () => Promise<unknown>): Promise<any> {
  try {
    await fn()
  } catch (e) {
    return e
  }
  throw new Error('expected an E_MIG_* error, the inspect succeeded')
}

describe('corpus table: every SOURCES.tsv file inspected, expectations read by hand', () => {
  test('every row of SOURCES.tsv is covered by the table (all of them are VM files)', () => {
    const lines = readFileSync(corpus('SOURCES.tsv'), 'utf8')
      .split('\n')
      .filter((l) => l.trim() !== '')
    expect(lines[0]!.split('\t')[0]).toBe('local_path')
    const listed = lines.slice(1).map((l) => l.split('\t')[0]!)
    expect(listed.length).toBe(20)
    for (const f of listed) expect(existsSync(corpus(f))).toBe(true)
    const covered = new Set(ROWS.map((r) => r.source))
    expect(listed.filter((f) => !covered.has(f))).toEqual([])
    expect([...covered].filter((f) => !listed.includes(f))).toEqual([])
  })

  for (const row of ROWS) {
    test(`${row.source} [${row.kind}]: ${row.what}`, async () => {
      const { path: input, root } = row.input()
      const ctx = { importRoot: root }
      if (row.manifest) {
        // Probed without a kind, the input is detected as the row's kind ...
        const got = await inspectInput(input, ctx)
        expect(got.detected_kind).toBe(row.kind)
        expect(got.manifest.source_format).toBe(row.kind)
        expect(got.manifest.cbt_available).toBe(false)
        expect(project(got.manifest, row.manifest)).toEqual(row.manifest)
        for (const d of got.manifest.disks) {
          expect(path.isAbsolute(d.source.path)).toBe(true)
          expect(existsSync(d.source.path)).toBe(true)
          expect(path.relative(root, d.source.path).startsWith('..')).toBe(false)
        }
        // ... and inspecting it with the kind named gives the same manifest.
        expect((await inspectInput(input, ctx, row.kind)).manifest).toEqual(got.manifest)
      } else {
        const e = await failure(() => inspectInput(input, ctx, row.kind))
        expect(e.code).toBe(row.error!.code)
        for (const w of row.error!.mentions) expect(e.message).toContain(w)
        const d = await failure(() => inspectInput(input, ctx))
        const want = row.detectError ?? row.error!
        expect(d.code).toBe(want.code)
        for (const w of want.mentions) expect(d.message).toContain(w)
      }
    })
  }
})
