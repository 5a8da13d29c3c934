/**
 * The Starting state (spec 1.2 step 4, spec 3, DESIGN.md section 6): pick a free domain name,
 * inspect the copied guest read-only (lib/domain/inspect.ts) and choose the hardware it boots on
 * (lib/domain/hardware.ts), build the domain XML, `virsh define`, `virsh start` (unless
 * `plan.start === false`: define only), then the evidence-based boot check.
 *
 * A fatal static finding (root file system UUID that does not exist, no driver for any disk
 * controller) fails with `E_MIG_GUEST_BOOT_FAILED` right after define, without starting; a Linux
 * guest whose only fault is the missing driver is first converted (`convertGuest`), if given.
 *
 * Failure after define: the domain is left **defined but stopped** (a failed `start` leaves it shut
 * off; a failed boot check destroys it first), so the operator can inspect the definition and the
 * serial log; the orchestrator decides whether to undefine it (`Virsh.undefine`). The disks are
 * touched only by `convertGuest`, by the guest conversion steps before the define (names by device
 * rewritten to `UUID=`, lib/domain/device-names.ts; interface names pinned, lib/domain/net-identity.ts;
 * both put back when the define fails) and, for a UEFI guest whose EFI system partition lacks the
 * removable-path loader, by the fallback loader copied into that ESP (lib/domain/uefi-boot.ts:
 * OVMF does not have the source's NVRAM boot entry). After the boot, the plan's service checks
 * (lib/domain/service-checks.ts) run against the guest's addresses. The thrown error's
 * `details.domain` names the domain.
 */
import { constants } from 'node:fs'
import { mkdir, open, stat, writeFile } from 'node:fs/promises'
import { createHash, randomUUID } from 'node:crypto'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import type { VmManifest } from '../manifest.ts'
import type { BootEvidenceSource, CarriedInterface, HardwareRecord, NvramRecord } from '../job.ts'
import type { CarriedNvram } from '../adapters/types.ts'
import { checkBoot, type BootCheckResult } from './boot-check.ts'
import { screenReader, type ScreenReader } from './screen.ts'

import { installFallbackLoader, planUefiBoot, type UefiBootRecord } from './uefi-boot.ts'
import { chooseHardware, recordOfBus, type HardwareChoice } from './hardware.ts'
import { inspectGuest, type GuestInspection } from './inspect.ts'
import { checkAddresses } from './address-check.ts'
import { restoreGuestFiles, writeGuestFiles, type GuestFilesUndo } from './guest-files.ts'
import { destinationNics, planNetworkIdentity } from './net-identity.ts'
import { planGuestDeviceNames } from './device-names.ts'
import { type CheckNetwork, checkTargets, checkVerdict, runServiceChecks, type ServiceCheck, type ServiceCheckResult } from './service-checks.ts'
import { normalizeMac } from '../mac.ts'
import type { Virsh } from './virsh.ts'
import {
  buildDomainXml,
  debianOvmf,
  effectiveGuestFamily,
  sanitizeDomainName,
  type DomainPlanOverrides,
  type DomainVolume,
  type NicModel,
  type OvmfPaths,
} from './xml.ts'

/** When the boot check looks at the second virtual console: the screen unchanged for `quietMs`, at most once per `everyMs`. */
const SECOND_CONSOLE_PACE = { quietMs: 20_000, everyMs: 60_000 }

/** Boot check parameters (see `checkBoot`); seconds. */
export interface StartBootCheck {
  graceSeconds: number
  timeoutSeconds: number
  expectSerial?: RegExp
  readScreen?: boolean
}

/**
 * Input of {@link defineAndStart}.
 * - `virsh`: the libvirt client (config `libvirtUri`).
 * - `plan`: the plan's `name`, `guest_os`, `firmware`, `networks` and `start`.
 * - `volumes`: destination volumes in manifest disk order (see `DomainVolume`); `kind` and
 *   `directIo` are probed when not given (fs.stat; an O_DIRECT open for files).
 * - `serialLogPath`: created empty (truncated) before the domain starts, so an old boot's output
 *   can never satisfy the boot check.
 * - `nvramDir`: where UEFI NVRAM files go (`<dir>/<name>_VARS.fd`), default
 *   `/var/lib/libvirt/qemu/nvram`; `ovmf` picks other OVMF images (given the final name).
 * - `nvram`: the source's UEFI variable store (a live source's `readNvram`): written as the
 *   domain's NVRAM file once the domain is defined (libvirt copies the template only when that file
 *   is missing), so the guest's boot entries travel and no fallback loader is written to its ESP;
 *   not carried (recorded why) when its size is not the destination VARS template's (a store of
 *   another flash size than the OVMF code image) or the firmware is BIOS. Removed with the domain
 *   (`virsh undefine --nvram`).
 * - `bootCheck`: default grace 10 s, timeout 120 s, no serial pattern; `readScreen: false` turns
 *   the screen evidence off (default on: `virsh screenshot` + Tesseract, lib/domain/screen.ts).
 * - `inspect`: inspect the guest with libguestfs (`tcg`: force its appliance onto TCG), or `false`
 *   to skip it (family defaults). Default: inspect with `tcg` when `domainType` is `qemu`.
 * - `inspectGuest`: the inspection function (tests may pass a double; default the libguestfs one).
 * - `convertGuest`: converts the volumes in place (virt-v2v-in-place) when the inspection finds a
 *   Linux guest whose only fault is a missing controller driver (`HardwareChoice.convertible`);
 *   the guest is then inspected again and attached on what it has after the conversion. Without
 *   it such a guest is refused before its start (the fix named). Throws what the converter throws
 *   (`E_MIG_V2V_FAILED`, volumes rolled back; `E_MIG_CANCELLED`).
 * - `network`: carry the guest's network identity over (docs/network-identity.md; default on
 *   when the guest is inspected): `.link` files written into the guest on the volumes after the
 *   inspection (and conversion) and before the define, put back when the define fails or the
 *   guest turns out unbootable; `addressCheckSeconds` (default 60) bounds the check of the
 *   configured addresses after a verified boot; `addressCheck: false` skips that check (a test
 *   boot's NICs are on a bridge the host has no address on). `false` skips both. `writeGuestFiles`
 *   replaces the libguestfs writer (tests).
 * - `checkNetwork`: run the plan's checks from that network instead of this host's (a test boot's
 *   isolated network, lib/domain/test-boot-network.ts): the guest's static addresses are made
 *   reachable there first.
 * - `rename`: when libvirt refuses the name as taken ("already exists"), picks and records another
 *   given the names libvirt has now (lib/jobs/reserve.ts: the store's reservation, so the name is
 *   also free of every other active job's); default {@link Virsh.uniqueName}'s `-2`, `-3`, ... of
 *   the name. At most {@link RENAME_ATTEMPTS} defines in all.
 */
export interface DefineAndStartInput {
  virsh: Virsh
  manifest: VmManifest
  plan?: DomainPlanOverrides & { start?: boolean; checks?: ServiceCheck[] }
  volumes: DomainVolume[]
  domainType: 'kvm' | 'qemu'
  defaultBridge: string | null
  serialLogPath: string
  nicModel?: NicModel
  nvramDir?: string
  ovmf?: (name: string, secureBoot: boolean) => OvmfPaths
  bootCheck?: StartBootCheck
  uuid?: string
  signal?: AbortSignal
  inspect?: { tcg: boolean } | false
  inspectGuest?: typeof inspectGuest
  convertGuest?: (paths: string[], signal?: AbortSignal) => Promise<void>
  rename?: (taken: ReadonlySet<string>) => Promise<string>
  network?: { addressCheckSeconds?: number; addressCheck?: boolean } | false
  writeGuestFiles?: typeof writeGuestFiles
  checkNetwork?: CheckNetwork
  /** How long each of `plan.checks` is retried after the boot (s, default 120). */
  checkSeconds?: number
  nvram?: CarriedNvram
}

/** Defines tried with a fresh name after libvirt answered "already exists" (see `rename`). */
const RENAME_ATTEMPTS = 5

/**
 * Outcome: the final domain `name`, its `uuid` and `xml`, whether it was started, the boot check
 * result, the hardware record for the job (with the boot verdict), the inspection, and `notice`:
 * the reason a started guest's boot is not verified (null when verified or not started), and
 * `networkNotice`: the configured interfaces of the guest not carried over, in words (null: none).
 */
export interface DefineAndStartResult {
  name: string
  uuid: string
  xml: string
  started: boolean
  boot: BootCheckResult | null
  hardware: HardwareRecord
  inspection: GuestInspection | null
  notice: string | null
  networkNotice: string | null
}

function record(
  choice: HardwareChoice,
  inspection: GuestInspection | null,
  boot: HardwareRecord['boot'],
  uefiBoot: UefiBootRecord | null,
  network: HardwareRecord['network'] = null,
  nvram: NvramRecord | null = null,
): HardwareRecord {
  return {
    disk_bus: choice.disk_bus,
    nic_model: choice.nic_model,
    firmware: choice.firmware,
    reason: choice.reason,
    inspected: !!inspection?.inspected,
    boot,
    ...(choice.firmware === 'efi' ? { uefi_boot: uefiBoot } : {}),
    ...(nvram ? { nvram } : {}),
    network,
  }
}

/** The host bridge of each NIC by MAC, as buildDomainXml attaches it (`plan.networks`, else the default bridge). */
function bridgesByMac(manifest: VmManifest, plan: DomainPlanOverrides | undefined, defaultBridge: string | null): Map<string, string> {
  const bridgeOf = new Map<string, string>()
  for (const m of plan?.networks ?? []) if (!bridgeOf.has(m.source)) bridgeOf.set(m.source, m.bridge)
  const out = new Map<string, string>()
  for (const nic of manifest.nics) {
    const mac = normalizeMac(nic.mac)
    const bridge = (nic.network !== null ? bridgeOf.get(nic.network) : undefined) ?? defaultBridge
    if (mac && bridge && !out.has(mac)) out.set(mac, bridge)
  }
  return out
}

/** Whether `file` can be opened with O_DIRECT (qemu's `cache='none'`); false on tmpfs and some FUSE file systems. */
export async function supportsDirectIo(file: string): Promise<boolean> {
  const flag = (constants as Record<string, number>).O_DIRECT
  if (!flag) return false
  try {
    const fh = await open(file, constants.O_RDONLY | flag)
    await fh.close()
    return true
  } catch {
    return false
  }
}

/** Fills `kind` (block device or file) and `directIo` of each volume. Throws `E_MIG_DOMAIN_DEFINE_FAILED` for a missing volume. */
export async function probeVolumes(volumes: DomainVolume[]): Promise<DomainVolume[]> {
  const out: DomainVolume[] = []
  for (const v of volumes) {
    let st
    try {
      st = await stat(v.path)
    } catch (e) {
      throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', `volume ${v.label}: ${v.path}: ${(e as Error).message}`)
    }
    const kind = v.kind ?? (st.isBlockDevice() ? 'block' : 'file')
    const directIo = v.directIo ?? (kind === 'block' ? true : await supportsDirectIo(v.path))
    out.push({ ...v, kind, directIo })
  }
  return out
}

/**
 * Writes the source's variable store `carried` as the NVRAM file of domain `name` (`ovmf.nvram`,
 * mode 0600; libvirt labels it for qemu at the start) when it fits the destination's OVMF: the
 * same size as `ovmf.varsTemplate` (a flash image of another size does not match the code image).
 * Returns the record; `carried: false` with the reason when it does not fit or the domain is BIOS.
 * Throws `E_MIG_DOMAIN_DEFINE_FAILED` naming the file when it cannot be written (the domain is
 * defined: `details.domain`).
 */
async function carryNvram(carried: CarriedNvram, ovmf: OvmfPaths | undefined, name: string): Promise<NvramRecord> {
  const base = {
    source_path: carried.source_path,
    bytes: carried.bytes.length,
    sha256: createHash('sha256').update(carried.bytes).digest('hex'),
  }
  if (!ovmf) return { ...base, carried: false, path: null, detail: 'the domain boots with BIOS (the plan chose it): the UEFI variable store is not used' }
  let templateSize: number | null = null
  try {
    templateSize = (await stat(ovmf.varsTemplate)).size
  } catch {
    // no template to compare with: the store is written as it is
  }
  if (templateSize !== null && templateSize !== carried.bytes.length) {
    return {
      ...base,
      carried: false,
      path: null,
      detail: `the source's variable store is ${carried.bytes.length} bytes and this host's OVMF variable store ${ovmf.varsTemplate} ${templateSize} (another flash size): the domain starts with a fresh store and its boot entries do not travel`,
    }
  }
  try {
    await mkdir(path.dirname(ovmf.nvram), { recursive: true, mode: 0o755 })
    await writeFile(ovmf.nvram, carried.bytes, { mode: 0o600 })
  } catch (e) {
    throw new MigError(
      'E_MIG_DOMAIN_DEFINE_FAILED',
      `domain ${name}: writing its NVRAM ${ovmf.nvram}: ${(e as Error).message}; check that the directory exists and is writable`,
      {
        details: { domain: name, defined: true },
      },
    )
  }
  return { ...base, carried: true, path: ovmf.nvram, detail: `the source's UEFI variable store ${carried.source_path} is the domain's NVRAM ${ovmf.nvram}` }
}

/**
 * Defines and (unless `plan.start === false`) starts the imported VM, then runs the boot check.
 * The name is `plan.name` or the sanitized manifest name, made unique with `-2`, `-3`, ... when taken.
 * Throws `E_MIG_DOMAIN_DEFINE_FAILED` (name, XML or define), `E_MIG_GUEST_BOOT_FAILED` (start or boot
 * check; domain left defined and stopped), `E_MIG_CANCELLED` (signal during the boot check; domain
 * destroyed, still defined).
 */
export async function defineAndStart(input: DefineAndStartInput): Promise<DefineAndStartResult> {
  const { virsh, manifest, plan } = input
  const base = sanitizeDomainName(plan?.name ?? manifest.name)
  const uuid = input.uuid ?? randomUUID()
  const probed = await probeVolumes(input.volumes)
  const family = effectiveGuestFamily(manifest, plan)
  const inspectOpt = input.inspect ?? { tcg: input.domainType === 'qemu' }
  const paths = probed.map((v) => v.path)
  const inspect = async (): Promise<GuestInspection | null> => {
    const found =
      family === 'windows' || inspectOpt === false ? null : await (input.inspectGuest ?? inspectGuest)(paths, { tcg: inspectOpt.tcg, signal: input.signal })
    if (input.signal?.aborted) throw new MigError('E_MIG_CANCELLED', 'cancelled during the guest inspection')
    return found
  }
  let inspection = await inspect()
  const firmwareChoice = { plan: plan?.firmware, manifest: manifest.firmware }
  let choice = chooseHardware(inspection, family, firmwareChoice)
  if (choice.fatal && choice.convertible && input.convertGuest) {
    // No controller qemu emulates can boot the guest as it is: convert it, then look again.
    const before = choice.fatal
    await input.convertGuest(paths, input.signal)
    inspection = await inspect()
    choice = chooseHardware(inspection, family, firmwareChoice)
    choice = { ...choice, reason: `converted with virt-v2v-in-place because ${before}; after the conversion: ${choice.reason}` }
  }
  const forced = probed[0]?.bus
  if (forced && forced !== choice.bus) {
    // The caller's bus (e.g. virtio after V2V) wins; the record says what the domain really has.
    const scsiModel = forced === 'scsi' ? 'virtio-scsi' : null
    choice = {
      ...choice,
      bus: forced,
      scsiModel,
      disk_bus: recordOfBus(forced, scsiModel),
      reason: `disk bus ${recordOfBus(forced, scsiModel)} set by the caller (the inspection chose ${choice.disk_bus}); ${choice.reason}`,
    }
  }
  // Guest conversion steps on the destination volumes (nothing is written when the guest cannot
  // boot): names by device that the destination's bus breaks become UUID= (lib/domain/device-names.ts),
  // and the names the network configuration uses are pinned to the NICs' MACs. One read-write
  // session for both, undone together.
  let network: HardwareRecord['network'] = null
  let networkProblems: string[] = []
  let undo: GuestFilesUndo | null = null
  const fileOpts = {
    mounts: inspection?.mounts ?? [],
    formats: probed.map((v) => v.format ?? 'raw'),
    tcg: inspectOpt !== false && inspectOpt.tcg,
    signal: input.signal,
  }
  const names = choice.fatal ? null : planGuestDeviceNames(inspection, choice.bus, paths.length)
  const planned =
    input.network !== false && inspection?.network && !choice.fatal ? planNetworkIdentity(inspection.network, destinationNics(manifest.nics)) : null
  if (planned) networkProblems = planned.problems
  const writes = [...(names?.plan.writes ?? []), ...(planned?.writes ?? [])]
  if (writes.length) {
    try {
      undo = await (input.writeGuestFiles ?? writeGuestFiles)(paths, writes, fileOpts)
      if (names?.plan.writes.length) names.record.written = true
    } catch (e) {
      if (e instanceof MigError && e.code === 'E_MIG_CANCELLED') throw e
      const msg = (e as Error).message
      if (planned) {
        const why = `writing its .link file failed: ${msg}`
        for (const r of planned.interfaces) if (r.how === 'link-file') Object.assign(r, { carried: false, how: null, link_file: null, why })
        if (planned.writes.length) networkProblems = [...networkProblems, `the interface names of the guest could not be pinned (${why})`]
      }
      if (names?.plan.writes.length) {
        names.record.error = msg
        networkProblems = [
          ...networkProblems,
          `the device names ${names.record.rewritten.map((c) => c.from).join(', ')} could not be rewritten to UUID= (${msg}); the guest may not find them on ${choice.disk_bus}`,
        ]
      }
    }
  }
  if (planned && inspection?.network) network = { interfaces: planned.interfaces, notes: inspection.network.notes }
  const deviceNames = names?.record ?? null
  const undoGuestFiles = async () => {
    if (undo) await restoreGuestFiles(paths, undo, fileOpts).catch(() => undefined)
    undo = null
  }
  const volumes = probed.map((v) => ({ ...v, bus: v.bus ?? choice.bus }))
  const firmware = choice.firmware
  const secureBoot = firmware === 'efi' && manifest.secure_boot
  const ovmfFor = (name: string): OvmfPaths | undefined => {
    const nvram = path.join(input.nvramDir ?? '/var/lib/libvirt/qemu/nvram', `${name}_VARS.fd`)
    return firmware === 'efi' ? (input.ovmf ? input.ovmf(name, secureBoot) : debianOvmf(secureBoot, nvram)) : undefined
  }
  const xmlFor = (name: string): string => {
    const ovmf = ovmfFor(name)
    return buildDomainXml({
      manifest,
      plan: { ...plan, name, firmware },
      volumes,
      uuid,
      domainType: input.domainType,
      defaultBridge: input.defaultBridge,
      ovmf,
      serialLogPath: input.serialLogPath,
      nicModel: input.nicModel ?? choice.nicModel,
      scsiModel: choice.scsiModel ?? undefined,
    })
  }
  // The name is tried as it is first (the job reserved it when it started); only when libvirt
  // refuses it as taken ("already exists") is a free one looked for (`rename`, else `-2`, `-3`,
  // ...): one virsh call in the usual case instead of a list and a define (a fixed cost of every
  // job). A name found free can be taken again before its define (another job's define,
  // whose reservation a stale list did not show): a few tries.
  let name = base
  let xml = ''
  let defined = ''
  try {
    xml = xmlFor(name)
    for (let attempt = 1; ; attempt++) {
      try {
        defined = await virsh.define(xml)
        break
      } catch (e) {
        if (!(e instanceof MigError && /already exists/i.test(e.message)) || attempt >= RENAME_ATTEMPTS) throw e
        name = input.rename ? await input.rename(new Set(await virsh.list())) : await virsh.uniqueName(base)
        xml = xmlFor(name)
      }
    }
  } catch (e) {
    // No domain: the guest goes back to how it was copied.
    await undoGuestFiles()
    throw e
  }
  if (defined && defined !== name) {
    await undoGuestFiles()
    throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', `libvirt defined ${defined}, expected ${name}`, { details: { domain: defined } })
  }
  // The source's variable store becomes the domain's NVRAM (written only now: before the define,
  // the file at that path may be another domain's of the same name).
  let nvramRecord: NvramRecord | null = null
  if (input.nvram) {
    const ovmf = ovmfFor(name)
    nvramRecord = await carryNvram(input.nvram, ovmf, name)
  }
  let uefiBoot: UefiBootRecord | null = null
  if (firmware === 'efi' && !choice.fatal && nvramRecord?.carried) {
    const found = inspection?.inspected ? planUefiBoot(inspection.esps) : null
    uefiBoot = {
      method: 'nvram-carried',
      loader: found?.copy?.loader ? found.copy.loader.replace(/\//g, '\\') : (found?.record.loader ?? null),
      detail: `the source's UEFI variable store ${nvramRecord.source_path} is the domain's NVRAM: OVMF boots the guest from its boot entries; nothing was written to the EFI system partition`,
    }
  } else if (firmware === 'efi' && !choice.fatal) {
    // OVMF starts without the source's NVRAM boot entries: the removable path must hold a loader.
    if (inspection?.inspected) {
      const uefi = planUefiBoot(inspection.esps)
      const volume = uefi.copy ? volumes[uefi.copy.esp.disk] : undefined
      try {
        uefiBoot = uefi.copy && volume ? await installFallbackLoader(uefi, volume.path, input.signal, volume.format) : uefi.record
      } catch (e) {
        const err = e as MigError
        throw new MigError(err.code ?? 'E_MIG_GUEST_BOOT_FAILED', `domain ${name}: installing the UEFI fallback loader failed: ${err.message}`, {
          details: { domain: name, defined: true, why: err.message },
          cause: e,
        })
      }
    } else {
      uefiBoot = { method: 'not-inspected', loader: null, detail: `the EFI system partition was not read (${inspection?.skipped ?? 'no inspection'})` }
    }
  }
  const networkNotice = networkProblems.length ? networkProblems.join('; ') : null
  if (network) {
    for (const r of network.interfaces)
      if (r.carried)
        r.address_evidence =
          plan?.start === false
            ? 'the domain was not started'
            : input.network && input.network.addressCheck === false
              ? 'not checked: the NIC is on an isolated network the host has no address on'
              : 'not checked yet: the boot check did not verify a boot'
  }
  const hardware = { ...record(choice, inspection, null, uefiBoot, network, nvramRecord), ...(deviceNames ? { device_names: deviceNames } : {}) }
  if (choice.fatal) {
    throw new MigError('E_MIG_GUEST_BOOT_FAILED', `domain ${name} cannot boot: ${choice.fatal} (static inspection; the domain is defined, not started)`, {
      details: { domain: name, defined: true, hardware, why: choice.fatal },
    })
  }
  if (plan?.start === false) return { name, uuid, xml, started: false, boot: null, hardware, inspection, notice: null, networkNotice }

  try {
    await writeFile(input.serialLogPath, '', { mode: 0o640 })
  } catch (e) {
    throw new MigError('E_MIG_GUEST_BOOT_FAILED', `serial log ${input.serialLogPath}: ${(e as Error).message}`, { details: { domain: name } })
  }
  try {
    await virsh.start(name)
  } catch (e) {
    const err = e as MigError
    throw new MigError(err.code ?? 'E_MIG_GUEST_BOOT_FAILED', err.message, { details: { domain: name, defined: true, hardware }, cause: e })
  }
  const bc = input.bootCheck ?? { graceSeconds: 10, timeoutSeconds: 120 }
  let screen: ScreenReader | undefined
  let checkResults: ServiceCheckResult[] | undefined
  try {
    screen = bc.readScreen === false ? undefined : await screenReader(virsh, name, `${input.serialLogPath}.screen`)
    // A Linux guest shows a login prompt (or its failure) on its screen even without a serial
    // console: with the screen read, wait for that evidence up to the timeout.
    const screenEvidence = !!screen && !screen.unavailable && inspection?.os?.type === 'linux'
    const boot = await checkBoot({
      virsh,
      name,
      graceSeconds: bc.graceSeconds,
      timeoutSeconds: bc.timeoutSeconds,
      expectSerial: bc.expectSerial,
      expectEvidence: choice.serialConsole || screenEvidence,
      screen,
      // OCR of a screen full of kernel messages costs a core for seconds, taken from a TCG guest:
      // a guest that writes its boot to the serial console has its screen read only now and then.
      screenEveryMs: choice.serialConsole ? 30_000 : 5_000,
      // A Linux guest judged by its screen alone: when tty1 went quiet without a prompt on it
      // (kernel messages written after getty's prompt scroll it off), look at tty2's getty.
      secondConsole: screenEvidence && !choice.serialConsole ? SECOND_CONSOLE_PACE : undefined,
      serialLogPath: input.serialLogPath,
      signal: input.signal,
    })
    const verdict = {
      verified: boot.verified,
      evidence: boot.evidence,
      source: boot.source,
      waited_seconds: Math.round(boot.waitedSeconds * 10) / 10,
      ...(boot.screenTail ? { screen_tail: boot.screenTail } : {}),
    }
    if (boot.verified && network && input.network !== false && input.network?.addressCheck !== false) {
      await checkAddresses(network.interfaces as CarriedInterface[], {
        bridgeOf: bridgesByMac(manifest, plan, input.defaultBridge),
        waitSeconds: input.network?.addressCheckSeconds ?? 60,
        signal: input.signal,
      })
    }
    // The plan's service checks: on the running domain, verified or not (an answering service is
    // evidence of its own).
    let checkNotice: string | null = null
    if (plan?.checks?.length) {
      const statics = (network?.interfaces ?? [])
        .filter((r) => r.carried && r.method === 'static')
        .map((r) => ({ name: r.name, addresses: r.addresses, seen: r.address_check === 'seen' }))
      const macs = manifest.nics.map((n) => normalizeMac(n.mac)).filter((m): m is string => !!m)
      const cn = input.checkNetwork
      const unreachable = cn ? await cn.reach(statics.flatMap((st) => st.addresses)) : []
      const targets = await checkTargets(statics, name, macs, virsh.uri, cn ? () => cn.neighbours() : undefined)
      checkResults = await runServiceChecks(plan.checks, targets, { waitSeconds: input.checkSeconds ?? 120, signal: input.signal, attempt: cn?.attempt })
      if (input.signal?.aborted) throw new MigError('E_MIG_CANCELLED', 'cancelled during the service checks')
      const v = checkVerdict(checkResults)
      const from = cn ? ` (checked from the ${cn.where}${unreachable.length ? `; ${unreachable.join('; ')}` : ''})` : ''
      if (v.failure)
        throw new MigError('E_MIG_GUEST_BOOT_FAILED', `domain ${name}: ${v.failure}${from}`, { details: { domain: name, why: `${v.failure}${from}`, verdict } })
      checkNotice = v.notice ? `${v.notice}${from}` : unreachable.length ? unreachable.join('; ') : null
    }
    const notices = [boot.verified ? null : `boot not verified: ${boot.evidence}`, checkNotice].filter((n): n is string => !!n)
    return {
      name,
      uuid,
      xml,
      started: true,
      boot,
      hardware: { ...hardware, boot: verdict, ...(checkResults ? { checks: checkResults } : {}) },
      inspection,
      notice: notices.length ? notices.join('; ') : null,
      networkNotice,
    }
  } catch (e) {
    await virsh.destroy(name).catch(() => undefined)
    if (e instanceof MigError && e.code === 'E_MIG_GUEST_BOOT_FAILED') {
      const why = typeof e.details?.why === 'string' ? e.details.why : e.message
      throw new MigError(
        e.code,
        `${e.message}\nhardware: disk bus ${hardware.disk_bus}, NIC ${hardware.nic_model}, ${hardware.firmware} (${hardware.reason})`,
        {
          details: {
            ...e.details,
            hardware: {
              ...hardware,
              ...(checkResults ? { checks: checkResults } : {}),
              boot: (e.details?.verdict as HardwareRecord['boot'] | undefined) ?? {
                verified: false,
                evidence: why,
                source: (e.details?.source as BootEvidenceSource | undefined) ?? null,
              },
            },
          },
          cause: e,
        },
      )
    }
    throw e
  } finally {
    await screen?.close()
  }
}
