/**
 * The screen reader (lib/domain/screen.ts) with the real Tesseract on a real screenshot, and the
 * boot check's verdict on what it read. The screenshot is `virsh screenshot` of a Debian 12 guest
 * without `console=ttyS0` under TCG (fixtures/screens/): getty's prompt, then the kernel's late
 * messages written on the prompt's line and below it (virtio-gpu, kvm_amd, powernow-k8 on qemu's
 * default AMD CPU model). `virsh` is a test double that writes that file where `screenshot` asks
 * (no domain needed); Tesseract is the real one (`tesseract-ocr`, in .ci/install).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { copyFileSync, existsSync } from 'node:fs'
import * as path from 'node:path'
import { fileURLToPath } from 'node:url'
import { checkBoot, classifyScreen } from '../../lib/domain/boot-check.ts'
import { screenReader, type ScreenVirsh } from '../../lib/domain/screen.ts'
import { tempDir } from '../helpers/tmp.ts'

const SCREENS = path.join(path.dirname(fileURLToPath(import.meta.url)), '../../fixtures/screens')

/** A `virsh` double whose `screenshot --file F` copies `png` to F, and counts the calls. */
function screenshotOf(png: string): ScreenVirsh & { calls: number } {
  const v = {
    calls: 0,
    async run(args: string[]) {
      v.calls++
      const file = args[args.indexOf('--file') + 1]!
      copyFileSync(path.join(SCREENS, png), file)
      return { code: 0, stdout: '', stderr: '' }
    },
  }
  return v
}

const t = tempDir('mig-screen-test-')
const readers: Array<{ close(): Promise<void> }> = []
afterAll(async () => {
  for (const r of readers) await r.close()
  t.cleanup()
})

describe('screen reader (real Tesseract)', () => {
  test('a prompt followed by kernel messages on its line is a boot; an unchanged image is not read again', async () => {
    const virsh = screenshotOf('debian12-prompt-then-kernel-messages.png')
    const reader = await screenReader(virsh, 'scr-1', path.join(t.dir, 'scr-1.screen'))
    readers.push(reader)
    const text = await reader.read()
    expect(reader.unavailable).toBeNull()
    expect(text).toMatch(/login:/)
    expect(text).toMatch(/Power state transitions not supported/)
    expect(classifyScreen(text!)).toEqual({ verdict: 'booted', why: "a login prompt on the guest's screen (OCR)" })
    const t0 = performance.now()
    expect(await reader.read()).toBe(text)
    expect(performance.now() - t0).toBeLessThan(500)
    expect(virsh.calls).toBe(2)
    // the screenshot is the file it was given, removed by close()
    expect(existsSync(path.join(t.dir, 'scr-1.screen'))).toBe(true)
    await reader.close()
    expect(existsSync(path.join(t.dir, 'scr-1.screen'))).toBe(false)
  }, 60_000)

  test('the boot check verifies that screen by the screen', async () => {
    const reader = await screenReader(screenshotOf('debian12-prompt-then-kernel-messages.png'), 'scr-2', path.join(t.dir, 'scr-2.screen'))
    readers.push(reader)
    const r = await checkBoot({
      virsh: { stateDetail: async () => ({ state: 'running', reason: 'booted' }) },
      name: 'scr-2',
      graceSeconds: 0,
      timeoutSeconds: 60,
      pollMs: 50,
      expectEvidence: true,
      screen: reader,
      screenEveryMs: 100,
    })
    expect(r).toMatchObject({ verified: true, source: 'screen', evidence: "a login prompt on the guest's screen (OCR)" })
  }, 60_000)
})
