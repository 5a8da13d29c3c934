/**
 * The real `virt-v2v-in-place` (Debian 12: virt-v2v 2.2 + libguestfs, direct backend, TCG) over a
 * disk that holds no operating system (only the hand-made boot sector): inspection finds no root
 * device, the tool fails, the preparer rolls the volume back and throws E_MIG_V2V_FAILED with the
 * tool's error. No Windows image nor virtio-win ISO can be had here (DESIGN.md section 6), so the
 * success path is covered by the test double in preparer.test.ts. Takes ~30 s (appliance boot under TCG).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { copyFileSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { V2vPreparer } from '../../lib/v2v/preparer.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'
import { manifest } from '../domain/fixtures.ts'

const tmp = tempDir('mig-v2v-real-')
afterAll(() => tmp.cleanup())

describe('virt-v2v-in-place (real)', () => {
  test('a disk without an OS: E_MIG_V2V_FAILED with the inspection error, volume rolled back', async () => {
    const vol = path.join(tmp.dir, 'nothing.img')
    makeBootDisk(vol, 'NO-OS-HERE', 64 << 20)
    const iso = path.join(tmp.dir, 'virtio-win.iso')
    writeFileSync(iso, '')
    const sha = () => createHash('sha256').update(readFileSync(vol)).digest('hex')
    const before = sha()
    const calls: string[] = []
    const messages: string[] = []
    const p = new V2vPreparer({ virtioWinIso: iso, env: { LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' } })
    const err = await thrown(() =>
      p.run([{ label: 'C', path: vol }], manifest({ guest_os: { family: 'windows', id: 'windows9_64Guest' } }), {
        onProgress: (x) => x.message && messages.push(x.message),
        snapshot: {
          take: async () => {
            calls.push('take')
            copyFileSync(vol, `${vol}.snap`)
          },
          rollback: async () => {
            calls.push('rollback')
            copyFileSync(`${vol}.snap`, vol)
          },
          release: async () => {
            calls.push('release')
            rmSync(`${vol}.snap`)
          },
        },
      }),
    )
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_V2V_FAILED')
    expect(err.message).toContain('virt-v2v-in-place exited with status 1; volumes rolled back:')
    expect(err.message).toContain('inspection could not detect the source guest')
    expect(err.details.rolled_back).toBe(true)
    expect(err.details.last_lines.join('\n')).toContain('No root device found in this operating system image.')
    expect(messages).toEqual(expect.arrayContaining([`Setting up the source: -i disk ${vol}`, 'Opening the source', 'Inspecting the source']))
    expect(calls).toEqual(['take', 'rollback', 'release'])
    expect(sha()).toBe(before)
    // No appliance qemu left behind.
    let left = ''
    try {
      left = execFileSync('pgrep', ['-f', vol], { encoding: 'utf8' })
    } catch {
      left = ''
    }
    expect(left).toBe('')
  }, 120_000)
})
