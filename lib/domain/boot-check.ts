/**
 * The boot check of the Starting state (spec 1.2, DESIGN.md section 6). "Still running after a
 * grace period" is not evidence of a boot (a guest stuck in its initramfs shell stays `running`),
 * so the check decides from evidence:
 * - the domain state: any state but `running` fails; `crashed` / `shut off (crashed)` is a guest
 *   kernel panic reported through the domain's pvpanic device (or qemu died);
 * - the serial console log, classified by {@link classifySerial}: kernel panic, the initramfs
 *   shell, "Gave up waiting for root", emergency mode, GRUB rescue, OVMF's UEFI Shell / "No
 *   bootable option" fail at once; a `login:` prompt or systemd reaching the multi-user /
 *   graphical target prove a boot;
 * - the guest's screen (`screen`, lib/domain/screen.ts: `virsh screenshot` read by Tesseract OCR),
 *   classified by {@link classifyScreen} with the same rules: the evidence of a guest that does not
 *   write its boot to the serial console (the usual VMware guest). Read in the background every
 *   `screenEveryMs`, so a slow OCR never delays the serial and state checks;
 * - `expectSerial` (optional operator pattern, MIGRATOR_BOOT_SERIAL_PATTERN): a match proves a
 *   boot; no match within the timeout fails (as before);
 * - `expectEvidence`: the static inspection says the guest writes its boot to the serial console
 *   (a Linux kernel line with `console=ttyS…`): wait up to `timeoutSeconds` for evidence.
 *   Otherwise (boot sectors, Windows, no serial console) wait `graceSeconds` only.
 * When the wait ends without evidence either way and the domain still runs, the result is
 * `verified: false` with the reason: the caller records a notice instead of claiming a boot.
 */
import { open } from 'node:fs/promises'
import { MigError } from '../errors.ts'
import type { BootEvidenceSource } from '../job.ts'
import { sleep } from '../retry.ts'
import type { ScreenReader } from './screen.ts'
import type { DomainState } from './virsh.ts'

/** The part of {@link Virsh} the boot check uses (a test may pass a double). */
export interface BootCheckVirsh {
  stateDetail(name: string): Promise<DomainState>
}

/**
 * Input of {@link checkBoot}.
 * - `graceSeconds`: how long the domain must stay `running` (checked every `pollMs`, default 250 ms).
 * - `serialLogPath`: the file of the domain's `<serial type='file'>`; its tail goes into the error.
 * - `expectSerial`: a pattern the serial log must match (matched against its last 1 MiB).
 * - `timeoutSeconds`: how long to wait for `expectSerial` or, with `expectEvidence`, for any
 *   evidence (the check lasts at least `graceSeconds`).
 * - `expectEvidence`: the guest is known to give evidence (it writes its boot to the serial
 *   console, or its screen is read and it is a Linux guest whose screen shows a login prompt).
 * - `screen`: the reader of the domain's screen (lib/domain/screen.ts), optional.
 * - `screenEveryMs`: the least interval between two screen reads (default 5000 ms).
 * - `secondConsole`: look at the guest's second virtual console (`screen.secondConsole()`, Alt+F2
 *   and back) when the screen has shown kernel or systemd output, no verdict, and the same image
 *   for `quietMs`, at most once per `everyMs`: getty's prompt on tty1 may have been scrolled off by
 *   later kernel messages. Only for Linux guests (the keys are the Linux console's). Off when absent.
 * - `signal`: aborts the wait with `E_MIG_CANCELLED`.
 */
export interface BootCheckInput {
  virsh: BootCheckVirsh
  name: string
  graceSeconds: number
  serialLogPath?: string
  expectSerial?: RegExp
  expectEvidence?: boolean
  screen?: ScreenReader
  screenEveryMs?: number
  secondConsole?: { quietMs: number; everyMs: number }
  timeoutSeconds: number
  pollMs?: number
  signal?: AbortSignal
}

/**
 * What a passing check saw: the final state, seconds waited, whether the operator's serial pattern
 * matched, whether a boot is `verified` by evidence, and `evidence` in words (what proved the boot,
 * or why nothing could), and `source`: which evidence decided (`serial` console, `screen` OCR, the
 * operator's serial `pattern`), null when unverified; `screenTail`: when unverified, the last 20
 * OCR lines of the screen read last (what the operator would have seen), if any.
 */
export interface BootCheckResult {
  state: DomainState
  waitedSeconds: number
  serialMatched: boolean
  verified: boolean
  evidence: string
  source: BootEvidenceSource | null
  screenTail?: string[]
}

/** Verdict of a serial log: `failed` / `booted` with the reason, or `null` when it shows neither. */
export type SerialVerdict = { verdict: 'failed' | 'booted'; why: string } | null

/** OVMF's `BdsDxe: failed to load Boot0001 "UEFI Misc Device" from …: Not Found` lines of `text` (at most 3, the device path cut). */
function ovmfFailedLoads(text: string): string {
  const lines = [...text.matchAll(/BdsDxe: failed to load (Boot[0-9A-Fa-f]{4}) ("[^"\r\n]*")[^\r\n]*?(?::\s*([^\r\n:]+))?\s*$/gm)].map(
    (m) => `BdsDxe: failed to load ${m[1]} ${m[2]}${m[3] ? `: ${m[3].trim()}` : ''}`,
  )
  return lines.length ? ` (OVMF: ${lines.slice(-3).join('; ')})` : ''
}

/** The fix of a UEFI guest OVMF found no loader for (its boot entry lived in the source hypervisor's NVRAM). */
const UEFI_LOADER_FIX =
  'the EFI system partition has no loader at the removable path \\EFI\\BOOT\\BOOTX64.EFI and the domain NVRAM no boot entry for one; ' +
  'fix: install the boot loader on the source (grub-install --removable, or copy \\EFI\\<vendor>\\shimx64.efi or grubx64.efi to \\EFI\\BOOT\\BOOTX64.EFI) and migrate again, ' +
  'or set the plan firmware to bios if the disk has BIOS boot code'

const FAILURES: Array<[RegExp, (m: RegExpExecArray, text: string) => string]> = [
  [/Kernel panic - not syncing:?\s*([^\r\n]*)/, (m) => `the guest kernel panicked: ${m[1]!.trim().slice(0, 200)}`],
  [/ALERT!\s+(\S+)\s+does not exist/, (m) => `the kernel could not find its root device ${m[1]!.slice(0, 200)} (initramfs gave up waiting for it)`],
  // initramfs-tools prints "Gave up waiting ..." a few lines before the ALERT that names the
  // device: the verdict waits for that line, or for the shell prompt after it when there is none
  [
    /Gave up waiting for root (?:file system )?device[\s\S]*?^\(initramfs\)\s*$/m,
    () => 'the kernel could not find its root device (initramfs gave up waiting for it)',
  ],
  [/dracut-initqueue\[\d+\]: Warning: Could not boot/, () => 'dracut could not find the root device'],
  [/Could not boot\.|dracut Warning: Could not boot/, () => 'dracut could not find the root device'],
  [/VFS: Unable to mount root fs/, () => 'the kernel could not mount its root file system'],
  [
    /You are in emergency mode|Entering emergency mode|Give root password for maintenance/,
    () => 'the guest entered systemd emergency mode (a file system in fstab could not be mounted)',
  ],
  [/^\(initramfs\)\s*$/m, () => 'the guest dropped to the initramfs shell'],
  // Only final words: GRUB prints harmless "error: file ... not found" (locale files) and SeaBIOS
  // "Boot failed" for one device before it boots from the next, so neither counts by itself.
  [/grub rescue>|error: you need to load the kernel first/, () => 'GRUB could not load the kernel (grub rescue)'],
  [/No bootable device/, () => 'the firmware found no bootable disk'],
  // OVMF: each boot option that fails prints "BdsDxe: failed to load"; the next may still boot, so
  // only the end of the list counts: its UEFI Shell (the last boot option of Debian's OVMF) or
  // "No bootable option or device was found".
  [/No bootable option or device was found/, (_m, text) => `OVMF found no bootable option or device${ovmfFailedLoads(text)}: ${UEFI_LOADER_FIX}`],
  [
    /UEFI Interactive Shell v|^\s*Shell> ?$|startup\.nsh/m,
    (_m, text) => `OVMF found no boot loader it could start and dropped to its UEFI Shell${ovmfFailedLoads(text)}: ${UEFI_LOADER_FIX}`,
  ],
]
const SUCCESSES: Array<[RegExp, string]> = [
  // The prompt ends its line, or a kernel console message (`[   42.685758] …`) follows it on the
  // same line: printk writes to the console without a newline after getty's prompt.
  [/^[^\r\n]*\blogin: *(?:\r?$|\[ *\d+\.\d+\] )/m, 'a login prompt on the serial console'],
  [/Reached target[^\r\n]*(?:Multi-User System|Graphical Interface)/, 'systemd reached the multi-user target'],
]

/**
 * getty's prompt as OCR reads it off the screen: `<host name> login:` at the start of a line,
 * then the text cursor (`_`), the end of the line, or anything the kernel printed after it (printk
 * goes on writing on the prompt's line, and OCR drops or misreads the `[` of its time stamps, so
 * the serial rule's `[ 78.93]` is not required). `Last login:` (a session's banner) is not a prompt.
 */
const SCREEN_LOGIN_PROMPT = /^\s*(?!Last login:)[A-Za-z0-9][\w.-]{0,62} login:/m

/**
 * Classifies the OCR text of the guest's screen ({@link ScreenReader}): the serial rules of
 * {@link classifySerial} (failures first), then getty's prompt ({@link SCREEN_LOGIN_PROMPT}).
 */
export function classifyScreen(text: string): SerialVerdict {
  const v = classifySerial(text)
  if (v) return { verdict: v.verdict, why: v.verdict === 'booted' ? `${v.why.replace(' on the serial console', '')} on the guest's screen (OCR)` : v.why }
  if (SCREEN_LOGIN_PROMPT.test(text)) return { verdict: 'booted', why: "a login prompt on the guest's screen (OCR)" }
  return null
}

/**
 * Classifies a serial console log (latin1 text): failure patterns (kernel panic, root device not
 * found, emergency mode, initramfs shell, GRUB rescue, no bootable device) win over success
 * patterns (`login:` prompt, systemd multi-user / graphical target). Null when neither is seen.
 */
export function classifySerial(text: string): SerialVerdict {
  const clean = text.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '')
  for (const [re, why] of FAILURES) {
    const m = re.exec(clean)
    if (m) return { verdict: 'failed', why: why(m, clean) }
  }
  for (const [re, why] of SUCCESSES) if (re.test(clean)) return { verdict: 'booted', why }
  return null
}

/** Bytes of the serial log searched for `expectSerial` / kept for the error tail. */
const MATCH_WINDOW = 1 << 20
const TAIL_WINDOW = 64 << 10

/** The last `maxBytes` of a file as latin1 text ('' when it does not exist or cannot be read). */
async function readTail(file: string, maxBytes: number): Promise<string> {
  let fh
  try {
    fh = await open(file, 'r')
    const { size } = await fh.stat()
    const n = Math.min(size, maxBytes)
    const buf = Buffer.alloc(n)
    const { bytesRead } = await fh.read(buf, 0, n, size - n)
    return buf.subarray(0, bytesRead).toString('latin1')
  } catch {
    return ''
  } finally {
    await fh?.close()
  }
}

/** The last `count` lines of the serial log (control characters other than tab removed). */
export async function serialTail(file: string | undefined, count = 20): Promise<string[]> {
  if (!file) return []
  const text = await readTail(file, TAIL_WINDOW)
  const lines = text
    .replace(/\r\n?/g, '\n')
    .split('\n')
    .map((l) => l.replace(/[\x00-\x08\x0b-\x1f\x7f]/g, ''))
  while (lines.length && lines[lines.length - 1] === '') lines.pop()
  return lines.slice(-count)
}

/** The error of a boot check whose signal aborted while it waited. */
function bootCheckCancelled(): MigError {
  return new MigError('E_MIG_CANCELLED', 'boot check cancelled')
}

/**
 * Runs the boot check (see the module comment). Fails as soon as the domain is seen in any state
 * but `running` or the serial log shows a failure; passes verified once a boot is proven (serial
 * success or the operator's pattern) and `graceSeconds` passed; passes unverified when the wait
 * (grace, or timeout with `expectEvidence`) ends with the domain running and no evidence. Throws
 * `E_MIG_GUEST_BOOT_FAILED` with the reason, the domain state and the last 20 lines of the serial
 * log in the message and in `details` (`state`, `reason`, `serial_tail`, `why`, `waited_seconds`); `E_MIG_CANCELLED`
 * when `signal` aborts.
 */
export async function checkBoot(input: BootCheckInput): Promise<BootCheckResult> {
  const { name, serialLogPath, expectSerial } = input
  if (expectSerial && !serialLogPath) throw new MigError('E_MIG_GUEST_BOOT_FAILED', `boot check of ${name}: expectSerial needs serialLogPath`)
  const pollMs = input.pollMs ?? 250
  const graceMs = Math.max(0, input.graceSeconds) * 1000
  const timeoutMs = Math.max(graceMs, Math.max(0, input.timeoutSeconds) * 1000)
  // Without the operator's pattern or a guest known to talk on the serial console, only the grace period is waited.
  const deadlineMs = expectSerial || input.expectEvidence ? timeoutMs : graceMs
  const t0 = Date.now()
  let matched = false
  // The screen is read in the background: one OCR can take seconds, the state and serial polls go on.
  const screenEveryMs = input.screenEveryMs ?? 5000
  const screenStop = new AbortController()
  const onAbort = () => screenStop.abort()
  input.signal?.addEventListener('abort', onAbort, { once: true })
  let screenPending: Promise<void> | null = null
  let screenAt = -Infinity
  let screenVerdict: SerialVerdict = null
  let screenText = ''
  const screenReads = { count: 0, lastMs: 0, consoles: 0 }
  let kernelSeen = false
  let consoleAt = -Infinity
  /** Whether this poll looks at the second console instead of the screen (see {@link BootCheckInput.secondConsole}). */
  const consoleDue = (): boolean => {
    const s = input.screen
    if (!input.secondConsole || !s?.secondConsole || !kernelSeen || screenVerdict) return false
    const now = Date.now()
    return s.stableSince != null && now - s.stableSince >= input.secondConsole.quietMs && now - consoleAt >= input.secondConsole.everyMs
  }
  const pollScreen = () => {
    if (!input.screen || screenPending || Date.now() - screenAt < screenEveryMs) return
    screenAt = Date.now()
    const started = screenAt
    const onConsole = consoleDue()
    if (onConsole) consoleAt = started
    screenPending = (onConsole ? input.screen.secondConsole!(screenStop.signal) : input.screen.read(screenStop.signal))
      .then((text) => {
        screenReads.count++
        screenReads.lastMs = Date.now() - started
        if (text === null) return
        if (onConsole) {
          screenReads.consoles++
          // Only a prompt counts there: tty2 shows nothing of the boot but its getty.
          if (classifyScreen(text)?.verdict === 'booted') screenVerdict = { verdict: 'booted', why: SECOND_CONSOLE_WHY }
          return
        }
        screenText = text
        kernelSeen ||= KERNEL_RUNNING.test(text)
        // tty1 without a verdict does not undo the prompt tty2 showed (a failure there would)
        const v = classifyScreen(text)
        if (v || screenVerdict?.why !== SECOND_CONSOLE_WHY) screenVerdict = v
      })
      .catch(() => undefined)
      .finally(() => {
        screenPending = null
        screenAt = Date.now()
      })
  }
  try {
    return await loop()
  } finally {
    input.signal?.removeEventListener('abort', onAbort)
    screenStop.abort()
    await screenPending
  }

  async function loop(): Promise<BootCheckResult> {
    async function failure(state: DomainState | null, why: string, source: BootEvidenceSource): Promise<never> {
      const tail = await serialTail(serialLogPath)
      const st = state ? `${state.state}${state.reason ? ` (${state.reason})` : ''}` : 'unknown'
      const waited = ((Date.now() - t0) / 1000).toFixed(1)
      throw new MigError(
        'E_MIG_GUEST_BOOT_FAILED',
        `domain ${name} did not boot: ${why}; state ${st} after ${waited} s` +
          (tail.length ? `; serial log (last ${tail.length} lines):\n${tail.join('\n')}` : '; serial log empty') +
          (source === 'screen' ? `; the guest's screen (OCR, last 20 lines):\n${screenTail(screenText).join('\n')}` : ''),
        {
          details: {
            domain: name,
            state: state?.state ?? null,
            reason: state?.reason ?? null,
            serial_tail: tail,
            screen_tail: screenTail(screenText),
            why,
            source,
            waited_seconds: Number(waited),
          },
        },
      )
    }

    for (;;) {
      const state = await input.virsh.stateDetail(name)
      if (state.state === 'crashed' || state.reason === 'crashed' || state.reason === 'panicked') {
        return failure(state, 'the domain crashed (a guest kernel panic reported by its pvpanic device, or qemu died)', 'state')
      }
      if (state.state !== 'running') return failure(state, 'the domain is not running', 'state')
      const text = serialLogPath ? await readTail(serialLogPath, MATCH_WINDOW) : ''
      const serialVerdict = classifySerial(text)
      if (serialVerdict?.verdict === 'failed') return failure(state, serialVerdict.why, 'serial')
      const seen = screenVerdict as SerialVerdict
      if (seen?.verdict === 'failed') return failure(state, seen.why, 'screen')
      const verdict = serialVerdict ?? seen
      const verdictSource: BootEvidenceSource = serialVerdict ? 'serial' : 'screen'
      if (expectSerial && !matched) {
        expectSerial.lastIndex = 0
        matched = expectSerial.test(text)
      }
      const elapsed = Date.now() - t0
      const proof = matched ? `the serial log matched ${expectSerial}` : verdict?.verdict === 'booted' ? verdict.why : null
      const source: BootEvidenceSource = matched ? 'pattern' : verdictSource
      if (proof && elapsed >= graceMs) return { state, waitedSeconds: elapsed / 1000, serialMatched: matched, verified: true, evidence: proof, source }
      if (!proof && elapsed >= deadlineMs) {
        if (expectSerial) return failure(state, `the serial log did not match ${expectSerial} within ${deadlineMs / 1000} s`, 'pattern')
        const screenWhy = !input.screen
          ? 'its screen is not read'
          : input.screen.unavailable
            ? `its screen could not be read (${input.screen.unavailable})`
            : `nor did its screen (${screenReads.count} reads, the last in ${(screenReads.lastMs / 1000).toFixed(1)} s${screenText.trim() ? `; its last lines: ${screenTail(screenText).slice(-3).join(' / ')}` : '; no text on it'}${screenReads.consoles ? `; its second virtual console, looked at ${screenReads.consoles} times, showed no login prompt` : ''})`
        const evidence = input.expectEvidence
          ? `the domain is running after ${(elapsed / 1000).toFixed(0)} s but its serial console showed neither a boot nor a failure, ${screenWhy}`
          : `the domain is running after ${(elapsed / 1000).toFixed(0)} s; the guest gives no boot evidence the migrator can read (no serial console output it recognizes, ${screenWhy})`
        const tail = screenTail(screenText)
        return {
          state,
          waitedSeconds: elapsed / 1000,
          serialMatched: false,
          verified: false,
          evidence,
          source: null,
          ...(tail.length ? { screenTail: tail } : {}),
        }
      }
      pollScreen()
      await sleep(Math.min(pollMs, Math.max(10, (proof ? graceMs : deadlineMs) - elapsed)), input.signal, bootCheckCancelled)
    }
  }
}

/**
 * Screen text that only a running Linux kernel or systemd writes (a printk time stamp as OCR reads
 * it, systemd's `[  OK  ]` status or its target lines): keys are sent to the guest only after it,
 * never while the firmware or the boot loader shows (a key stops GRUB's menu countdown).
 */
const KERNEL_RUNNING = /\b\d{1,6}\.\d{5,6}\]|\[ *OK *\]|Reached target|Started /

const SECOND_CONSOLE_WHY = "a login prompt on the guest's second virtual console (Alt+F2, OCR)"

/** The last 20 non-empty lines of OCR text. */
function screenTail(text: string): string[] {
  return text
    .split('\n')
    .map((l) => l.trimEnd())
    .filter(Boolean)
    .slice(-20)
}
