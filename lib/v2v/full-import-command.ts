/**
 * The virt-v2v invocation of the VMCX passthrough import (lib/v2v/full-import.ts runs it): the
 * command line, its environment, the `-i libvirtxml` description of the VM and the paths
 * virt-v2v writes, for one private run directory `<run>`. Builds; runs and touches nothing.
 *
 * Debian 12's virt-v2v 2.2 has no Hyper-V input module (`virt-v2v --machine-readable` lists
 * `input:disk|libvirt|libvirtxml|ova|vmx`), so the VM is described to it with `-i libvirtxml`
 * (virt-v2v(1) "Minimal XML for -i libvirtxml option"; parsed by virt-v2v's
 * input/parse_libvirt_xml.ml): `<domain type='hyperv'>`, name, memory in KiB, vCPUs and topology,
 * `<os firmware='bios|efi'>`, NICs with their MACs, and every disk of the manifest in order as a
 * file with its qemu format (`vhdx`, `vpc`), which virt-v2v serves with `qemu-nbd -f <format>`.
 *
 * Output: `-o local -os <run>/out -of raw -oa sparse -on <name>` writes disk `i` to
 * `<run>/out/<name>-sd<drive_name(i)>` (virt-v2v output/output.ml `disk_path`) and the converted
 * guest's libvirt XML to `<run>/out/<name>.xml`.
 *
 * Command line:
 *   virt-v2v -i libvirtxml <run>/input.xml -o local -os <run>/out -of raw -oa sparse -on <name>
 *            --root first --machine-readable
 * Environment: exactly `PATH`, `HOME`, `LC_ALL=C`, `LIBGUESTFS_BACKEND=direct`,
 * `VIRT_V2V_TMPDIR=<run>/tmp`, `VIRTIO_WIN=<iso>` (when a driver ISO is configured or the default
 * one exists), plus the caller's `env` (e.g. `LIBGUESTFS_BACKEND_SETTINGS=force_tcg`).
 * `<run>`: the private run directory full-import.ts makes under the caller's `workDir`.
 */
import * as path from 'node:path'
import { driveLetters, serializeDomainXml } from '../domain/xml.ts'
import type { ManifestDisk, VmManifest } from '../manifest.ts'
import { v2vOutputName } from './tool.ts'

/** Default tool (spec 1.5: `virt-v2v`). */
export const DEFAULT_FULL_IMPORT_BINARY = 'virt-v2v'

/**
 * The exact invocation for a run directory: `argv[0]` is the binary; `inputXml` goes to
 * `inputXmlPath`; `outputs[i]` is where virt-v2v writes disk `i` (made a symlink to volume `i`);
 * `outputXmlPath` is the converted guest's libvirt XML.
 */
export interface FullImportCommand {
  argv: string[]
  env: Record<string, string>
  inputXml: string
  inputXmlPath: string
  outputDir: string
  tmpDir: string
  outputName: string
  outputs: string[]
  outputXmlPath: string
}

/** virt-v2v's `drive_name`: 0 -> `a`, 25 -> `z`, 26 -> `aa`, 27 -> `ab`, ... (libvirt's spelling too). */
export const v2vDriveName = driveLetters

const noCtl = (s: string) => s.replace(/[\x00-\x1f\x7f]/g, ' ')

function targetOf(d: ManifestDisk, i: number): { '@_dev': string; '@_bus': string } {
  const letter = v2vDriveName(i)
  switch (d.controller) {
    case 'ide':
      return { '@_dev': `hd${letter}`, '@_bus': 'ide' }
    case 'virtio':
      return { '@_dev': `vd${letter}`, '@_bus': 'virtio' }
    case 'scsi':
      return { '@_dev': `sd${letter}`, '@_bus': 'scsi' }
    default:
      return { '@_dev': `sd${letter}`, '@_bus': 'sata' }
  }
}

/**
 * The `-i libvirtxml` description of `manifest` (see the module comment): memory in KiB (virt-v2v
 * reads `<memory>` as KiB whatever its unit), `<cpu><topology>` when the vCPU count splits into
 * whole sockets, every disk as `<disk type='file' device='disk'>` with `driver type` = its
 * `disk_format`, NICs as `<interface type='network'>` with their MACs.
 */
export function fullImportInputXml(manifest: VmManifest): string {
  const count = manifest.cpu.count
  const cores = manifest.cpu.cores_per_socket
  const domain: Record<string, unknown> = {
    '@_type': 'hyperv',
    name: noCtl(manifest.name).trim() || 'guest',
    memory: { '@_unit': 'KiB', '#text': String(Math.max(1, Math.ceil((manifest.memory_bytes || 1 << 30) / 1024))) },
    vcpu: String(count),
    ...(cores >= 1 && count % cores === 0 ? { cpu: { topology: { '@_sockets': String(count / cores), '@_cores': String(cores), '@_threads': '1' } } } : {}),
    os: { '@_firmware': manifest.firmware, type: { '@_arch': 'x86_64', '#text': 'hvm' } },
    features: { acpi: '', apic: '' },
    devices: {
      disk: manifest.disks.map((d, i) => ({
        '@_type': 'file',
        '@_device': 'disk',
        driver: { '@_name': 'qemu', '@_type': d.disk_format },
        source: { '@_file': d.source.path },
        target: targetOf(d, i),
      })),
      interface: manifest.nics.map((n, i) => ({
        '@_type': 'network',
        ...(n.mac ? { mac: { '@_address': n.mac } } : {}),
        source: { '@_network': noCtl(n.network ?? '').trim() || `eth${i}` },
      })),
    },
  }
  return serializeDomainXml(domain)
}

/**
 * The exact command line, environment and files of an import whose private run directory is
 * `runDir` (see the module comment). `virtioWinIso`: the ISO to pass as `VIRTIO_WIN`, or null.
 */
export function fullImportCommand(
  manifest: VmManifest,
  runDir: string,
  opts: { binary?: string; env?: Record<string, string>; virtioWinIso?: string | null } = {},
): FullImportCommand {
  const outputDir = path.join(runDir, 'out')
  const tmpDir = path.join(runDir, 'tmp')
  const inputXmlPath = path.join(runDir, 'input.xml')
  const outputName = v2vOutputName(manifest.name)
  const env: Record<string, string> = {
    PATH: process.env.PATH || '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
    HOME: process.env.HOME || '/root',
    LC_ALL: 'C',
    LIBGUESTFS_BACKEND: 'direct',
    VIRT_V2V_TMPDIR: tmpDir,
    ...(opts.virtioWinIso ? { VIRTIO_WIN: opts.virtioWinIso } : {}),
    ...(opts.env ?? {}),
  }
  const argv = [
    opts.binary ?? DEFAULT_FULL_IMPORT_BINARY,
    '-i',
    'libvirtxml',
    inputXmlPath,
    '-o',
    'local',
    '-os',
    outputDir,
    '-of',
    'raw',
    '-oa',
    'sparse',
    '-on',
    outputName,
    '--root',
    'first',
    '--machine-readable',
  ]
  return {
    argv,
    env,
    inputXml: fullImportInputXml(manifest),
    inputXmlPath,
    outputDir,
    tmpDir,
    outputName,
    outputs: manifest.disks.map((_, i) => path.join(outputDir, `${outputName}-sd${v2vDriveName(i)}`)),
    outputXmlPath: path.join(outputDir, `${outputName}.xml`),
  }
}
