/**
 * The migration job resource (spec 2.3, 3; DESIGN.md section 3).
 */
import type { Plan, Strategy } from './plan.ts'
import type { ErrorCode } from './errors.ts'

/** Job states: spec section 3's phases plus `Queued` (initial), `Failed`, `Cancelled`. */
export const JOB_STATES = ['Queued', 'CopyingFull', 'DeltaSyncing', 'CuttingOver', 'V2vProcessing', 'Starting', 'Completed', 'Failed', 'Cancelled'] as const
export type JobState = (typeof JOB_STATES)[number]

/** Coarse status derived from the state. */
export type JobStatus = 'queued' | 'running' | 'completed' | 'failed' | 'cancelled'

/** States after which a job never moves again. */
export const TERMINAL_STATES: readonly JobState[] = ['Completed', 'Failed', 'Cancelled']

/** The status of a state: Queued -> queued, the phases -> running, terminal states by name. */
export function jobStatusOf(state: JobState): JobStatus {
  switch (state) {
    case 'Queued':
      return 'queued'
    case 'Completed':
      return 'completed'
    case 'Failed':
      return 'failed'
    case 'Cancelled':
      return 'cancelled'
    default:
      return 'running'
  }
}

/** Per-disk progress; all values are bytes. `watermark` is the durable copy position. */
export interface DiskProgress {
  label: string
  capacity_bytes: number
  bytes_done: number
  /** Bytes of this disk found zero and discarded instead of written (counted in `bytes_done`). */
  bytes_zero: number
  /** Bytes per second over the last 5 s, and seconds left at that rate (null when unknown). */
  rate_bytes_per_s: number
  eta_s: number | null
  /** Bytes durably written (flushed) from the start of the disk: a resumed copy starts here. */
  watermark: number
  /**
   * Bytes read from the source for this disk by the current worker attempt (reset when a worker
   * resumes the job; the last attempt's figure once the job ended). A resumed copy reads only
   * what lies above its durable watermark. Absent in progress written before this field existed.
   */
  bytes_read?: number
}

/**
 * Job progress: bytes total/done/zero (zero = discarded zero runs, counted in done),
 * rate in bytes per second over the last interval, ETA in seconds (null when unknown).
 */
export interface Progress {
  bytes_total: number
  bytes_done: number
  bytes_zero: number
  rate_bytes_per_s: number
  eta_s: number | null
  disks: DiskProgress[]
}

/** `last_error`: a fatal failure, or a non-fatal notice such as `E_MIG_CBT_UNSUPPORTED` (spec 1.4). */
/**
 * What a cancel does with the guest of a live import that already runs (docs/live-import.md):
 * `finish` (the default) lets the copy run to the pivot and ends the job `Completed`, the guest
 * running on its volumes with what it wrote; `destroy` aborts the copy and destroys the guest and
 * its writes, then the job ends `Cancelled`. Jobs without a running live guest cancel as usual.
 */
export const LIVE_GUEST_ON_CANCEL = ['finish', 'destroy'] as const
/** One of {@link LIVE_GUEST_ON_CANCEL}. */
export type LiveGuestOnCancel = (typeof LIVE_GUEST_ON_CANCEL)[number]

export interface LastError {
  code: ErrorCode
  message: string
  fatal: boolean
}

/** The host restore point taken before the job wrote anything (plan `restore_point`). */
export interface RestorePointRecord {
  backup_job_id: string
  run_id: string
  restore_point_id: string
  quiesced: boolean
  created_at: string | null
}

/** One delta pass of a warm live job (seconds, bytes). */
export interface DeltaPassRecord {
  /** 1 for the first delta pass after the full copy. */
  pass: number
  started_at: string
  /** Whole pass: snapshot, changed-area queries, copy, removal of the previous snapshot. */
  duration_s: number
  /** Bytes the source reported changed since the previous pass (all disks). */
  changed_bytes: number
  /** Time spent copying those bytes. */
  copy_s: number
  /** `changed_bytes / copy_s` (0 when nothing changed). */
  rate_bytes_per_s: number
}

/**
 * What a cutover started now would cost, in seconds: shutting the guest down (at most the guest
 * shutdown timeout, after which the VM is powered off), the final delta (`final_delta_bytes`,
 * the last pass's changed bytes, over the measured rate, plus the pass's fixed cost of snapshot
 * and queries) and starting the destination (the boot check's grace period).
 */
export interface ProjectedDowntime {
  total_s: number
  shutdown_s: number
  final_delta_bytes: number
  rate_bytes_per_s: number
  copy_s: number
  snapshot_s: number
  start_s: number
}

/** The warm phase of a live job (plan `cutover`, roadmap v0.6); timestamps ISO-8601 UTC. */
export interface CutoverStatus {
  /** `auto`: cut over when a pass converges; `manual`: on `POST /migrations/:id/cutover`; `scheduled`: at `at` (or on command). */
  mode: 'auto' | 'manual' | 'scheduled'
  at: string | null
  /** Seconds between delta passes while waiting (null for `auto`, which runs them back to back). */
  precopy_interval_seconds: number | null
  /** When the operator asked for the cutover (the job's or its bulk plan's command). */
  requested_at: string | null
  /** When `CuttingOver` began. */
  started_at: string | null
  passes_total: number
  /** The latest passes (at most 20), oldest first. */
  passes: DeltaPassRecord[]
  projected_downtime: ProjectedDowntime | null
}

/** What the job did to the power of its live source VM. */
export interface SourceVmRecord {
  /** When the migrator shut the source VM down (null: it did not; it was off already or never asked). */
  shut_down_at: string | null
  /** When the migrator powered it on again after the job failed or was cancelled. */
  powered_on_at: string | null
}

/**
 * The destination hardware of a job, chosen in `Starting` from the static inspection of the copied
 * guest (lib/domain/hardware.ts):
 * - `disk_bus`: `virtio-blk`, `virtio-scsi`, `pvscsi` (VMware PVSCSI), `lsisas1068` (LSI Logic
 *   SAS), `lsilogic` (LSI 53C895A), `sata` (ICH9 AHCI) or `ide`;
 * - `nic_model`: `virtio`, `vmxnet3`, `e1000e`, `e1000` or `rtl8139`;
 * - `firmware`: `bios` or `efi` as started;
 * - `reason`: why, in words (which drivers the guest's initramfs has, which device names it uses);
 * - `inspected`: whether libguestfs inspected the guest (false for disks with no partition table
 *   nor file system, Windows guests and plans that skip it);
 * - `boot`: the boot check's verdict, `verified` (evidence of a booted OS seen) or not, with the
 *   evidence in words; null when the domain was not started.
 * - `network`: the guest's network identity (docs/network-identity.md): every interface its
 *   configuration names, whether and how it was carried over to a NIC of the domain, and what the
 *   host saw of its addresses after the boot; `notes` on files that were not read. Null (or
 *   absent in records written before this field) when the guest was not inspected or is not Linux.
 */
export interface HardwareRecord {
  disk_bus: 'virtio-blk' | 'virtio-scsi' | 'pvscsi' | 'lsisas1068' | 'lsilogic' | 'sata' | 'ide'
  nic_model: 'virtio' | 'vmxnet3' | 'e1000e' | 'e1000' | 'rtl8139'
  firmware: 'bios' | 'efi'
  reason: string
  inspected: boolean
  /**
   * The boot check's verdict: `verified`, `evidence` in words, and `source`, which evidence decided
   * (`serial` console, `screen` OCR, the operator's serial `pattern`, the domain `state`; null when
   * nothing did); `waited_seconds`: from `virsh start` to the verdict; `screen_tail`: when not
   * verified, the last 20 lines OCR read off the guest's screen.
   */
  boot: { verified: boolean; evidence: string; source?: BootEvidenceSource | null; waited_seconds?: number; screen_tail?: string[] } | null
  /** UEFI guests: how OVMF finds the boot loader (lib/domain/uefi-boot.ts); absent or null for BIOS guests. */
  uefi_boot?: UefiBootRecord | null
  /** UEFI guests of a source that keeps their variable store (libvirt `<nvram>`): whether it was carried as the domain's NVRAM. */
  nvram?: NvramRecord | null
  /** Linux guests: the interfaces their network configuration names and how each was carried over (docs/network-identity.md). */
  network?: { interfaces: CarriedInterface[]; notes: string[] } | null
  /** Linux guests: the device names in fstab, the kernel line, crypttab and the resume setting rewritten on the destination volumes (docs/boot-check.md). */
  device_names?: DeviceNamesRecord | null
  /** The plan's service checks after a verified boot (`plan.checks`; docs/boot-check.md "Services that answer"). */
  checks?: ServiceCheckResult[]
}

/**
 * One configured interface as the job reports it (`HardwareRecord.network.interfaces[]`):
 * - `name`: the name in the configuration (null: bound by MAC only); `mac`: the destination NIC's
 *   MAC it is carried to (null when unmatched); `nic`: that NIC's source label (`ethernet0`);
 * - `config`: `style:file` of each configuration that names it; `method`, `addresses`,
 *   `gateway` (IPv4), `gateway6` (IPv6), `routes`, `dns`: what the configuration sets (union of the files);
 * - `carried`: the interface will come up on the destination under the same name;
 * - `how`: `link-file` (a `.link` file written), `guest-rule` (the guest's own rule pins it),
 *   `mac` (the configuration matches the MAC, which is kept), or null when not carried;
 * - `matched_by`: why this NIC (`config-mac`, `slot`, `eth-index`, `only-nic`, `guest-rule`);
 * - `link_file`: the guest path written, or null; `why`: words for a `carried: false`;
 * - `address_check`: after the boot, whether the host saw the guest use a configured address
 *   (`seen`: in the host's ARP/neighbour table for the NIC's MAC; `not-seen`; `not-checked` with
 *   the reason in `address_evidence`).
 */
export interface CarriedInterface {
  name: string | null
  mac: string | null
  nic: string | null
  config: string[]
  /** As lib/domain/net-config.ts reads it from the guest's configuration. */
  method: 'static' | 'dhcp' | 'manual' | 'other'
  addresses: string[]
  gateway: string | null
  gateway6: string | null
  routes: string[]
  dns: string[]
  carried: boolean
  how: 'link-file' | 'guest-rule' | 'mac' | null
  matched_by: 'config-mac' | 'slot' | 'eth-index' | 'only-nic' | 'guest-rule' | null
  link_file: string | null
  why: string | null
  address_check: 'seen' | 'not-seen' | 'not-checked'
  address_evidence: string | null
}

/** One rewritten (or kept) name: the guest file, its 1-based line, the old and the new spec, and why. */
export interface DeviceNameChange {
  file: string
  line: number
  what: string
  from: string
  to: string | null
  why: string
}

/**
 * The device name rewrite of a Linux guest (lib/domain/device-names.ts):
 * - `family`: how the destination's kernel names the disks (`vd` on virtio-blk, `sd` otherwise);
 * - `rewritten`: each name changed (guest file, line, what, `from`, `to`, why);
 * - `kept`: names the destination breaks that could not be rewritten (`to` null, why);
 * - `written`: the files were written (false: nothing changed, `error` says why).
 */
export interface DeviceNamesRecord {
  family: 'vd' | 'sd'
  rewritten: DeviceNameChange[]
  kept: DeviceNameChange[]
  written: boolean
  error: string | null
}

/**
 * The result of one check (`hardware.checks[]` of the job): `name`, `kind`, `target` (what was
 * tried, e.g. `tcp 192.0.2.10:8080` or the URL), `address` that answered or was tried last (null:
 * no address known), `address_source` (`static ens192`, `dhcp lease`, `neighbour`), `ok`,
 * `result` in words, `at` (ISO-8601 UTC of the verdict), `seconds` from the start of the check,
 * `attempts`, `on_failure`.
 */
export interface ServiceCheckResult {
  name: string
  kind: 'tcp' | 'http'
  target: string | null
  address: string | null
  address_source: string | null
  ok: boolean
  result: string
  at: string
  seconds: number
  attempts: number
  on_failure: 'fail' | 'notice'
}

/** Which evidence decided a boot check: the serial console, the screen (OCR), the operator's serial pattern, the domain state. */
export type BootEvidenceSource = 'serial' | 'screen' | 'pattern' | 'state'

/**
 * How OVMF finds a UEFI guest's boot loader (lib/domain/uefi-boot.ts):
 * - `method`: `removable-path` (the ESP already has `\EFI\BOOT\BOOTX64.EFI`), `fallback-installed`
 *   (the migrator copied `loader` there on the destination volume), `none` (no loader on any ESP:
 *   OVMF will not boot it, the boot check reports OVMF's words), `not-inspected` (no ESP was read),
 *   `nvram-carried` (the source's variable store is the domain's NVRAM: its boot entries find the
 *   loader; nothing is written to the ESP).
 * - `loader`: the guest path of the loader found or copied from (backslashes), null for `none`.
 * - `detail`: the same in words.
 */
export interface UefiBootRecord {
  method: 'removable-path' | 'fallback-installed' | 'none' | 'not-inspected' | 'nvram-carried'
  loader: string | null
  detail: string
}

/**
 * The source's UEFI variable store and the destination domain's NVRAM (lib/domain/start.ts):
 * `carried` (its bytes are the domain's NVRAM file `path`, so its boot entries are OVMF's), the
 * file on the source (`source_path`), its size (`bytes`) and SHA-256 (hex), and `detail` in words
 * (why it was not carried when it was not: a store of another flash size than the destination's
 * OVMF, firmware changed to BIOS by the plan).
 */
export interface NvramRecord {
  carried: boolean
  source_path: string
  path: string | null
  bytes: number
  sha256: string
  detail: string
}

/**
 * The test boot of a job (docs/test-boot.md): a disposable clone of the destination volumes booted
 * as its own domain, never on the plan's networks, while the source keeps running. Timestamps ISO-8601 UTC,
 * `seconds` wall time of the whole test boot.
 * - `state`: `requested` (asked; a warm job takes it at its next pass boundary), `running`,
 *   `passed` (the clone booted through the boot check), `failed` (did not boot, or the test boot
 *   itself failed: `error`), `cancelled` (a cutover, the job's cancel, or a restart ended it).
 * - `verified`: the boot check saw evidence of a booted OS (a `passed` boot may be unverified: a
 *   guest that gives no serial evidence; `evidence` says so).
 * - `domain`: the clone's domain name (`<domain>-testboot`), removed when the test boot ends.
 * - `clone`: what was cloned (`qcow2 overlay` or `zfs clone`).
 * - `hardware`: the hardware chosen for the clone, as a real start would choose it; with the
 *   plan's `checks`, their results (`hardware.checks`, run from the test boot's isolated network).
 * - `serial_tail`: the last lines of the clone's serial console.
 * - `notice`: what does not fail the test boot but is worth reading (an unverified boot, a check
 *   with `on_failure: notice` that failed); null when none (absent on records written before it).
 * A failed test boot never fails the job: it is a notice read before the cutover.
 */
export interface TestBootRecord {
  state: 'requested' | 'running' | 'passed' | 'failed' | 'cancelled'
  requested_at: string
  started_at: string | null
  finished_at: string | null
  seconds: number | null
  verified: boolean
  evidence: string | null
  domain: string | null
  clone: string | null
  hardware: HardwareRecord | null
  serial_tail: string[]
  error: string | null
  notice?: string | null
}

/** Test boot states in which a clone may exist (a domain and volumes to remove). */
export const TEST_BOOT_ACTIVE: readonly TestBootRecord['state'][] = ['requested', 'running']

/** The job resource as the API returns it. Timestamps are ISO-8601 UTC. */
export interface Job {
  id: string
  plan: Plan
  state: JobState
  status: JobStatus
  strategy: Strategy
  effective_mode: 'Warm' | 'Cold'
  progress: Progress
  last_error: LastError | null
  restore_point: RestorePointRecord | null
  /** The libvirt domain defined for the job (set in `Starting`), null before. */
  domain: string | null
  /** Warm live jobs: the delta passes and the cutover (null for cold and offline jobs). */
  cutover: CutoverStatus | null
  /** Live jobs: the source VM's shutdown and power-on by the migrator (null before any). */
  source_vm: SourceVmRecord | null
  /** The bulk plan the job belongs to, and the jobs it waits for (empty outside a plan). */
  bulk_plan_id: string | null
  /** The job's key in its bulk plan (null outside a plan). */
  bulk_key: string | null
  depends_on: string[]
  /** Jobs this one waits for that ended `Failed` or `Cancelled` (or are blocked themselves): it cannot start. */
  blocked_by: string[]
  /**
   * The destination hardware chosen in `Starting` and what the boot check saw (see
   * `HardwareRecord`); null before `Starting` (and for jobs that never reached it).
   */
  hardware: HardwareRecord | null
  /** The latest test boot (see `TestBootRecord`); null when none was asked for. */
  test_boot: TestBootRecord | null
  created_at: string
  updated_at: string
  started_at: string | null
  finished_at: string | null
}

/** Progress of a job nothing has been copied for yet. */
export function emptyProgress(): Progress {
  return { bytes_total: 0, bytes_done: 0, bytes_zero: 0, rate_bytes_per_s: 0, eta_s: null, disks: [] }
}
