/**
 * Manifests for the domain and V2V tests (shapes of lib/manifest.ts, values chosen by hand).
 */
import type { VmManifest } from '../../lib/manifest.ts'

/** A one-disk, one-NIC Linux BIOS manifest; `over` replaces top-level fields. */
export function manifest(over: Partial<VmManifest> = {}): VmManifest {
  return {
    name: 'web01',
    source_format: 'ova_archive',
    guest_os: { family: 'linux', id: 'ubuntu64Guest' },
    firmware: 'bios',
    secure_boot: false,
    cpu: { count: 2, cores_per_socket: 1 },
    memory_bytes: 2 * 1024 * 1024 * 1024,
    disks: [disk('Hard disk 1')],
    nics: [{ label: 'Network adapter 1', mac: '00:50:56:01:02:03', model: 'vmxnet3', network: 'VM Network' }],
    cbt_available: false,
    warnings: [],
    ...over,
  }
}

/** One manifest disk of 1 GiB read from a VMDK. */
export function disk(label: string, capacity = 1 << 30): VmManifest['disks'][number] {
  return { label, capacity_bytes: capacity, disk_format: 'vmdk', source: { path: `/imports/${label}.vmdk` }, controller: 'scsi', address: 'scsi0:0' }
}
