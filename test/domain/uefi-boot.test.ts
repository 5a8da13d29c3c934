/**
 * lib/domain/uefi-boot.ts: which loader OVMF gets (pure rules), and the fallback loader written
 * into a real FAT file system (mkfs.vfat) at an offset inside a disk image, through mtools.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import type { EspInfo } from '../../lib/domain/inspect.ts'
import { installFallbackLoader, planUefiBoot } from '../../lib/domain/uefi-boot.ts'
import { tempDir } from '../helpers/tmp.ts'

const tmp = tempDir('mig-uefi-boot-')
afterAll(() => tmp.cleanup())

const esp = (loaders: string[], over: Partial<EspInfo> = {}): EspInfo => ({
  device: '/dev/sda1',
  disk: 0,
  partition: 1,
  offsetBytes: 1 << 20,
  loaders,
  ...over,
})
const MT = { ...process.env, MTOOLS_SKIP_CHECK: '1' }

describe('planUefiBoot', () => {
  test('the removable path, when present, is used as it is', () => {
    const p = planUefiBoot([esp(['/EFI/BOOT/BOOTX64.EFI', '/EFI/debian/grubx64.efi'])])
    expect(p.copy).toBeNull()
    expect(p.record).toMatchObject({ method: 'removable-path', loader: '\\EFI\\BOOT\\BOOTX64.EFI' })
    expect(planUefiBoot([esp(['/efi/boot/bootx64.efi'])]).record.method).toBe('removable-path')
  })

  test('shim wins over GRUB; GRUB alone; Windows boot manager', () => {
    const shim = planUefiBoot([esp(['/EFI/debian/grubx64.efi', '/EFI/debian/mmx64.efi', '/EFI/debian/shimx64.efi'])])
    expect(shim.record).toMatchObject({ method: 'fallback-installed', loader: '\\EFI\\debian\\shimx64.efi' })
    expect(shim.copy).toMatchObject({ dir: '/EFI/debian', loader: '/EFI/debian/shimx64.efi' })
    // A shim of another vendor on a second ESP still wins over GRUB on the first.
    const two = planUefiBoot([esp(['/EFI/ubuntu/grubx64.efi']), esp(['/EFI/redhat/shimx64.efi'], { device: '/dev/sdb1', disk: 1 })])
    expect(two.record.loader).toBe('\\EFI\\redhat\\shimx64.efi')
    expect(two.copy?.esp.disk).toBe(1)
    expect(planUefiBoot([esp(['/EFI/debian/grubx64.efi'])]).record.loader).toBe('\\EFI\\debian\\grubx64.efi')
    expect(planUefiBoot([esp(['/EFI/Microsoft/Boot/bootmgfw.efi'])]).copy?.dir).toBe('/EFI/Microsoft/Boot')
  })

  test('no loader: method none, naming what is there', () => {
    expect(planUefiBoot([esp([])]).record).toEqual({ method: 'none', loader: null, detail: 'no boot loader on the EFI system partition /dev/sda1' })
    expect(planUefiBoot([esp(['/EFI/tools/memtest.efi'])]).record.detail).toContain('(only \\EFI\\tools\\memtest.efi)')
    expect(planUefiBoot([]).record.detail).toBe('the guest has no EFI system partition (no FAT file system)')
  })
})

describe('installFallbackLoader on a real FAT at an offset', () => {
  test('copies the loader directory to \\EFI\\BOOT, the loader as BOOTX64.EFI, not fbx64.efi; the bytes are the loader', async () => {
    const part = path.join(tmp.dir, 'esp.fat')
    execFileSync('mkfs.vfat', ['-C', part, '32768'], { stdio: 'ignore' })
    const files: Record<string, string> = { 'shimx64.efi': 'SHIM', 'grubx64.efi': 'GRUB', 'fbx64.efi': 'FALLBACK', 'BOOTX64.CSV': 'csv' }
    execFileSync('mmd', ['-i', part, '::/EFI', '::/EFI/debian'], { env: MT })
    for (const [f, body] of Object.entries(files)) {
      writeFileSync(path.join(tmp.dir, f), body)
      execFileSync('mcopy', ['-i', part, path.join(tmp.dir, f), `::/EFI/debian/${f}`], { env: MT })
    }
    // The FAT at 1 MiB inside a disk image, as a partition.
    const disk = path.join(tmp.dir, 'disk.img')
    writeFileSync(disk, Buffer.concat([Buffer.alloc(1 << 20), readFileSync(part)]))
    const plan = planUefiBoot([esp(['/EFI/debian/fbx64.efi', '/EFI/debian/grubx64.efi', '/EFI/debian/shimx64.efi'])])
    const rec = await installFallbackLoader(plan, disk)
    expect(rec.method).toBe('fallback-installed')
    const listing = execFileSync('mdir', ['-i', `${disk}@@${1 << 20}`, '-b', '::/EFI/BOOT'], { encoding: 'utf8', env: MT }).toUpperCase()
    expect(listing).toContain('BOOTX64.EFI')
    expect(listing).toContain('GRUBX64.EFI')
    expect(listing).toContain('BOOTX64.CSV')
    expect(listing).not.toContain('FBX64.EFI')
    const out = path.join(tmp.dir, 'out.efi')
    execFileSync('mcopy', ['-i', `${disk}@@${1 << 20}`, '-n', '::/EFI/BOOT/BOOTX64.EFI', out], { env: MT })
    expect(readFileSync(out, 'utf8')).toBe('SHIM')
    // The source directory is left as it was.
    expect(execFileSync('mdir', ['-i', `${disk}@@${1 << 20}`, '-b', '::/EFI/debian'], { encoding: 'utf8', env: MT }).toUpperCase()).toContain('FBX64.EFI')
  })

  test('a qcow2 image (a test boot overlay): E_MIG_GUEST_BOOT_FAILED before mtools touches it', async () => {
    const disk = path.join(tmp.dir, 'overlay.qcow2')
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '64M'])
    const before = readFileSync(disk)
    const err = await installFallbackLoader(planUefiBoot([esp(['/EFI/debian/grubx64.efi'])]), disk, undefined, 'qcow2').catch((e) => e)
    expect([err.code, err.message]).toEqual([
      'E_MIG_GUEST_BOOT_FAILED',
      `the ESP has no \\EFI\\BOOT\\BOOTX64.EFI and its disk ${disk} is a qcow2 image, which the fallback loader cannot be written to (the real start writes it on the raw volume)`,
    ])
    expect(readFileSync(disk).equals(before)).toBe(true)
  })

  test('a volume mtools cannot read: E_MIG_GUEST_BOOT_FAILED naming the command', async () => {
    const bad = path.join(tmp.dir, 'zero.img')
    writeFileSync(bad, Buffer.alloc(2 << 20))
    const plan = planUefiBoot([esp(['/EFI/debian/grubx64.efi'])])
    await expect(installFallbackLoader(plan, bad)).rejects.toMatchObject({ code: 'E_MIG_GUEST_BOOT_FAILED', message: expect.stringContaining('mcopy -i') })
  })
})
