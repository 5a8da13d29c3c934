/**
 * The boot check of the Starting state (spec 1.2, DESIGN.md section 6): after `virsh start`, the
 * domain must still be `running` once a grace period has passed and, when a serial pattern is
 * expected, the serial console log must match it within a timeout. Otherwise the destination did not
 * boot: `E_MIG_GUEST_BOOT_FAILED`.
 */
import { open } from 'node:fs/promises'
import { MigError } from '../errors.ts'
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
 * - `timeoutSeconds`: how long to wait for `expectSerial` (the check lasts at least `graceSeconds`).
 * - `signal`: aborts the wait with `E_MIG_CANCELLED`.
 */
export interface BootCheckInput {
  virsh: BootCheckVirsh
  name: string
  graceSeconds: number
  serialLogPath?: string
  expectSerial?: RegExp
  timeoutSeconds: number
  pollMs?: number
  signal?: AbortSignal
}

/** What a passing check saw: the final state, seconds waited, and whether the serial pattern matched. */
export interface BootCheckResult {
  state: DomainState
  waitedSeconds: number
  serialMatched: boolean
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
  const lines = text.replace(/\r\n?/g, '\n').split('\n').map((l) => l.replace(/[\x00-\x08\x0b-\x1f\x7f]/g, ''))
  while (lines.length && lines[lines.length - 1] === '') lines.pop()
  return lines.slice(-count)
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(new MigError('E_MIG_CANCELLED', 'boot check cancelled'))
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    const onAbort = () => {
      clearTimeout(t)
      reject(new MigError('E_MIG_CANCELLED', 'boot check cancelled'))
    }
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}

/**
 * Waits until the domain has been `running` for `graceSeconds` and, when `expectSerial` is given,
 * its serial log matches within `max(graceSeconds, timeoutSeconds)`. Fails as soon as the domain is
 * seen in any other state. Throws `E_MIG_GUEST_BOOT_FAILED` with the domain state and the last 20
 * lines of the serial log in the message and in `details` (`state`, `reason`, `serial_tail`);
 * `E_MIG_CANCELLED` when `signal` aborts.
 */
export async function checkBoot(input: BootCheckInput): Promise<BootCheckResult> {
  const { name, serialLogPath, expectSerial } = input
  if (expectSerial && !serialLogPath) throw new MigError('E_MIG_GUEST_BOOT_FAILED', `boot check of ${name}: expectSerial needs serialLogPath`)
  const pollMs = input.pollMs ?? 250
  const graceMs = Math.max(0, input.graceSeconds) * 1000
  const deadlineMs = Math.max(graceMs, Math.max(0, input.timeoutSeconds) * 1000)
  const t0 = Date.now()
  let matched = !expectSerial

  const failure = async (state: DomainState | null, why: string): Promise<never> => {
    const tail = await serialTail(serialLogPath)
    const st = state ? `${state.state}${state.reason ? ` (${state.reason})` : ''}` : 'unknown'
    const waited = ((Date.now() - t0) / 1000).toFixed(1)
    throw new MigError(
      'E_MIG_GUEST_BOOT_FAILED',
      `domain ${name} did not boot: ${why}; state ${st} after ${waited} s` + (tail.length ? `; serial log (last ${tail.length} lines):\n${tail.join('\n')}` : '; serial log empty'),
      { details: { domain: name, state: state?.state ?? null, reason: state?.reason ?? null, serial_tail: tail } },
    )
  }

  for (;;) {
    const state = await input.virsh.stateDetail(name)
    if (state.state !== 'running') return failure(state, 'the domain is not running')
    if (!matched) {
      expectSerial!.lastIndex = 0
      matched = expectSerial!.test(await readTail(serialLogPath!, MATCH_WINDOW))
    }
    const elapsed = Date.now() - t0
    if (matched && elapsed >= graceMs) return { state, waitedSeconds: elapsed / 1000, serialMatched: !!expectSerial }
    if (!matched && elapsed >= deadlineMs) return failure(state, `the serial log did not match ${expectSerial!} within ${deadlineMs / 1000} s`)
    await sleep(Math.min(pollMs, Math.max(10, (matched ? graceMs : deadlineMs) - elapsed)), input.signal)
  }
}
