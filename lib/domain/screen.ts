/**
 * The guest's screen as text, for the boot check (lib/domain/boot-check.ts): `virsh screenshot`
 * (the domain's display as an image, PNG or PPM as qemu writes it) read by Debian's
 * `tesseract-ocr` (Tesseract 5, English model). A Linux guest that does not write its boot to the
 * serial console still shows it on its display: the kernel's and systemd's messages, then getty's
 * `<host> login:` prompt, or an initramfs shell, emergency mode, GRUB rescue, OVMF's UEFI Shell.
 *
 * Cost: one screenshot is a few milliseconds; OCR of a full 1280x800 console takes about 1 s for
 * a login screen and 10-20 s for a screen full of kernel messages on a loaded 2-core host (README
 * "Boot check"). The reader therefore skips OCR when the image did not change since the last read
 * and runs Tesseract single-threaded (`OMP_THREAD_LIMIT=1`) at a lower CPU priority
 * (`nice -n 10`: about a tenth of a core beside a busy TCG guest), so it does not starve the
 * guest it watches. Not the lowest: at `nice -n 19` a host whose cores all run TCG guests gives
 * Tesseract about 1.5 % of a core, and one read outlasts its 120 s limit.
 *
 * Errors: none thrown. A missing `tesseract`, a domain without a display or a failed screenshot
 * give `null` (no evidence) and `unavailable` says why.
 */
import { createHash } from 'node:crypto'
import { readFile, rm } from 'node:fs/promises'
import { exec } from '../exec.ts'
import { sleep } from '../retry.ts'

/** The part of {@link Virsh} the reader uses. */
export interface ScreenVirsh {
  run(args: string[], timeoutMs?: number): Promise<{ code: number; stdout: string; stderr: string }>
}

/**
 * A reader of one domain's screen. `read()` resolves with the OCR text of the current screen, the
 * previous text when the image is unchanged, or null when no text could be read (`unavailable`
 * then holds the reason); it settles promptly when `signal` aborts (Tesseract is killed).
 * `stableSince`: when (`Date.now()`, ms) the image `read()` saw last was first seen (null before a
 * read). `secondConsole()` (optional: a double may leave it out) switches the guest's display to
 * its second virtual console, reads it, and switches back ({@link SECOND_CONSOLE}); null when
 * nothing could be read. `close()` removes the screenshot file.
 */
export interface ScreenReader {
  read(signal?: AbortSignal): Promise<string | null>
  secondConsole?(signal?: AbortSignal): Promise<string | null>
  readonly unavailable: string | null
  readonly stableSince?: number | null
  close(): Promise<void>
}

/**
 * The console switch of {@link ScreenReader.secondConsole}: Alt+F2 makes the Linux console show
 * tty2, where systemd-logind starts a getty on demand (`autovt@tty2`), so a booted guest shows a
 * clean `<host> login:` prompt there even when kernel messages scrolled it off tty1; Alt+F1 shows
 * tty1 again. The kernel's keyboard driver takes these keys (no program on either console
 * receives them). `reads`: screenshots taken on tty2, `everyMs` apart, until one shows a prompt.
 */
export const SECOND_CONSOLE = { to: ['KEY_LEFTALT', 'KEY_F2'], back: ['KEY_LEFTALT', 'KEY_F1'], reads: 3, everyMs: 3000 } as const

let tesseractProbe: Promise<string | null> | null = null

/** Null when `tesseract` runs here, else the reason (probed once per process). */
export function tesseractMissing(binary = 'tesseract'): Promise<string | null> {
  tesseractProbe ??= exec(binary, ['--version'], { timeoutMs: 10_000 }).then((r) =>
    r.code === 0 ? null : `${binary} is not installed (Debian package tesseract-ocr): ${r.spawnError?.message ?? r.stderr.trim().slice(0, 200)}`,
  )
  return tesseractProbe
}

/**
 * Creates a {@link ScreenReader} of domain `name` over `virsh` (OCR with `tesseract`, `binary`
 * overrides it). Each screenshot overwrites `file` (beside the domain's serial log, so that a
 * worker killed during the check leaves it in the server's data directory, not in /tmp); `close()`
 * removes it.
 */
export async function screenReader(virsh: ScreenVirsh, name: string, file: string, binary = 'tesseract'): Promise<ScreenReader> {
  let lastHash = ''
  let lastText: string | null = null
  const state: { unavailable: string | null; stableSince: number | null } = { unavailable: await tesseractMissing(binary), stableSince: null }
  /** Takes a screenshot: its bytes' hash, or null (`unavailable` says why). */
  const shoot = async (): Promise<string | null> => {
    const shot = await virsh.run(['screenshot', '--domain', name, '--file', file], 30_000)
    if (shot.code !== 0) {
      state.unavailable = `virsh screenshot failed: ${(shot.stderr || shot.stdout).trim().slice(0, 300)}`
      return null
    }
    try {
      return createHash('sha256')
        .update(await readFile(file))
        .digest('hex')
    } catch (e) {
      state.unavailable = `virsh screenshot wrote nothing: ${(e as Error).message}`
      return null
    }
  }
  /** OCR of the last screenshot, or null (`unavailable` says why). */
  const ocr = async (signal?: AbortSignal): Promise<string | null> => {
    const r = await exec('nice', ['-n', '10', binary, file, '-'], {
      timeoutMs: 120_000,
      signal,
      env: { ...process.env, OMP_THREAD_LIMIT: '1', LC_ALL: 'C' },
    })
    if (r.code !== 0) {
      state.unavailable = `tesseract failed: ${r.stderr.trim().slice(0, 300)}`
      return null
    }
    state.unavailable = null
    return r.stdout
  }
  return {
    get unavailable() {
      return state.unavailable
    },
    get stableSince() {
      return state.stableSince
    },
    async read(signal) {
      if ((await tesseractMissing(binary)) !== null) return null
      const hash = await shoot()
      if (hash === null) return null
      if (hash === lastHash) return lastText
      state.stableSince = Date.now()
      const text = await ocr(signal)
      if (text === null) return null
      lastHash = hash
      lastText = text
      return lastText
    },
    async secondConsole(signal) {
      if ((await tesseractMissing(binary)) !== null) return null
      const sent = await virsh.run(['send-key', '--domain', name, ...SECOND_CONSOLE.to], 30_000)
      if (sent.code !== 0) return null
      let text: string | null = null
      try {
        let seen = ''
        for (let i = 0; i < SECOND_CONSOLE.reads && !signal?.aborted; i++) {
          await sleep(SECOND_CONSOLE.everyMs, signal).catch(() => undefined)
          const hash = await shoot()
          if (hash === null || hash === seen) continue
          seen = hash
          text = await ocr(signal)
          if (text && /\blogin:/.test(text)) break
        }
      } finally {
        await virsh.run(['send-key', '--domain', name, ...SECOND_CONSOLE.back], 30_000)
      }
      return text
    },
    async close() {
      await rm(file, { force: true })
    },
  }
}
