/**
 * The test boot (docs/test-boot.md): proves the guest boots on this host before the cutover,
 * while the source keeps running. A disposable clone of the destination volumes
 * (`Sink.testBootClone`: a qcow2 overlay over the file sink's raw image, a ZFS snapshot + clone of
 * a zvol) is booted as its own domain, `<domain>-testboot`, with the same hardware choice and boot
 * check as the real start (`defineAndStart`), then the domain and the clone are removed.
 *
 * Isolation: the clone's domain is never on the plan's bridges. The source VM still runs with the
 * same MAC and IP addresses; a clone there would answer for them. Without `plan.checks` the clone
 * has no network interface at all. With checks, its NICs (the same MACs, so the interface names the
 * guest pins to them hold) are on an isolated network made for this test boot
 * (lib/domain/test-boot-network.ts: a bridge with no host address and no forwarding, and a network
 * namespace on it from which the checks reach the guest's static addresses); the checks' results
 * are in the record's `hardware.checks`, a failing check fails the test boot (one with
 * `on_failure: notice` only adds to `notice`), and the network is removed with the domain.
 *
 * Guest conversion: the clone is never converted (virt-v2v-in-place works on raw volumes, and the
 * job's volumes must not change). A Linux guest that needs a conversion to boot fails the test boot
 * with that reason: the real start converts it.
 *
 * The record (`TestBootRecord`) is written through `record` at each change: `running` with the
 * domain name before anything is made (a crash then leaves enough to clean up: see
 * {@link cleanupTestBoot}), then `passed`, `failed` or `cancelled`. Never throws: a failure of the
 * test boot is its record's `error`, never the job's.
 */
import { MigError } from '../errors.ts'
import type { Job, TestBootRecord } from '../job.ts'
import type { VmManifest } from '../manifest.ts'
import type { VolumeClone } from '../sink/types.ts'
import { serialTail } from './boot-check.ts'
import { inspectGuest as realInspect } from './inspect.ts'
import { defineAndStart, type StartBootCheck } from './start.ts'
import { createTestBootNetwork, removeTestBootNetwork, type TestBootNetwork } from './test-boot-network.ts'
import type { Virsh } from './virsh.ts'
import { sanitizeDomainName } from './xml.ts'

/** Suffix of a test boot's domain name. */
export const TEST_BOOT_SUFFIX = '-testboot'

/** The test boot domain name of a job: its domain (or plan name, or manifest name) + `-testboot`, at most 63 characters. */
export function testBootDomainName(job: Pick<Job, 'domain' | 'plan'>, manifestName?: string): string {
  const base = sanitizeDomainName(job.domain ?? job.plan.name ?? manifestName ?? 'vm')
  return base.slice(0, 63 - TEST_BOOT_SUFFIX.length) + TEST_BOOT_SUFFIX
}

/**
 * The manifest of a job that ended `Completed` with `plan.start: false`, rebuilt for its test boot
 * from what the job kept: its disks (labels and capacities of `progress.disks`, manifest order),
 * and from its defined domain's XML (`virsh dumpxml`, the real start's choice): memory, vCPUs,
 * firmware and secure boot, the guest family the description records (`Guest OS: linux`), and its
 * NICs' MACs (`<interface>`, in order). Throws `E_MIG_CONFLICT` when the job kept no disk.
 */
export function manifestOfDefinedDomain(job: Job, domainXml: string): VmManifest {
  if (job.progress.disks.length === 0) throw new MigError('E_MIG_CONFLICT', `migration ${job.id} recorded no disk to test-boot`)
  const num = (re: RegExp) => {
    const m = re.exec(domainXml)
    return m ? Number(m[1]) : null
  }
  const kib = num(/<memory unit=['"]KiB['"]>(\d+)<\/memory>/)
  const vcpus = num(/<vcpu[^>]*>(\d+)<\/vcpu>/) ?? 1
  const family = /Guest OS: (windows|linux|other|unknown)\b/.exec(domainXml)?.[1] as VmManifest['guest_os']['family'] | undefined
  const efi = /<loader[^>]*type=['"]pflash['"]/.test(domainXml) || job.hardware?.firmware === 'efi'
  return {
    name: job.domain ?? job.plan.name ?? job.id,
    source_format: ('Offline' in job.plan.source ? job.plan.source.Offline : job.plan.source.Live) as VmManifest['source_format'],
    guest_os: { family: job.plan.guest_os ?? family ?? 'unknown', id: null },
    firmware: efi ? 'efi' : 'bios',
    secure_boot: efi && /<loader[^>]*secure=['"]yes['"]/.test(domainXml),
    cpu: { count: vcpus > 0 ? vcpus : 1, cores_per_socket: 1 },
    memory_bytes: kib ? kib * 1024 : 0,
    disks: job.progress.disks.map((d) => ({
      label: d.label,
      capacity_bytes: d.capacity_bytes,
      disk_format: 'raw',
      source: { path: '' },
      controller: 'virtio',
      address: '',
    })) as unknown as VmManifest['disks'],
    nics: [...domainXml.matchAll(/<interface\b[\s\S]*?<\/interface>/g)].map((m, i) => ({
      label: `nic${i}`,
      mac: /<mac address=['"]([0-9a-fA-F:]{17})['"]/.exec(m[0])?.[1] ?? null,
      model: /<model type=['"]([\w-]+)['"]/.exec(m[0])?.[1] ?? 'virtio',
      network: null,
    })),
    cbt_available: false,
    warnings: [],
  }
}

/**
 * Input of {@link runTestBoot}.
 * - `job`, `manifest`: the job and its source manifest (disks in order; NICs are kept only when
 *   the plan has checks, on the test boot's isolated network).
 * - `clone`: the sink's clone of the job's volumes.
 * - `virsh`, `domainType`, `nvramDir`: as for the real start.
 * - `serialLogPath`: the clone's serial log (truncated at start; kept after the test boot).
 * - `bootCheck`: the real start's boot check settings.
 * - `signal`: ends the test boot as `cancelled`; `signal.reason` (a string) is the recorded why.
 * - `record`: persists the record (and publishes the job); awaited.
 * - `inspectGuest`: the inspection (default libguestfs'); given the raw disks it reads.
 */
export interface TestBootInput {
  job: Job
  manifest: VmManifest
  clone: VolumeClone
  virsh: Virsh
  domainType: 'kvm' | 'qemu'
  serialLogPath: string
  bootCheck: StartBootCheck
  nvramDir?: string
  signal: AbortSignal
  now(): Date
  record(r: TestBootRecord): Promise<void>
  inspectGuest?: typeof realInspect
  /** Called once the clone exists (a warm job's next delta pass may then run). */
  onCloned?(): void
  /** How long each of the plan's checks is retried after the boot (s, default 120). */
  checkSeconds?: number
}

/** Why `signal` ended the test boot, in words. */
function abortReason(signal: AbortSignal): string {
  return typeof signal.reason === 'string' ? signal.reason : 'cancelled'
}

/**
 * Runs one test boot (see the module comment) and returns its final record. Never throws; the
 * record says `passed` (the boot check passed: `verified` when evidence proved the boot), `failed`
 * (`error`: why, with the hardware and serial tail when the guest was started) or `cancelled`.
 */
export async function runTestBoot(input: TestBootInput): Promise<TestBootRecord> {
  const { job, manifest, clone, virsh, signal } = input
  const started = input.now()
  const name = testBootDomainName(job, manifest.name)
  let rec: TestBootRecord = {
    state: 'running',
    requested_at: job.test_boot?.requested_at ?? started.toISOString(),
    started_at: started.toISOString(),
    finished_at: null,
    seconds: null,
    verified: false,
    evidence: null,
    domain: name,
    clone: clone.kind,
    hardware: null,
    serial_tail: [],
    error: null,
    notice: null,
  }
  const save = async (patch: Partial<TestBootRecord>) => {
    rec = { ...rec, ...patch }
    await input.record(rec)
  }
  const finish = async (patch: Partial<TestBootRecord>) => {
    const end = input.now()
    const tail = await serialTail(input.serialLogPath, 20)
    await save({ finished_at: end.toISOString(), seconds: Math.round((end.getTime() - started.getTime()) / 100) / 10, serial_tail: tail, ...patch })
  }
  let cloned = false
  let net: TestBootNetwork | null = null
  const checks = job.plan.checks?.length ? job.plan.checks : null
  let outcome: Partial<TestBootRecord>
  try {
    await save({})
    // a stale domain of an interrupted test boot of this job (never another's: see cleanupTestBoot)
    await cleanupTestBoot(virsh, name, job.id, null, !!checks)
    if (signal.aborted) throw new MigError('E_MIG_CANCELLED', abortReason(signal))
    const disks = await clone.take(manifest.disks.map((d) => d.label))
    cloned = true
    input.onCloned?.()
    const backingOf = new Map(disks.map((d) => [d.path, d.backing ?? d.path]))
    const inspect = input.inspectGuest ?? realInspect
    // The source still runs with the same MAC and IP addresses: the clone's NICs are never on the
    // plan's bridges; with checks they are on the isolated network, else there is none.
    if (checks) net = await createTestBootNetwork(virsh, job.id)
    const result = await defineAndStart({
      virsh,
      manifest: { ...manifest, nics: net ? manifest.nics : [] },
      // interface names pinned as on the real start; the addresses are probed by the checks only
      network: net ? { addressCheck: false } : false,
      plan: { name, guest_os: job.plan.guest_os, firmware: job.plan.firmware, start: true, ...(checks ? { checks } : {}) },
      volumes: disks.map((d) => ({ label: d.label, path: d.path, format: d.format })),
      domainType: input.domainType,
      defaultBridge: net?.names.bridge ?? null,
      checkNetwork: net?.checks,
      checkSeconds: input.checkSeconds,
      serialLogPath: input.serialLogPath,
      nvramDir: input.nvramDir,
      bootCheck: input.bootCheck,
      // A fresh overlay reads as its backing, and the job does not write the backing while the
      // overlay exists: the raw volume is inspected (read-only), as libguestfs' probe reads raw disks.
      inspectGuest: (paths, opts) =>
        inspect(
          paths.map((p) => backingOf.get(p) ?? p),
          opts,
        ),
      // another domain holds the name: never renamed, never taken over
      rename: async () => {
        throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', `a domain named ${name} exists and is not this job's test boot: remove or rename it`)
      },
      signal,
    })
    outcome = {
      state: 'passed',
      verified: result.boot?.verified ?? false,
      evidence: result.boot?.evidence ?? null,
      hardware: result.hardware,
      notice: result.notice,
    }
  } catch (e) {
    const err = e instanceof MigError ? e : new MigError('E_MIG_INTERNAL', (e as Error).message)
    if (signal.aborted || err.code === 'E_MIG_CANCELLED') outcome = { state: 'cancelled', error: abortReason(signal) }
    else {
      const hw = (err.details?.hardware ?? null) as TestBootRecord['hardware']
      const why = typeof err.details?.why === 'string' ? err.details.why : null
      // a boot verified before a check failed stays verified: the error names the check
      const booted = hw?.boot?.verified === true
      outcome = { state: 'failed', error: `${err.code}: ${err.message}`, hardware: hw, verified: booted, evidence: booted ? hw!.boot!.evidence : why }
    }
  }
  // the domain, its network and the clone are gone before the record says the test boot ended
  try {
    await cleanupTestBoot(virsh, name, job.id, cloned ? clone : null, !!net || !!checks)
  } catch (e) {
    outcome.error = `${outcome.error ? `${outcome.error}; ` : ''}removing the test boot's domain or clone failed: ${(e as Error).message}`
  }
  try {
    await finish(outcome)
  } catch {
    /* the store failed: the caller logs the returned record */
  }
  return rec
}

/**
 * Removes the test boot domain `name` of job `jobId` (`virsh destroy`, `virsh undefine --nvram`),
 * with `network` its isolated network (lib/domain/test-boot-network.ts; after the domain, whose
 * NICs are on it) and, when given, its clone. A domain of that name whose definition does not name
 * the job (its disks are the job's clone: the job id is in their paths) is another's and left
 * alone. Safe to repeat and after a crash: what does not exist is skipped. Throws the first
 * failure (`E_MIG_GUEST_BOOT_FAILED`, `E_MIG_DOMAIN_DEFINE_FAILED`, `E_MIG_DISK_WRITE_FAILED`)
 * after trying every step.
 */
export async function cleanupTestBoot(virsh: Virsh, name: string, jobId: string, clone: VolumeClone | null, network = true): Promise<void> {
  if (!name.endsWith(TEST_BOOT_SUFFIX)) throw new MigError('E_MIG_INTERNAL', `refusing to remove ${name}: not a test boot domain`)
  const xml = await virsh.run(['dumpxml', '--domain', name])
  const ours = xml.code === 0 && xml.stdout.includes(jobId)
  let first: unknown = null
  const steps = [
    ...(ours ? [() => virsh.destroy(name), () => virsh.undefine(name)] : []),
    ...(network ? [() => removeTestBootNetwork(virsh, jobId)] : []),
    () => clone?.remove(),
  ]
  for (const step of steps) {
    try {
      await step()
    } catch (e) {
      first ??= e
    }
  }
  if (first) throw first
}
