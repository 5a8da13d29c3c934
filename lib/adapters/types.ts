/**
 * The live source adapter contract (spec 1.1: connect, list VMs, inspect, enable CBT, snapshot,
 * shutdown, mark, cleanup; DESIGN.md section 7). This file holds the control-plane part the
 * HTTP surface uses; the data-plane methods join it with the live adapters.
 */
import type { AdapterKind } from '../kinds.ts'
import type { VmManifest } from '../manifest.ts'
import type { SourceTls } from '../contracts/source-tls.ts'
import type { ManifestDisk } from '../manifest.ts'
import type { DiskArea, DiskReader } from '../contracts/disk-reader.ts'

/**
 * What an adapter needs to reach a source. `password` is the opened (unsealed) secret: the
 * password, or for `libvirt_remote` the private key; `tls` carries the pinned SSH host keys
 * (`known_hosts`) and TLS client certificate of that kind too.
 */
export interface SourceConnection {
  endpoint: string
  username: string
  password: string
  tls: SourceTls
  /** How long a guest shutdown may take before the VM is powered off, milliseconds (the adapter's default when absent). */
  guestShutdownTimeoutMs?: number
}

/** One VM as listed by a source (`GET /sources/:id/vms`). Memory in bytes. */
export interface VmSummary {
  vm_id: string
  name: string
  power_state: 'on' | 'off' | 'suspended' | 'unknown'
  guest_id: string | null
  cpu_count: number | null
  memory_bytes: number | null
  /** Sources that tell it in their listing (libvirt_remote): the firmware. */
  firmware?: 'bios' | 'efi'
  /** Sources that tell it in their listing (libvirt_remote): each disk's target, format, sizes (bytes), bus and host path. */
  disks?: { label: string; format: string | null; capacity_bytes: number | null; allocated_bytes: number | null; bus: string; path: string | null }[]
  /** Sources that tell it in their listing (libvirt_remote): each NIC's MAC, model and network or bridge. */
  nics?: { mac: string | null; model: string; network: string | null }[]
}

/** An open, logged-in control-plane connection. */
export interface AdapterSession {
  /** Probes the control plane; returns what it reports about itself (product, version). */
  describe(): Promise<{ product: string; version: string | null }>
  /** Lists VMs. `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_AUTH_FAILED`. */
  listVms(): Promise<VmSummary[]>
  /** Inspects one VM into a manifest. `E_MIG_VM_NOT_FOUND` when the source has no such VM. */
  inspect(vmId: string): Promise<VmManifest>
  /** Logs out and closes the connection; never throws. */
  close(): Promise<void>
}

/** A snapshot the migrator took of a source VM, with the CBT changeId of each disk at that point. */
export interface SnapshotRef {
  id: string
  /** changeId per disk label (VMware CBT); absent when CBT is off. */
  change_ids: Record<string, string>
}

/**
 * The data plane of a live connection (spec 1.1: enable CBT, snapshot, shutdown, mark, cleanup;
 * DESIGN.md section 7). Reads come only from snapshots, never from the active disk of a
 * running VM.
 */
export interface LiveSession extends AdapterSession {
  /** Whether warm migration (CBT deltas) is possible with this source at all (spec 1.4). */
  supportsWarm(): boolean
  /** Turns changed block tracking on. */
  enableCbt(vmId: string): Promise<void>
  /** Takes a crash-consistent (quiesced when tools run) snapshot. `E_MIG_SNAPSHOT_FAILED`. */
  createSnapshot(vmId: string, name: string): Promise<SnapshotRef>
  /** Opens a reader over `disk` as of `snapshot`. `E_MIG_DISK_READ_FAILED`. */
  openDisk(vmId: string, snapshot: SnapshotRef, disk: ManifestDisk): Promise<DiskReader>
  /**
   * The areas of `disk` changed between `sinceChangeId` and `snapshot` (QueryChangedDiskAreas,
   * paged until the capacity is covered); `sinceChangeId` `*` asks for every allocated area.
   * `E_MIG_CBT_RESET` when the changeId is no longer valid.
   */
  changedAreas(vmId: string, snapshot: SnapshotRef, disk: ManifestDisk, sinceChangeId: string): Promise<DiskArea[]>
  /** Removes one snapshot the migrator took. */
  removeSnapshot(vmId: string, snapshot: SnapshotRef): Promise<void>
  /**
   * Shuts the guest down (guest shutdown, then power off after a timeout). Resolves true when
   * this call took the VM down, false when it was off already.
   */
  shutdown(vmId: string): Promise<boolean>
  /** Powers the VM on (the source comes back after a failed cutover); nothing when it runs already. */
  powerOn(vmId: string): Promise<void>
  /** Marks the VM as being migrated (annotation naming the destination and job). */
  mark(vmId: string, note: string): Promise<void>
  /** Removes every snapshot the migrator made of `vmId`; never throws. */
  cleanup(vmId: string): Promise<void>
  /**
   * Sources that keep a UEFI guest's variable store in a file of their own (libvirt `<nvram>`):
   * that file's bytes, read with the VM stopped, so its boot entries travel; null when the VM has
   * none (BIOS, or no store named). `E_MIG_DISK_READ_FAILED` naming the file when it cannot be
   * read, is not a regular file or is larger than a variable store can be.
   */
  readNvram?(vmId: string): Promise<CarriedNvram | null>
}

/** A UEFI variable store read from the source: its path there and its bytes. */
export interface CarriedNvram {
  source_path: string
  bytes: Buffer
}

/**
 * A live source adapter of one kind.
 * - `supportsWarm()`: false makes the orchestrator downgrade warm plans (spec 1.4).
 * - `connect()`: validates the endpoint for the kind (`E_MIG_BAD_REQUEST`) and logs in;
 *   throws `E_MIG_SOURCE_UNREACHABLE` when nothing answers and `E_MIG_AUTH_FAILED` on a login
 *   the source rejects.
 */
export interface SourceAdapter {
  kind: AdapterKind
  supportsWarm(): boolean
  connect(conn: SourceConnection): Promise<AdapterSession>
}

/** Whether `s` (a connected source) has the data plane of {@link LiveSession}. */
export function isLiveSession(s: object): s is LiveSession {
  return typeof (s as LiveSession).createSnapshot === 'function' && typeof (s as LiveSession).openDisk === 'function'
}
