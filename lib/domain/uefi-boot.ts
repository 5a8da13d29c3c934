/**
 * How a UEFI guest finds its boot loader on the destination (README "Boot check", docs/boot-check.md).
 *
 * A UEFI guest installed by a distribution boots through a boot entry in its firmware's NVRAM
 * (`Boot0001` -> `\EFI\debian\shimx64.efi`). That entry lived in the source hypervisor's NVRAM
 * (VMware's `.nvram` file), which the migrator does not carry over (a libvirt source's `<nvram>`
 * is carried: lib/domain/start.ts, then none of this applies): OVMF starts from the VARS
 * template and only knows the removable-media path `\EFI\BOOT\BOOTX64.EFI`. Without it the guest
 * stops at OVMF's UEFI Shell.
 *
 * The destination volume's EFI system partition therefore gets the fallback loader when it lacks
 * one: the files of the guest's own loader directory (`\EFI\<vendor>\`) are copied to `\EFI\BOOT\`
 * and its loader to `\EFI\BOOT\BOOTX64.EFI` (what `grub-install --removable` and Windows' own
 * `\EFI\Boot\bootx64.efi` copy do). Shim wins over GRUB (secure boot: shim is the signed first
 * stage and loads `grubx64.efi` from its own directory); shim's fallback `fbx64.efi` is not copied
 * (it would rewrite NVRAM entries and reset the guest). The writes go through mtools straight into
 * the FAT at its offset on the destination volume (raw file or block device): never the source.
 *
 * Why not an NVRAM boot entry: writing `Boot####`/`BootOrder` into an OVMF variable store needs a
 * maintained variable-store editor (`virt-fw-vars` of python3-virt-firmware), which Debian 12 does
 * not package; a hand-written editor of the authenticated variable store format is not worth its
 * risk when the removable path, which every UEFI firmware honours, does the same.
 */
import { mkdtemp, readdir, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { exec } from '../exec.ts'
import type { UefiBootRecord } from '../job.ts'
import type { EspInfo } from './inspect.ts'

export type { UefiBootRecord }

/** What {@link planUefiBoot} decided: the record and, for `fallback-installed`, what to copy. */
export interface UefiBootPlan {
  record: UefiBootRecord
  copy: { esp: EspInfo; dir: string; loader: string } | null
}

const REMOVABLE = /^\/efi\/boot\/bootx64\.efi$/i
/** Loader names in order of preference (shim first: the signed first stage under secure boot). */
const PREFERRED = [/^shimx64\.efi$/i, /^grubx64\.efi$/i, /^bootmgfw\.efi$/i]
const backslash = (p: string) => p.replace(/\//g, '\\')

/** Decides how OVMF will find the loader of a guest whose ESPs are `esps` (see the module comment). Pure. */
export function planUefiBoot(esps: EspInfo[]): UefiBootPlan {
  for (const esp of esps) {
    const found = esp.loaders.find((l) => REMOVABLE.test(l))
    if (found) {
      return {
        record: {
          method: 'removable-path',
          loader: backslash(found),
          detail: `the EFI system partition ${esp.device} has the removable-path loader ${backslash(found)}`,
        },
        copy: null,
      }
    }
  }
  for (const re of PREFERRED) {
    for (const esp of esps) {
      const loader = esp.loaders
        .filter((l) => !/^\/efi\/boot\//i.test(l) && re.test(path.posix.basename(l)))
        .sort()
        .at(0)
      if (!loader) continue
      return {
        record: {
          method: 'fallback-installed',
          loader: backslash(loader),
          detail:
            `the EFI system partition ${esp.device} has ${backslash(loader)} but no \\EFI\\BOOT\\BOOTX64.EFI (its boot entry was in the source's NVRAM): ` +
            `${backslash(path.posix.dirname(loader))}\\ copied to \\EFI\\BOOT\\ and ${backslash(loader)} to \\EFI\\BOOT\\BOOTX64.EFI on the destination volume`,
        },
        copy: { esp, dir: path.posix.dirname(loader), loader },
      }
    }
  }
  const all = esps.flatMap((e) => e.loaders)
  return {
    record: {
      method: 'none',
      loader: null,
      detail: esps.length
        ? `no boot loader on the EFI system partition${esps.length > 1 ? 's' : ''} ${esps.map((e) => e.device).join(', ')}${all.length ? ` (only ${all.map(backslash).join(', ')})` : ''}`
        : 'the guest has no EFI system partition (no FAT file system)',
    },
    copy: null,
  }
}

async function mtools(cmd: string, args: string[], signal?: AbortSignal): Promise<void> {
  const r = await exec(cmd, args, { timeoutMs: 120_000, signal, env: { ...process.env, MTOOLS_SKIP_CHECK: '1', LC_ALL: 'C' } })
  if (r.code !== 0) {
    throw new MigError(
      'E_MIG_GUEST_BOOT_FAILED',
      `${cmd} ${args.join(' ')}: ${(r.spawnError?.message ?? r.stderr).trim().slice(0, 500) || `exit status ${r.code}`}`,
    )
  }
}

/**
 * Installs the fallback loader {@link planUefiBoot} chose on `volume` (the destination disk that
 * holds the ESP: raw file or block device; `format` as qemu opens it), through mtools at the
 * ESP's offset. Returns the record. Throws `E_MIG_GUEST_BOOT_FAILED` naming the mtools command
 * and its error (a FAT mtools cannot write, mtools missing), or when `format` is not `raw` (a
 * test boot's qcow2 overlay: mtools reads and writes raw bytes only); `E_MIG_CANCELLED` when
 * `signal` aborts.
 */
export async function installFallbackLoader(
  plan: UefiBootPlan,
  volume: string,
  signal?: AbortSignal,
  format: 'raw' | 'qcow2' = 'raw',
): Promise<UefiBootRecord> {
  if (!plan.copy) return plan.record
  if (format !== 'raw') {
    throw new MigError(
      'E_MIG_GUEST_BOOT_FAILED',
      `the ESP has no \\EFI\\BOOT\\BOOTX64.EFI and its disk ${volume} is a ${format} image, which the fallback loader cannot be written to (the real start writes it on the raw volume)`,
    )
  }
  const { esp, dir, loader } = plan.copy
  const img = `${volume}@@${esp.offsetBytes}`
  const work = await mkdtemp(path.join(tmpdir(), 'mig-esp-'))
  try {
    // `mcopy -s` of the loader's directory, then each of its files (no subdirectories) into \EFI\BOOT.
    await mtools('mcopy', ['-i', img, '-s', '-n', '-p', `::${dir}`, work], signal)
    if (signal?.aborted) throw new MigError('E_MIG_CANCELLED', 'cancelled while installing the UEFI fallback loader')
    const local = path.join(work, path.posix.basename(dir))
    const entries = await readdir(local, { withFileTypes: true })
    await mtools('mmd', ['-i', img, '-D', 's', '::/EFI/BOOT'], signal).catch(() => undefined)
    for (const e of entries) {
      if (!e.isFile() || /^fb[a-z0-9]*\.efi$/i.test(e.name)) continue
      const target = e.name.toLowerCase() === path.posix.basename(loader).toLowerCase() ? 'BOOTX64.EFI' : e.name
      await mtools('mcopy', ['-i', img, '-o', '-n', path.join(local, e.name), `::/EFI/BOOT/${target}`], signal)
    }
    return plan.record
  } finally {
    await rm(work, { recursive: true, force: true })
  }
}
