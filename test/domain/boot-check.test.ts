/**
 * checkBoot (lib/domain/boot-check.ts) against a scripted domain state source and a real serial log
 * file; the screen evidence against a scripted screen reader (a test double of the virsh screenshot
 * + Tesseract reader, whose real use is test/engine/real-guests.guest.integ.test.ts); the classification
 * rules against OVMF's and Tesseract's real output captured from TCG guests.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { appendFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { type BootCheckInput, checkBoot, classifyScreen, classifySerial, serialTail } from '../../lib/domain/boot-check.ts'
import type { ScreenReader } from '../../lib/domain/screen.ts'
import type { DomainState } from '../../lib/domain/virsh.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const tmp = tempDir('mig-boot-')
afterAll(() => tmp.cleanup())

/** A state source that answers `states[i]` on call i (the last one repeats). */
function scripted(states: DomainState[]) {
  let i = 0
  return {
    calls: () => i,
    stateDetail: async (_name: string) => states[Math.min(i++, states.length - 1)]!,
  }
}
const RUNNING = { state: 'running', reason: 'booted' }

/** checkBoot of domain `name` polled every `pollMs`; its state source answers running unless `o.virsh` says otherwise. */
const check = (name: string, pollMs: number, o: Partial<BootCheckInput> & Pick<BootCheckInput, 'graceSeconds' | 'timeoutSeconds'>) =>
  checkBoot({ virsh: scripted([RUNNING]), name, pollMs, ...o })

/** Writes `text` as the serial log `<tmp>/<file>`; returns its path. */
function serialLog(file: string, text: string): string {
  const log = path.join(tmp.dir, file)
  writeFileSync(log, text)
  return log
}

/** A screen reader whose reads answer `read()`; `unavailable` says why it cannot read at all (null: it can). */
const screenOf = (read: ScreenReader['read'], unavailable: string | null = null): ScreenReader => ({ unavailable, read, close: async () => undefined })

describe('checkBoot', () => {
  test('passes when the domain stays running for the grace period', async () => {
    const v = scripted([RUNNING])
    const t0 = Date.now()
    const r = await check('vm1', 50, { virsh: v, graceSeconds: 0.3, timeoutSeconds: 5 })
    expect(Date.now() - t0).toBeGreaterThanOrEqual(300)
    expect(r.state).toEqual(RUNNING)
    expect(r.serialMatched).toBe(false)
    expect(v.calls()).toBeGreaterThanOrEqual(3)
  })

  test('fails with the state and the last 20 serial lines when the domain stops during the grace period', async () => {
    const log = serialLog('stop.log', Array.from({ length: 30 }, (_, i) => `line ${i + 1}`).join('\r\n') + '\r\n\x1b')
    const v = scripted([RUNNING, RUNNING, { state: 'shut off', reason: 'crashed' }])
    const err = await thrown(() => check('vm2', 20, { virsh: v, graceSeconds: 5, timeoutSeconds: 5, serialLogPath: log }))
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_GUEST_BOOT_FAILED')
    expect(err.message).toContain(
      'domain vm2 did not boot: the domain crashed (a guest kernel panic reported by its pvpanic device, or qemu died); state shut off (crashed)',
    )
    expect(err.details.state).toBe('shut off')
    expect(err.details.reason).toBe('crashed')
    expect(err.details.serial_tail).toEqual(Array.from({ length: 20 }, (_, i) => `line ${i + 11}`))
    expect(err.message).toContain('serial log (last 20 lines):\nline 11\n')
  })

  test('expectSerial: passes once the log matches, fails at the timeout when it never does', async () => {
    const log = serialLog('marker.log', 'SeaBIOS\n')
    setTimeout(() => appendFileSync(log, 'BOOT-MARKER-7\n'), 200)
    const ok = await check('vm3', 25, { graceSeconds: 0, timeoutSeconds: 5, serialLogPath: log, expectSerial: /BOOT-MARKER-7/g })
    expect(ok.serialMatched).toBe(true)

    const silent = serialLog('silent.log', 'Booting from Hard Disk...\n')
    const t0 = Date.now()
    const err = await thrown(() => check('vm4', 25, { graceSeconds: 0.1, timeoutSeconds: 0.4, serialLogPath: silent, expectSerial: /BOOT-MARKER-7/ }))
    expect(Date.now() - t0).toBeGreaterThanOrEqual(400)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_GUEST_BOOT_FAILED')
    expect(err.message).toContain('the serial log did not match /BOOT-MARKER-7/ within 0.4 s; state running (booted)')
    expect(err.details.serial_tail).toEqual(['Booting from Hard Disk...'])
  })

  test('evidence: a failure on the serial console fails at once, with its reason, long before the timeout', async () => {
    const log = serialLog(
      'initramfs.log',
      'Begin: Running /scripts/local-block ... done.\r\nGave up waiting for root file system device.\r\nALERT!  UUID=1234 does not exist.  Dropping to a shell!\r\n(initramfs) ',
    )
    const t0 = Date.now()
    const err = await thrown(() => check('vm6', 25, { graceSeconds: 1, timeoutSeconds: 30, serialLogPath: log, expectEvidence: true }))
    expect(Date.now() - t0).toBeLessThan(1000)
    expect(err.code).toBe('E_MIG_GUEST_BOOT_FAILED')
    expect(err.details.why).toBe('the kernel could not find its root device UUID=1234 (initramfs gave up waiting for it)')
  })

  test('evidence: a login prompt verifies the boot; silence ends unverified (grace only, or the timeout when the guest is known to use the serial console)', async () => {
    const log = serialLog('login.log', 'Debian GNU/Linux 12 guest ttyS0\r\n\r\nguest login: ')
    const ok = await check('vm7', 25, { graceSeconds: 0.1, timeoutSeconds: 30, serialLogPath: log, expectEvidence: true })
    expect([ok.verified, ok.evidence]).toEqual([true, 'a login prompt on the serial console'])

    const quiet = serialLog('quiet.log', 'SeaBIOS\n')
    let t0 = Date.now()
    const grace = await check('vm8', 25, { graceSeconds: 0.2, timeoutSeconds: 30, serialLogPath: quiet })
    expect(Date.now() - t0).toBeLessThan(2000)
    expect(grace.verified).toBe(false)
    expect(grace.evidence).toContain('no boot evidence the migrator can read')
    t0 = Date.now()
    const waited = await check('vm9', 25, { graceSeconds: 0.1, timeoutSeconds: 0.5, serialLogPath: quiet, expectEvidence: true })
    expect(Date.now() - t0).toBeGreaterThanOrEqual(500)
    expect(waited.verified).toBe(false)
    expect(waited.evidence).toContain('its serial console showed neither a boot nor a failure')
  })

  test('abort signal: E_MIG_CANCELLED', async () => {
    const ac = new AbortController()
    setTimeout(() => ac.abort(), 100)
    const err = await thrown(() => check('vm5', 20, { graceSeconds: 30, timeoutSeconds: 30, signal: ac.signal }))
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
  })

  test('serialTail of a missing file is empty', async () => {
    expect(await serialTail(path.join(tmp.dir, 'nope.log'))).toEqual([])
    expect(await serialTail(undefined)).toEqual([])
  })

  test('screen evidence: a login prompt on the screen verifies a guest that is silent on its serial console (source screen)', async () => {
    const quiet = serialLog('screen-quiet.log', '')
    const screens = ['[  3.1] Run /init as init process\n', 'Debian GNU/Linux 12 migrator-quest tty1\n\nmigrator-guest login: _\n']
    let reads = 0
    const screen = screenOf(async () => screens[Math.min(reads++, screens.length - 1)]!)
    const r = await check('vm10', 20, { graceSeconds: 0.05, timeoutSeconds: 30, serialLogPath: quiet, expectEvidence: true, screen, screenEveryMs: 50 })
    expect(r).toMatchObject({ verified: true, source: 'screen', evidence: "a login prompt on the guest's screen (OCR)" })
    expect(reads).toBeGreaterThanOrEqual(2)
  })

  test('screen read but nothing recognized: not verified, the notice says how many reads, how long the last took and its last lines', async () => {
    const quiet = serialLog('screen-unknown.log', '')
    const screen = screenOf(async () => 'line one\nline two\n\nsomething else entirely\n')
    const r = await check('vm12', 20, { graceSeconds: 0, timeoutSeconds: 0.3, serialLogPath: quiet, expectEvidence: true, screen, screenEveryMs: 50 })
    expect(r.verified).toBe(false)
    expect(r.evidence).toMatch(/nor did its screen \(\d+ reads, the last in \d+\.\d s; its last lines: line one \/ line two \/ something else entirely\)$/)
  })

  test('screen evidence: a failure on the screen fails at once with the OCR tail; a slow screen read never delays the state check', async () => {
    const screen = screenOf(async () => 'Gave up waiting for root file system device.\nALERT! UUID=abcd does not exist. Dropping to a shell!\n(initramfs) _\n')
    const err = await thrown(() => check('vm11', 20, { graceSeconds: 0, timeoutSeconds: 30, expectEvidence: true, screen, screenEveryMs: 10 }))
    expect(err.code).toBe('E_MIG_GUEST_BOOT_FAILED')
    expect(err.details.source).toBe('screen')
    expect(err.details.why).toBe('the kernel could not find its root device UUID=abcd (initramfs gave up waiting for it)')
    expect(err.details.screen_tail.join('\n')).toContain('(initramfs)')

    // A read that takes 3 s unless aborted (the real reader kills Tesseract on abort).
    let aborted = false
    const slow = screenOf(
      (signal) =>
        new Promise((r) => {
          const timer = setTimeout(() => r(''), 3000)
          signal?.addEventListener('abort', () => {
            aborted = true
            clearTimeout(timer)
            r(null)
          })
        }),
    )
    const t0 = Date.now()
    const shutdown = scripted([RUNNING, RUNNING, RUNNING, { state: 'shut off', reason: 'shutdown' }])
    const stopped = await thrown(() => check('vm12', 20, { virsh: shutdown, graceSeconds: 10, timeoutSeconds: 30, screen: slow }))
    expect(stopped.details.why).toBe('the domain is not running')
    expect(Date.now() - t0).toBeLessThan(2000)
    expect(aborted).toBe(true)
  })

  test('second console: a quiet screen of kernel messages without a prompt is followed by a look at tty2; GRUB never gets keys', async () => {
    const flood = '80.918706] powernou_k6: Power state transitions not supported\n80.937181] powernou_k6: Power state transitions not supported\n'
    /** A reader whose tty1 shows `tty1` from the start (stable), whose tty2 shows `tty2`. */
    const reader = (tty1: string, tty2: string | null) => {
      const calls = { read: 0, console: 0 }
      const r: ScreenReader = {
        unavailable: null,
        stableSince: Date.now(),
        read: async () => {
          calls.read++
          return tty1
        },
        secondConsole: async () => {
          calls.console++
          return tty2
        },
        close: async () => undefined,
      }
      return { r, calls }
    }
    const pace = { quietMs: 50, everyMs: 10_000 }
    const base = { virsh: scripted([RUNNING]), graceSeconds: 0, pollMs: 20, expectEvidence: true, screenEveryMs: 10 }

    const booted = reader(flood, 'Debian GNU/Linux 12 migrator-quest tty2\n\nmigrator-guest login: _\n')
    const r = await checkBoot({ ...base, name: 'vm20', timeoutSeconds: 5, screen: booted.r, secondConsole: pace })
    expect(r).toMatchObject({ verified: true, source: 'screen', evidence: "a login prompt on the guest's second virtual console (Alt+F2, OCR)" })
    expect(booted.calls.console).toBe(1)

    // tty1 read again after tty2's prompt (before the grace period ended): the boot stays proven
    const sticky = reader(flood, 'migrator-guest login: _\n')
    const st = await checkBoot({ ...base, name: 'vm24', graceSeconds: 0.3, timeoutSeconds: 5, screen: sticky.r, secondConsole: pace })
    expect(st).toMatchObject({ verified: true, evidence: "a login prompt on the guest's second virtual console (Alt+F2, OCR)" })
    expect(sticky.calls.read).toBeGreaterThan(2)

    // tty2 without a prompt (no getty yet): one look per `everyMs`, unverified at the timeout.
    const empty = reader(flood, '\n')
    const u = await checkBoot({ ...base, name: 'vm21', timeoutSeconds: 0.5, screen: empty.r, secondConsole: pace })
    expect(u.verified).toBe(false)
    expect(empty.calls.console).toBe(1)
    expect(u.evidence).toContain('its second virtual console, looked at 1 times, showed no login prompt')

    // The boot loader's screen (no kernel or systemd text): no key is ever sent.
    const grub = reader('Booting Debian GNU/Linux\n\nLoading Linux 6.1.0-50-amd64 ...\nLoading initial ramdisk ...\n', null)
    const g = await checkBoot({ ...base, name: 'vm22', timeoutSeconds: 0.5, screen: grub.r, secondConsole: pace })
    expect(g.verified).toBe(false)
    expect(grub.calls.console).toBe(0)
    expect(grub.calls.read).toBeGreaterThan(3)

    // Without `secondConsole` (a guest that talks on its serial console, or not Linux): no key either.
    const off = reader(flood, 'migrator-guest login: _\n')
    const o = await checkBoot({ ...base, name: 'vm23', timeoutSeconds: 0.5, screen: off.r })
    expect(o.verified).toBe(false)
    expect(off.calls.console).toBe(0)
  })

  test('screen evidence: an unreadable screen is named in the unverified result', async () => {
    const screen = screenOf(async () => null, 'tesseract is not installed (Debian package tesseract-ocr)')
    const r = await check('vm13', 20, { graceSeconds: 0.1, timeoutSeconds: 0.3, expectEvidence: true, screen })
    expect(r.verified).toBe(false)
    expect(r.source).toBeNull()
    expect(r.evidence).toContain('its screen could not be read (tesseract is not installed')
    expect(r.screenTail).toBeUndefined()

    const noisy = screenOf(async () => 'a\n\nb\n80.918706] powernou_k6: Power state transitions not supported\n')
    const q = await check('vm14', 20, { graceSeconds: 0.1, timeoutSeconds: 0.3, expectEvidence: true, screen: noisy, screenEveryMs: 10 })
    expect(q.verified).toBe(false)
    expect(q.screenTail).toEqual(['a', 'b', '80.918706] powernou_k6: Power state transitions not supported'])
  })
})

/** OVMF (Debian 2022.11) on the serial console of a TCG guest whose ESP has no loader (captured). */
const OVMF_SHELL =
  '\x1b[2J\x1b[01;01H\x1b[=3h\x1b[2J\x1b[01;01HBdsDxe: failed to load Boot0001 "UEFI Misc Device" from PciRoot(0x0)/Pci(0x2,0x3)/Pci(0x0,0x0): Not Found\r\n' +
  'BdsDxe: loading Boot0002 "EFI Internal Shell" from Fv(7CB8BDC9-F8EB-4F34-AAEA-3EE4AF6516A1)/FvFile(7C04A583-9E3E-4F1C-AD65-E05268D0B4D1)\r\n' +
  'BdsDxe: starting Boot0002 "EFI Internal Shell" from Fv(7CB8BDC9-F8EB-4F34-AAEA-3EE4AF6516A1)/FvFile(7C04A583-9E3E-4F1C-AD65-E05268D0B4D1)\r\n' +
  '\x1b[2J\x1b[01;01H\x1b[01;01HUEFI Interactive Shell v2.2\r\nEDK II\r\nUEFI v2.70 (EDK II, 0x00010000)\r\n' +
  '\x1b[16;01HPress \x1b[1m\x1b[37m\x1b[40mESC\x1b[0m\x1b[37m\x1b[40m in 5 seconds to skip \x1b[1m\x1b[33m\x1b[40mstartup.nsh\x1b[0m or any other key to continue.\r\nShell> '

describe('classification rules', () => {
  test("OVMF's UEFI Shell fails with the BdsDxe words and the fix", () => {
    const v = classifySerial(OVMF_SHELL)
    expect(v?.verdict).toBe('failed')
    expect(v?.why).toContain('OVMF found no boot loader it could start and dropped to its UEFI Shell')
    expect(v?.why).toContain('(OVMF: BdsDxe: failed to load Boot0001 "UEFI Misc Device": Not Found)')
    expect(v?.why).toContain('\\EFI\\BOOT\\BOOTX64.EFI')
    expect(v?.why).toContain('grub-install --removable')
    // Only the Shell prompt, before the banner reached the log, is enough too.
    expect(classifySerial('Shell> ')?.verdict).toBe('failed')
  })

  test('OVMF: a failed boot option followed by one that boots is not a failure; "No bootable option" is', () => {
    const next =
      'BdsDxe: failed to load Boot0001 "UEFI PXEv4 (MAC:525400123456)" from PciRoot(0x0)/Pci(0x1,0x0)/MAC(525400123456,0x1)/IPv4(0.0.0.0): Not Found\r\n' +
      'BdsDxe: loading Boot0002 "UEFI Misc Device" from PciRoot(0x0)/Pci(0x2,0x3)/Pci(0x0,0x0)\r\nBdsDxe: starting Boot0002 "UEFI Misc Device"\r\n'
    expect(classifySerial(next)).toBeNull()
    const none = classifySerial(
      `${next.split('\r\n')[0]}\r\nBdsDxe: No bootable option or device was found.\r\nBdsDxe: Press any key to enter the Boot Manager Menu.\r\n`,
    )
    expect(none?.verdict).toBe('failed')
    expect(none?.why).toMatch(/^OVMF found no bootable option or device \(OVMF: BdsDxe: failed to load Boot0001 "UEFI PXEv4 \(MAC:525400123456\)": Not Found\)/)
    expect(classifySerial('No bootable device.')?.why).toBe('the firmware found no bootable disk')
  })

  test("classifyScreen reads Tesseract's text of real screens (login prompt with its cursor, kernel messages, failures)", () => {
    // Tesseract 5 on a Debian 12 guest's 1280x800 virtio-gpu console (captured; OCR misreads kept).
    expect(classifyScreen('Debian GNU/Linux 12 migrator-quest tty1\n\nnigrator-quest login:\n')).toEqual({
      verdict: 'booted',
      why: "a login prompt on the guest's screen (OCR)",
    })
    expect(classifyScreen('Debian GNU/Linux 12 migrator-quest tty1\n\nmigrator-guest login: _\n')?.verdict).toBe('booted')
    expect(classifyScreen('[  OK  ] Reached target multi-user.target - Multi-User System.\n')?.why).toBe(
      "systemd reached the multi-user target on the guest's screen (OCR)",
    )
    expect(
      classifyScreen(
        '-8461591 Console: switching to colour frame buffer device 160x50\n-9804891 virtio-pci 0000:00:01.0: [drm] fbO: virtio_gpudrmfh frame buffer device\n',
      ),
    ).toBeNull()
    expect(classifyScreen('You are in emergency mode. After logging in, type "journalctl -xb" to view\n')?.verdict).toBe('failed')
    expect(classifyScreen('grub rescue> _')?.verdict).toBe('failed')
    expect(classifyScreen('Last login: Sat Nov 28 17:00:01 UTC 2026 on tty1\n')).toBeNull()
    // Kernel messages after the prompt on its line; OCR dropped the `[` of the time stamp.
    expect(
      classifyScreen(
        'Debian GNU/Linux 12 migrator-quest tty1\nnigrator-guest login:  78.937642] [drm] pei: virtio-uga detected\n80.918706] powernou_k6: Power state transitions not supported\n',
      )?.verdict,
    ).toBe('booted')
    expect(classifyScreen('80.918706] powernou_k6: Power state transitions not supported\n')).toBeNull()
  })
})
