/**
 * Builders of one valid input of each importer kind, made with real tools (`qemu-img`, `tar`)
 * from raw images the test controls, so destination bytes can be compared with
 * `qemu-img convert -O raw` of the source. Descriptors are written per their formats (OVF
 * DSP0243 1.0, VMX, VirtualBox settings 1.16, XenServer `ova.xml`).
 */
import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { closeSync, copyFileSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync, writeSync, statSync } from 'node:fs'
import * as path from 'node:path'

const MiB = 1024 * 1024

/** Runs a tool, throwing with its stderr on failure. */
export function run(cmd: string, args: string[], cwd?: string): string {
  return execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
}

/**
 * Writes a sparse raw image of `sizeBytes` with random data at a few scattered offsets (and a
 * recognizable header in the first sector). Returns its path.
 */
export function makeRawImage(file: string, sizeBytes: number, seed = 1): string {
  const fd = openSync(file, 'w')
  try {
    writeSync(fd, Buffer.from(`MIGRATOR TEST DISK seed=${seed}\n`), 0, undefined, 0)
    const spots = [1 * MiB + 512, Math.floor(sizeBytes / 3), Math.floor(sizeBytes / 2) + 4096, sizeBytes - 2 * MiB]
    for (const [i, at] of spots.entries()) {
      if (at <= 0 || at + MiB > sizeBytes) continue
      const len = i === 2 ? MiB + 777 : 256 * 1024
      writeSync(fd, randomBytes(Math.min(len, sizeBytes - at)), 0, undefined, at)
    }
  } finally {
    closeSync(fd)
  }
  execFileSync('truncate', ['-s', String(sizeBytes), file])
  return file
}

/** SHA-256 of the raw content of any qemu-readable image (via `qemu-img convert -O raw`). */
export function rawSha256(image: string, format: string, scratchDir: string): string {
  const out = path.join(scratchDir, `raw-${randomBytes(4).toString('hex')}.img`)
  run('qemu-img', ['convert', '-f', format, '-O', 'raw', image, out])
  const h = createHash('sha256').update(readFileSync(out)).digest('hex')
  execFileSync('rm', ['-f', out])
  return h
}

/** SHA-256 of a file's bytes. */
export function fileSha256(file: string): string {
  return createHash('sha256').update(readFileSync(file)).digest('hex')
}

function sha1(file: string): string {
  return createHash('sha1').update(readFileSync(file)).digest('hex')
}

/** Converts a raw image to `format` (qemu driver name) with optional `-o` options. */
export function convert(raw: string, format: string, out: string, options?: string): string {
  run('qemu-img', ['convert', '-f', 'raw', '-O', format, ...(options ? ['-o', options] : []), raw, out])
  return out
}

/** One disk of a built input: its raw source and capacity. */
export interface BuiltDisk {
  raw: string
  capacity: number
}

/** A built input: path (file or folder) inside the import root, kind, and its disks in order. */
export interface BuiltInput {
  kind: string
  path: string
  disks: BuiltDisk[]
  name: string
}

function ovfEnvelope(name: string, disks: Array<{ file: string; size: number; capacity: number; attrs?: string }>, osType = 'otherLinux64Guest'): string {
  const files = disks.map((d, i) => `    <File ovf:href="${d.file}" ovf:id="file${i + 1}" ovf:size="${d.size}"${d.attrs ? ` ${d.attrs}` : ''}/>`).join('\n')
  const diskDefs = disks
    .map((d, i) => `    <Disk ovf:capacity="${d.capacity / MiB}" ovf:capacityAllocationUnits="byte * 2^20" ovf:diskId="vmdisk${i + 1}" ovf:fileRef="file${i + 1}" ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>`)
    .join('\n')
  const diskItems = disks
    .map(
      (_d, i) => `      <Item>
        <rasd:AddressOnParent>${i}</rasd:AddressOnParent>
        <rasd:ElementName>Hard disk ${i + 1}</rasd:ElementName>
        <rasd:HostResource>ovf:/disk/vmdisk${i + 1}</rasd:HostResource>
        <rasd:InstanceID>${10 + i}</rasd:InstanceID>
        <rasd:Parent>3</rasd:Parent>
        <rasd:ResourceType>17</rasd:ResourceType>
      </Item>`,
    )
    .join('\n')
  return `<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1" xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData" xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData" xmlns:vmw="http://www.vmware.com/schema/ovf">
  <References>
${files}
  </References>
  <DiskSection>
    <Info>Virtual disk information</Info>
${diskDefs}
  </DiskSection>
  <NetworkSection>
    <Info>The list of logical networks</Info>
    <Network ovf:name="VM Network"><Description>The VM Network network</Description></Network>
  </NetworkSection>
  <VirtualSystem ovf:id="${name}">
    <Info>A virtual machine</Info>
    <Name>${name}</Name>
    <OperatingSystemSection ovf:id="101" vmw:osType="${osType}">
      <Info>The kind of installed guest operating system</Info>
    </OperatingSystemSection>
    <VirtualHardwareSection>
      <Info>Virtual hardware requirements</Info>
      <System>
        <vssd:ElementName>Virtual Hardware Family</vssd:ElementName>
        <vssd:InstanceID>0</vssd:InstanceID>
        <vssd:VirtualSystemIdentifier>${name}</vssd:VirtualSystemIdentifier>
        <vssd:VirtualSystemType>vmx-13</vssd:VirtualSystemType>
      </System>
      <Item>
        <rasd:AllocationUnits>hertz * 10^6</rasd:AllocationUnits>
        <rasd:ElementName>2 virtual CPU(s)</rasd:ElementName>
        <rasd:InstanceID>1</rasd:InstanceID>
        <rasd:ResourceType>3</rasd:ResourceType>
        <rasd:VirtualQuantity>2</rasd:VirtualQuantity>
      </Item>
      <Item>
        <rasd:AllocationUnits>byte * 2^20</rasd:AllocationUnits>
        <rasd:ElementName>512MB of memory</rasd:ElementName>
        <rasd:InstanceID>2</rasd:InstanceID>
        <rasd:ResourceType>4</rasd:ResourceType>
        <rasd:VirtualQuantity>512</rasd:VirtualQuantity>
      </Item>
      <Item>
        <rasd:Address>0</rasd:Address>
        <rasd:ElementName>SCSI controller 0</rasd:ElementName>
        <rasd:InstanceID>3</rasd:InstanceID>
        <rasd:ResourceSubType>lsilogic</rasd:ResourceSubType>
        <rasd:ResourceType>6</rasd:ResourceType>
      </Item>
${diskItems}
      <Item>
        <rasd:Address>00:50:56:01:02:03</rasd:Address>
        <rasd:AddressOnParent>7</rasd:AddressOnParent>
        <rasd:AutomaticAllocation>true</rasd:AutomaticAllocation>
        <rasd:Connection>VM Network</rasd:Connection>
        <rasd:ElementName>Network adapter 1</rasd:ElementName>
        <rasd:InstanceID>20</rasd:InstanceID>
        <rasd:ResourceSubType>VmxNet3</rasd:ResourceSubType>
        <rasd:ResourceType>10</rasd:ResourceType>
      </Item>
      <vmw:Config ovf:required="false" vmw:key="firmware" vmw:value="bios"/>
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>
`
}

/**
 * How an OVF package stores its disk files (DSP0243 7.1, 5.3): gzip-compressed
 * (`ovf:compression="gzip"`, as `ovftool --compress` writes them) and/or cut into
 * `ovf:chunkSize`-byte chunks `<href>.000000000`, `<href>.000000001`, ...
 */
export interface OvfPacking {
  gzip?: boolean
  chunkSize?: number
}

function ovfFolder(dir: string, name: string, raws: string[], packing: OvfPacking = {}): { ovf: string; files: string[] } {
  mkdirSync(dir, { recursive: true })
  const stored: string[] = []
  const disks = raws.map((raw, i) => {
    let file = `${name}-disk${i + 1}.vmdk`
    convert(raw, 'vmdk', path.join(dir, file), 'subformat=streamOptimized')
    const attrs: string[] = []
    if (packing.gzip) {
      run('gzip', ['-n', file], dir)
      file += '.gz'
      attrs.push('ovf:compression="gzip"')
    }
    const size = statSync(path.join(dir, file)).size
    if (packing.chunkSize) {
      const data = readFileSync(path.join(dir, file))
      for (let k = 0; k * packing.chunkSize < size; k++) {
        const chunk = `${file}.${String(k).padStart(9, '0')}`
        writeFileSync(path.join(dir, chunk), data.subarray(k * packing.chunkSize, (k + 1) * packing.chunkSize))
        stored.push(chunk)
      }
      rmSync(path.join(dir, file))
      attrs.push(`ovf:chunkSize="${packing.chunkSize}"`)
    } else stored.push(file)
    return { file, size, capacity: statSync(raw).size, attrs: attrs.join(' ') }
  })
  const ovf = `${name}.ovf`
  writeFileSync(path.join(dir, ovf), ovfEnvelope(name, disks))
  const mf = [ovf, ...stored].map((f) => `SHA1(${f})= ${sha1(path.join(dir, f))}`).join('\n') + '\n'
  writeFileSync(path.join(dir, `${name}.mf`), mf)
  return { ovf, files: [ovf, `${name}.mf`, ...stored] }
}

function vmxText(name: string, disks: string[]): string {
  const lines = [
    '.encoding = "UTF-8"',
    'config.version = "8"',
    'virtualHW.version = "13"',
    `displayName = "${name}"`,
    'guestOS = "debian10-64"',
    'memSize = "768"',
    'numvcpus = "2"',
    'cpuid.coresPerSocket = "2"',
    'firmware = "bios"',
    'scsi0.present = "TRUE"',
    'scsi0.virtualDev = "pvscsi"',
    ...disks.flatMap((d, i) => [`scsi0:${i}.present = "TRUE"`, `scsi0:${i}.fileName = "${d}"`, `scsi0:${i}.deviceType = "scsi-hardDisk"`]),
    'ethernet0.present = "TRUE"',
    'ethernet0.virtualDev = "vmxnet3"',
    'ethernet0.networkName = "VM Network"',
    'ethernet0.addressType = "generated"',
    'ethernet0.generatedAddress = "00:0c:29:aa:bb:cc"',
  ]
  return lines.join('\n') + '\n'
}

function vboxText(name: string, disks: Array<{ uuid: string; file: string; format: string }>): string {
  const hard = disks.map((d) => `        <HardDisk uuid="{${d.uuid}}" location="${d.file}" format="${d.format}" type="Normal"/>`).join('\n')
  const attached = disks.map((d, i) => `          <AttachedDevice type="HardDisk" hotpluggable="false" port="${i}" device="0"><Image uuid="{${d.uuid}}"/></AttachedDevice>`).join('\n')
  return `<?xml version="1.0"?>
<VirtualBox xmlns="http://www.virtualbox.org/" version="1.16-linux">
  <Machine uuid="{6c1a7f1e-9b1d-4d0e-8a8e-1f5d3c2b1a00}" name="${name}" OSType="Debian_64" snapshotFolder="Snapshots">
    <MediaRegistry>
      <HardDisks>
${hard}
      </HardDisks>
    </MediaRegistry>
    <Hardware>
      <CPU count="2"/>
      <Memory RAMSize="1024"/>
      <Firmware type="BIOS"/>
      <Network>
        <Adapter slot="0" enabled="true" MACAddress="080027123456" type="82540EM">
          <NAT/>
        </Adapter>
      </Network>
      <StorageControllers>
        <StorageController name="SATA" type="AHCI" PortCount="${disks.length}" useHostIOCache="false" Bootable="true">
${attached}
        </StorageController>
      </StorageControllers>
    </Hardware>
  </Machine>
</VirtualBox>
`
}

function xvaOvaXml(name: string, disks: Array<{ ref: string; size: number }>): string {
  const m = (n: string, v: string) => `<member><name>${n}</name><value>${v}</value></member>`
  const vbds = disks.map((_d, i) => `<value>Ref:${100 + i}</value>`).join('')
  const objects = [
    `<value><struct>${m('class', 'VM')}${m('id', 'Ref:1')}<member><name>snapshot</name><value><struct>${m('name_label', name)}${m('memory_static_max', String(1024 * MiB))}${m('VCPUs_max', '2')}<member><name>HVM_boot_params</name><value><struct>${m('order', 'cd')}</struct></value></member><member><name>platform</name><value><struct>${m('device_id', '0001')}</struct></value></member><member><name>VBDs</name><value><array><data>${vbds}</data></array></value></member><member><name>VIFs</name><value><array><data></data></array></value></member></struct></value></member></struct></value>`,
    ...disks.map(
      (d, i) =>
        `<value><struct>${m('class', 'VBD')}${m('id', `Ref:${100 + i}`)}<member><name>snapshot</name><value><struct>${m('userdevice', String(i))}${m('type', 'Disk')}${m('bootable', i === 0 ? '<boolean>1</boolean>' : '<boolean>0</boolean>')}${m('VDI', d.ref)}${m('VM', 'Ref:1')}</struct></value></member></struct></value>`,
    ),
    ...disks.map((d, i) => `<value><struct>${m('class', 'VDI')}${m('id', d.ref)}<member><name>snapshot</name><value><struct>${m('name_label', `disk ${i}`)}${m('virtual_size', String(d.size))}${m('type', 'user')}</struct></value></member></struct></value>`),
  ]
  return `<?xml version="1.0" ?><value><struct><member><name>version</name><value><struct>${m('hostname', 'xen1')}${m('xapi_major', '1')}${m('xapi_minor', '1')}${m('export_vsn', '2')}</struct></value></member><member><name>objects</name><value><array><data>${objects.join('')}</data></array></value></member></struct></value>\n`
}

/**
 * Builds an input of `kind` named `name` under `root` from `raws` (raw images, one per disk;
 * single-disk kinds use the first). Returns where it is and what it holds.
 */
export function buildInput(kind: string, root: string, name: string, raws: string[], packing: OvfPacking = {}): BuiltInput {
  const disks = raws.map((raw) => ({ raw, capacity: statSync(raw).size }))
  const dir = path.join(root, name)
  switch (kind) {
    case 'qcow2':
      mkdirSync(dir, { recursive: true })
      return { kind, name, path: convert(raws[0], 'qcow2', path.join(dir, `${name}.qcow2`)), disks: disks.slice(0, 1) }
    case 'vhdx':
      mkdirSync(dir, { recursive: true })
      return { kind, name, path: convert(raws[0], 'vhdx', path.join(dir, `${name}.vhdx`)), disks: disks.slice(0, 1) }
    case 'vmdk':
      mkdirSync(dir, { recursive: true })
      return { kind, name, path: convert(raws[0], 'vmdk', path.join(dir, `${name}.vmdk`)), disks: disks.slice(0, 1) }
    case 'ovf_folder':
      ovfFolder(dir, name, raws, packing)
      return { kind, name, path: dir, disks }
    case 'ova_archive': {
      const staging = path.join(root, `.${name}-staging`)
      const { files } = ovfFolder(staging, name, raws, packing)
      const ova = path.join(root, `${name}.ova`)
      run('tar', ['--format=ustar', '-cf', ova, '-C', staging, ...files])
      execFileSync('rm', ['-rf', staging])
      return { kind, name, path: ova, disks }
    }
    case 'vmx_folder': {
      mkdirSync(dir, { recursive: true })
      const files = raws.map((raw, i) => {
        const f = `${name}${i ? `_${i}` : ''}.vmdk`
        convert(raw, 'vmdk', path.join(dir, f), i === 0 ? 'subformat=monolithicSparse' : 'subformat=monolithicFlat')
        return f
      })
      writeFileSync(path.join(dir, `${name}.vmx`), vmxText(name, files))
      return { kind, name, path: dir, disks }
    }
    case 'vbox_folder': {
      mkdirSync(dir, { recursive: true })
      const media = raws.map((raw, i) => {
        const format = i === 0 ? 'VDI' : 'VMDK'
        const file = `${name}-${i}.${format.toLowerCase()}`
        convert(raw, format.toLowerCase(), path.join(dir, file))
        return { uuid: `0e5b6c1a-2f3d-4e5f-8a9b-00000000000${i}`, file, format }
      })
      writeFileSync(path.join(dir, `${name}.vbox`), vboxText(name, media))
      return { kind, name, path: dir, disks }
    }
    case 'xva_archive': {
      const staging = path.join(root, `.${name}-staging`)
      mkdirSync(staging, { recursive: true })
      const refs = raws.map((raw, i) => {
        const ref = `Ref:${200 + i}`
        mkdirSync(path.join(staging, ref))
        const buf = readFileSync(raw)
        for (let b = 0; b * MiB < buf.length; b++) {
          const block = buf.subarray(b * MiB, (b + 1) * MiB)
          if (block.every((x) => x === 0)) continue
          const f = path.join(staging, ref, String(b).padStart(8, '0'))
          writeFileSync(f, block)
          writeFileSync(`${f}.checksum`, createHash('sha1').update(block).digest('hex'))
        }
        return { ref, size: buf.length }
      })
      writeFileSync(path.join(staging, 'ova.xml'), xvaOvaXml(name, refs))
      const xva = path.join(root, `${name}.xva`)
      run('tar', ['--format=ustar', '--sort=name', '-cf', xva, '-C', staging, 'ova.xml', ...refs.map((r) => r.ref)])
      execFileSync('rm', ['-rf', staging])
      return { kind, name, path: xva, disks }
    }
    default:
      throw new Error(`buildInput: unknown kind ${kind}`)
  }
}

/** Copies `src` into `dir` (for tests that need a file beside a descriptor). */
export function place(src: string, dir: string, name = path.basename(src)): string {
  mkdirSync(dir, { recursive: true })
  const dst = path.join(dir, name)
  copyFileSync(src, dst)
  return dst
}
