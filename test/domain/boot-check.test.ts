/**
 * checkBoot (lib/domain/boot-check.ts) against a scripted domain state source and a real serial log file.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { appendFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { checkBoot, serialTail } from '../../lib/domain/boot-check.ts'
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

describe('checkBoot', () => {
  test('passes when the domain stays running for the grace period', async () => {
    const v = scripted([RUNNING])
    const t0 = Date.now()
    const r = await checkBoot({ virsh: v, name: 'vm1', graceSeconds: 0.3, timeoutSeconds: 5, pollMs: 50 })
    expect(Date.now() - t0).toBeGreaterThanOrEqual(300)
    expect(r.state).toEqual(RUNNING)
    expect(r.serialMatched).toBe(false)
    expect(v.calls()).toBeGreaterThanOrEqual(3)
  })

  test('fails with the state and the last 20 serial lines when the domain stops during the grace period', async () => {
    const log = path.join(tmp.dir, 'stop.log')
    writeFileSync(log, Array.from({ length: 30 }, (_, i) => `line ${i + 1}`).join('\r\n') + '\r\n\x1b')
    const v = scripted([RUNNING, RUNNING, { state: 'shut off', reason: 'crashed' }])
    const err = await thrown(() => checkBoot({ virsh: v, name: 'vm2', graceSeconds: 5, timeoutSeconds: 5, pollMs: 20, serialLogPath: log }))
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
    const log = path.join(tmp.dir, 'marker.log')
    writeFileSync(log, 'SeaBIOS\n')
    setTimeout(() => appendFileSync(log, 'BOOT-MARKER-7\n'), 200)
    const ok = await checkBoot({
      virsh: scripted([RUNNING]),
      name: 'vm3',
      graceSeconds: 0,
      timeoutSeconds: 5,
      pollMs: 25,
      serialLogPath: log,
      expectSerial: /BOOT-MARKER-7/g,
    })
    expect(ok.serialMatched).toBe(true)

    const silent = path.join(tmp.dir, 'silent.log')
    writeFileSync(silent, 'Booting from Hard Disk...\n')
    const t0 = Date.now()
    const err = await thrown(() =>
      checkBoot({
        virsh: scripted([RUNNING]),
        name: 'vm4',
        graceSeconds: 0.1,
        timeoutSeconds: 0.4,
        pollMs: 25,
        serialLogPath: silent,
        expectSerial: /BOOT-MARKER-7/,
      }),
    )
    expect(Date.now() - t0).toBeGreaterThanOrEqual(400)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_GUEST_BOOT_FAILED')
    expect(err.message).toContain('the serial log did not match /BOOT-MARKER-7/ within 0.4 s; state running (booted)')
    expect(err.details.serial_tail).toEqual(['Booting from Hard Disk...'])
  })

  test('evidence: a failure on the serial console fails at once, with its reason, long before the timeout', async () => {
    const log = path.join(tmp.dir, 'initramfs.log')
    writeFileSync(
      log,
      'Begin: Running /scripts/local-block ... done.\r\nGave up waiting for root file system device.\r\nALERT!  UUID=1234 does not exist.  Dropping to a shell!\r\n(initramfs) ',
    )
    const t0 = Date.now()
    const err = await thrown(() =>
      checkBoot({ virsh: scripted([RUNNING]), name: 'vm6', graceSeconds: 1, timeoutSeconds: 30, pollMs: 25, serialLogPath: log, expectEvidence: true }),
    )
    expect(Date.now() - t0).toBeLessThan(1000)
    expect(err.code).toBe('E_MIG_GUEST_BOOT_FAILED')
    expect(err.details.why).toBe('the kernel could not find its root device UUID=1234 (initramfs gave up waiting for it)')
  })

  test('evidence: a login prompt verifies the boot; silence ends unverified (grace only, or the timeout when the guest is known to use the serial console)', async () => {
    const log = path.join(tmp.dir, 'login.log')
    writeFileSync(log, 'Debian GNU/Linux 12 guest ttyS0\r\n\r\nguest login: ')
    const ok = await checkBoot({
      virsh: scripted([RUNNING]),
      name: 'vm7',
      graceSeconds: 0.1,
      timeoutSeconds: 30,
      pollMs: 25,
      serialLogPath: log,
      expectEvidence: true,
    })
    expect([ok.verified, ok.evidence]).toEqual([true, 'a login prompt on the serial console'])

    const quiet = path.join(tmp.dir, 'quiet.log')
    writeFileSync(quiet, 'SeaBIOS\n')
    let t0 = Date.now()
    const grace = await checkBoot({ virsh: scripted([RUNNING]), name: 'vm8', graceSeconds: 0.2, timeoutSeconds: 30, pollMs: 25, serialLogPath: quiet })
    expect(Date.now() - t0).toBeLessThan(2000)
    expect(grace.verified).toBe(false)
    expect(grace.evidence).toContain('no boot evidence the migrator can read')
    t0 = Date.now()
    const waited = await checkBoot({
      virsh: scripted([RUNNING]),
      name: 'vm9',
      graceSeconds: 0.1,
      timeoutSeconds: 0.5,
      pollMs: 25,
      serialLogPath: quiet,
      expectEvidence: true,
    })
    expect(Date.now() - t0).toBeGreaterThanOrEqual(500)
    expect(waited.verified).toBe(false)
    expect(waited.evidence).toContain('its serial console showed neither a boot nor a failure')
  })

  test('abort signal: E_MIG_CANCELLED', async () => {
    const ac = new AbortController()
    setTimeout(() => ac.abort(), 100)
    const err = await thrown(() => checkBoot({ virsh: scripted([RUNNING]), name: 'vm5', graceSeconds: 30, timeoutSeconds: 30, pollMs: 20, signal: ac.signal }))
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
  })

  test('serialTail of a missing file is empty', async () => {
    expect(await serialTail(path.join(tmp.dir, 'nope.log'))).toEqual([])
    expect(await serialTail(undefined)).toEqual([])
  })
})
