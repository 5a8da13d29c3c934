/**
 * The Starting state (spec 1.2 step 4, spec 3, DESIGN.md section 6): pick a free domain name, build
 * the domain XML, `virsh define`, `virsh start` (unless `plan.start === false`: define only), then
 * the boot check.
 *
 * Failure after define: the domain is left **defined but stopped** (a failed `start` leaves it shut
 * off; a failed boot check destroys it first), so the operator can inspect the definition and the
 * serial log; the orchestrator decides whether to undefine it (`Virsh.undefine`). The disks are never
 * touched here. The thrown error's `details.domain` names the domain.
 */
import { constants } from 'node:fs'
import { open, stat, writeFile } from 'node:fs/promises'
import { randomUUID } from 'node:crypto'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import type { VmManifest } from '../manifest.ts'
import { checkBoot, type BootCheckResult } from './boot-check.ts'
import type { Virsh } from './virsh.ts'
import { buildDomainXml, debianOvmf, sanitizeDomainName, type DomainPlanOverrides, type DomainVolume, type NicModel, type OvmfPaths } from './xml.ts'

/** Boot check parameters (see `checkBoot`); seconds. */
export interface StartBootCheck {
  graceSeconds: number
  timeoutSeconds: number
  expectSerial?: RegExp
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
 * - `bootCheck`: default grace 10 s, timeout 120 s, no serial pattern.
 */
export interface DefineAndStartInput {
  virsh: Virsh
  manifest: VmManifest
  plan?: DomainPlanOverrides & { start?: boolean }
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
}

/** Outcome: the final domain `name`, its `uuid` and `xml`, whether it was started, and the boot check result. */
export interface DefineAndStartResult {
  name: string
  uuid: string
  xml: string
  started: boolean
  boot: BootCheckResult | null
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
 * Defines and (unless `plan.start === false`) starts the imported VM, then runs the boot check.
 * The name is `plan.name` or the sanitized manifest name, made unique with `-2`, `-3`, ... when taken.
 * Throws `E_MIG_DOMAIN_DEFINE_FAILED` (name, XML or define), `E_MIG_GUEST_BOOT_FAILED` (start or boot
 * check; domain left defined and stopped), `E_MIG_CANCELLED` (signal during the boot check; domain
 * destroyed, still defined).
 */
export async function defineAndStart(input: DefineAndStartInput): Promise<DefineAndStartResult> {
  const { virsh, manifest, plan } = input
  const name = await virsh.uniqueName(sanitizeDomainName(plan?.name ?? manifest.name))
  const uuid = input.uuid ?? randomUUID()
  const volumes = await probeVolumes(input.volumes)
  const firmware = plan?.firmware ?? manifest.firmware
  const secureBoot = firmware === 'efi' && manifest.secure_boot
  const nvram = path.join(input.nvramDir ?? '/var/lib/libvirt/qemu/nvram', `${name}_VARS.fd`)
  const ovmf = firmware === 'efi' ? (input.ovmf ? input.ovmf(name, secureBoot) : debianOvmf(secureBoot, nvram)) : undefined
  const xml = buildDomainXml({
    manifest,
    plan: { ...plan, name },
    volumes,
    uuid,
    domainType: input.domainType,
    defaultBridge: input.defaultBridge,
    ovmf,
    serialLogPath: input.serialLogPath,
    nicModel: input.nicModel,
  })
  const defined = await virsh.define(xml)
  if (defined && defined !== name) {
    throw new MigError('E_MIG_DOMAIN_DEFINE_FAILED', `libvirt defined ${defined}, expected ${name}`, { details: { domain: defined } })
  }
  if (plan?.start === false) return { name, uuid, xml, started: false, boot: null }

  try {
    await writeFile(input.serialLogPath, '', { mode: 0o640 })
  } catch (e) {
    throw new MigError('E_MIG_GUEST_BOOT_FAILED', `serial log ${input.serialLogPath}: ${(e as Error).message}`, { details: { domain: name } })
  }
  try {
    await virsh.start(name)
  } catch (e) {
    const err = e as MigError
    throw new MigError(err.code ?? 'E_MIG_GUEST_BOOT_FAILED', err.message, { details: { domain: name, defined: true }, cause: e })
  }
  const bc = input.bootCheck ?? { graceSeconds: 10, timeoutSeconds: 120 }
  try {
    const boot = await checkBoot({
      virsh,
      name,
      graceSeconds: bc.graceSeconds,
      timeoutSeconds: bc.timeoutSeconds,
      expectSerial: bc.expectSerial,
      serialLogPath: input.serialLogPath,
      signal: input.signal,
    })
    return { name, uuid, xml, started: true, boot }
  } catch (e) {
    await virsh.destroy(name).catch(() => undefined)
    throw e
  }
}
