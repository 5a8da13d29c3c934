/**
 * Source domains for the `libvirt_remote` tests: defined on this machine's libvirtd over qcow2 or
 * raw disks holding the bootable test disk of fixtures/bootdisk.ts, written to through the
 * running QEMU's block layer, compared with `qemu-img convert`, and removed with their
 * checkpoint metadata.
 */
import { execFileSync } from 'node:child_process'
import { chmodSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeBootDisk } from './bootdisk.ts'

/** `virsh -q -c qemu:///system args` output, trimmed; throws when virsh fails. */
export function virsh(...args: string[]): string {
  return execFileSync('virsh', ['-q', '-c', 'qemu:///system', ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim()
}
/** Whether `virsh args` succeeds. */
export function virshOk(...args: string[]): boolean {
  try {
    virsh(...args)
    return true
  } catch {
    return false
  }
}

/** Destroys and undefines every domain named `prefix*` (their checkpoint metadata and NVRAM too). */
export function removeTestDomains(prefix: string): void {
  for (const n of virsh('list', '--all', '--name')
    .split('\n')
    .map((s) => s.trim())
    .filter((s) => s.startsWith(prefix))) {
    virshOk('destroy', '--domain', n)
    virshOk('undefine', '--domain', n, '--checkpoints-metadata', '--nvram') || virshOk('undefine', '--domain', n, '--checkpoints-metadata')
  }
}

/**
 * Defines a source domain over `disks` (qcow2 or raw files, virtio), `memoryMiB` of memory, one
 * user NIC with a fixed MAC; BIOS, or with `uefi` OVMF (Debian's 4 MiB code image) and the
 * variable store file `uefi.nvram` (a serial console to `uefi.serial` when given).
 */
export function defineSource(
  name: string,
  disks: { file: string; format: 'qcow2' | 'raw' }[],
  mac = '52:54:00:4c:56:01',
  memoryMiB = 64,
  uefi?: { nvram: string; serial?: string },
): string {
  const os = uefi
    ? `<os><type arch='x86_64' machine='pc'>hvm</type><loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader><nvram template='/usr/share/OVMF/OVMF_VARS_4M.fd'>${uefi.nvram}</nvram><boot dev='hd'/></os>
  <features><acpi/></features>`
    : "<os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>"
  const serial = uefi?.serial ? `<serial type='file'><source path='${uefi.serial}'/></serial>` : "<serial type='null'/>"
  const xml = `<domain type='qemu'>
  <name>${name}</name>
  <memory unit='MiB'>${memoryMiB}</memory>
  <vcpu>1</vcpu>
  ${os}
  <metadata><libosinfo:libosinfo xmlns:libosinfo="http://libosinfo.org/xmlns/libvirt/domain/1.0"><libosinfo:os id="http://debian.org/debian/12"/></libosinfo:libosinfo></metadata>
  <devices>
${disks.map((d, i) => `    <disk type='file' device='disk'><driver name='qemu' type='${d.format}'/><source file='${d.file}'/><target dev='vd${String.fromCharCode(97 + i)}' bus='virtio'/></disk>`).join('\n')}
    <interface type='user'><mac address='${mac}'/><model type='virtio'/></interface>
    ${serial}
  </devices>
</domain>`
  const f = `${disks[0]!.file}.xml`
  writeFileSync(f, xml)
  virsh('define', '--file', f)
  return virsh('domuuid', '--domain', name)
}

/** Writes `length` bytes of `pattern` at `offset` of disk `target` through the running QEMU's block layer. */
export function qemuWrite(domain: string, target: string, offset: number, length: number, pattern: number): void {
  const out = virsh(
    'qemu-monitor-command',
    '--domain',
    domain,
    '--hmp',
    `qemu-io -d /machine/peripheral/virtio-disk${target.charCodeAt(2) - 97}/virtio-backend "write -P ${pattern} ${offset} ${length}"`,
  )
  if (/error|conflict|not found/i.test(out)) throw new Error(`qemu-io on ${domain}: ${out}`)
}

/** The raw bytes of a (qcow2) image as qemu reads them. */
export function rawOf(file: string, dir: string): Buffer {
  const out = path.join(dir, `${path.basename(file)}.${Date.now()}.raw`)
  execFileSync('qemu-img', ['convert', '-U', '-O', 'raw', file, out])
  const b = readFileSync(out)
  execFileSync('rm', ['-f', out])
  return b
}

/** A qcow2 image of the boot-sector test disk (its sparse raw form: data chunks between zeros). */
export function makeQcow2(file: string, marker: string, sizeBytes: number): string {
  const raw = `${file}.src.raw`
  makeBootDisk(raw, marker, sizeBytes)
  execFileSync('qemu-img', ['convert', '-O', 'qcow2', raw, file])
  execFileSync('rm', ['-f', raw])
  chmodSync(file, 0o644)
  return file
}
