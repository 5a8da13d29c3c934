/**
 * Real libvirt + qemu (TCG, `<domain type='qemu'>`): define and start domains over hand-made boot
 * disks (test/helpers/bootdisk.ts), the boot check reading the serial log, define failures, unique
 * names, UEFI secure boot. Every domain is destroyed and undefined; no qemu process is left running.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, existsSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { Virsh } from '../../lib/domain/virsh.ts'
import { defineAndStart } from '../../lib/domain/start.ts'
import { makeBadBootDisk, makeBootDisk, makePowerOffBootDisk } from '../helpers/bootdisk.ts'
import { cleanupDomains, ensureLibvirt, qemuPidsFor, TEST_LIBVIRT_URI } from '../helpers/libvirt.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'
import { disk, manifest } from './fixtures.ts'
import { expectMigThrown } from '../helpers/mig-error.ts'

const PREFIX = `migtest${process.pid}-`
const tmp = tempDir('mig-libvirt-')
// qemu runs as libvirt-qemu: it must be able to reach the disks and the serial logs.
chmodSync(tmp.dir, 0o755)
const virsh = new Virsh({ uri: TEST_LIBVIRT_URI })

beforeAll(async () => {
  await ensureLibvirt()
}, 30_000)

afterAll(async () => {
  await cleanupDomains(PREFIX)
  expect(await qemuPidsFor(PREFIX)).toEqual([])
  tmp.cleanup()
}, 30_000)

/** A one-disk BIOS Linux manifest named `<PREFIX><suffix>`, 64 MiB of memory, one NIC on user networking. */
function vm(suffix: string, over = {}) {
  return manifest({
    name: PREFIX + suffix,
    memory_bytes: 64 << 20,
    cpu: { count: 1, cores_per_socket: 1 },
    disks: [disk('boot', 8 << 20)],
    nics: [{ label: 'n', mac: '52:54:00:ab:cd:01', model: 'virtio', network: 'VM Network' }],
    ...over,
  })
}

async function dispose(name: string): Promise<void> {
  await virsh.destroy(name)
  await virsh.undefine(name)
  expect(await virsh.exists(name)).toBe(false)
}

describe('defineAndStart on real libvirt (TCG)', () => {
  test('a bootable disk starts, prints its marker to the serial log, and passes the boot check', async () => {
    const img = path.join(tmp.dir, 'ok.img')
    makeBootDisk(img, 'MIG-BOOT-OK-314159', 8 << 20)
    const serial = path.join(tmp.dir, 'ok.serial.log')
    const r = await defineAndStart({
      virsh,
      manifest: vm('ok'),
      volumes: [{ label: 'boot', path: img }],
      domainType: 'qemu',
      defaultBridge: null,
      serialLogPath: serial,
      bootCheck: { graceSeconds: 1, timeoutSeconds: 15, expectSerial: /MIG-BOOT-OK-314159/ },
    })
    expect(r.name).toBe(`${PREFIX}ok`)
    expect(r.started).toBe(true)
    expect(r.boot!.serialMatched).toBe(true)
    expect(r.boot!.state).toEqual({ state: 'running', reason: 'booted' })
    expect(readFileSync(serial, 'latin1')).toContain('MIG-BOOT-OK-314159\r\n')
    expect(await virsh.state(r.name)).toBe('running')
    const live = await virsh.run(['dumpxml', '--domain', r.name])
    expect(live.stdout).toContain(`<uuid>${r.uuid}</uuid>`)
    expect(live.stdout).toContain("<mac address='52:54:00:ab:cd:01'/>")
    expect(live.stdout).toContain("<interface type='user'>")
    await dispose(r.name)
  }, 30_000)

  test("no bootable disk (no 0x55AA): SeaBIOS's own message on the serial console -> E_MIG_GUEST_BOOT_FAILED at once, domain left defined and stopped", async () => {
    const img = path.join(tmp.dir, 'bad.img')
    makeBadBootDisk(img, 8 << 20)
    const serial = path.join(tmp.dir, 'bad.serial.log')
    const err = await thrown(() =>
      defineAndStart({
        virsh,
        manifest: vm('bad'),
        volumes: [{ label: 'boot', path: img }],
        domainType: 'qemu',
        defaultBridge: null,
        serialLogPath: serial,
        // The pattern only keeps the check waiting up to 20 s: the firmware's message must end it first.
        bootCheck: { graceSeconds: 1, timeoutSeconds: 20, expectSerial: /NEVER-PRINTED/ },
      }),
    )
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_GUEST_BOOT_FAILED')
    expect(err.message).toContain(`domain ${PREFIX}bad did not boot: the firmware found no bootable disk; state running (booted)`)
    expect(err.message).toContain('No bootable device')
    expect(err.details.waited_seconds).toBeLessThan(20)
    expect(err.details.domain).toBe(`${PREFIX}bad`)
    expect(await virsh.exists(`${PREFIX}bad`)).toBe(true)
    expect(await virsh.state(`${PREFIX}bad`)).toBe('shut off')
    await dispose(`${PREFIX}bad`)
  }, 30_000)

  test('a guest that powers itself off is not running after the grace period -> E_MIG_GUEST_BOOT_FAILED with the serial tail', async () => {
    const img = path.join(tmp.dir, 'off.img')
    makePowerOffBootDisk(img, 'MIG-GOING-DOWN', 8 << 20)
    const serial = path.join(tmp.dir, 'off.serial.log')
    const err = await thrown(() =>
      defineAndStart({
        virsh,
        manifest: vm('off'),
        volumes: [{ label: 'boot', path: img }],
        domainType: 'qemu',
        defaultBridge: null,
        serialLogPath: serial,
        bootCheck: { graceSeconds: 5, timeoutSeconds: 5 },
      }),
    )
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_GUEST_BOOT_FAILED')
    // Seen either while qemu is exiting (`in shutdown`) or after (`shut off`): both are not running.
    expect(['shut off', 'in shutdown']).toContain(err.details.state)
    // SeaBIOS's lines come first (<bios useserial='yes'/>), the disk's marker last.
    expect(err.details.serial_tail.at(-1)).toEndWith('MIG-GOING-DOWN')
    expect(err.message).toMatch(/the domain is not running; state (shut off|in shutdown)/)
    expect(await virsh.state(`${PREFIX}off`)).toBe('shut off')
    await dispose(`${PREFIX}off`)
  }, 30_000)

  test('plan.start === false defines only; unique names append -2, -3', async () => {
    const img = path.join(tmp.dir, 'dup.img')
    makeBootDisk(img, 'MIG-DUP', 8 << 20)
    const names: string[] = []
    for (let i = 0; i < 3; i++) {
      const r = await defineAndStart({
        virsh,
        manifest: vm('x'),
        plan: { name: `${PREFIX}dup`, start: false },
        volumes: [{ label: 'boot', path: img }],
        domainType: 'qemu',
        defaultBridge: null,
        serialLogPath: path.join(tmp.dir, 'dup.log'),
      })
      expect(r.started).toBe(false)
      expect(r.boot).toBeNull()
      names.push(r.name)
    }
    expect(names).toEqual([`${PREFIX}dup`, `${PREFIX}dup-2`, `${PREFIX}dup-3`])
    expect(await virsh.uniqueName(`${PREFIX}dup`)).toBe(`${PREFIX}dup-4`)
    for (const n of names) expect(await virsh.state(n)).toBe('shut off')
    for (const n of names) await dispose(n)
  }, 30_000)

  test('a name libvirt has by the define: the caller renames (given what libvirt has), and the domain gets that name', async () => {
    const taken = `${PREFIX}taken`
    await virsh.define(`<domain type='qemu'><name>${taken}</name><memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>`)
    const img = path.join(tmp.dir, 'taken.img')
    makeBootDisk(img, 'MIG-TAKEN', 8 << 20)
    const seen: string[][] = []
    const r = await defineAndStart({
      virsh,
      manifest: vm('x'),
      plan: { name: taken, start: false },
      volumes: [{ label: 'boot', path: img }],
      domainType: 'qemu',
      defaultBridge: null,
      serialLogPath: path.join(tmp.dir, 'taken.log'),
      rename: async (names) => {
        seen.push([...names].filter((n) => n.startsWith(PREFIX)))
        return `${PREFIX}renamed`
      },
    })
    expect(seen).toHaveLength(1)
    expect(seen[0]).toContain(taken)
    expect(r.name).toBe(`${PREFIX}renamed`)
    expect(await virsh.state(r.name)).toBe('shut off')
    await dispose(r.name)
    await dispose(taken)
  }, 30_000)

  test('XML libvirt rejects -> E_MIG_DOMAIN_DEFINE_FAILED with libvirt message', async () => {
    const noMemory = await expectMigThrown(
      () => virsh.define(`<domain type='qemu'><name>${PREFIX}nomem</name><os><type>hvm</type></os></domain>`),
      'E_MIG_DOMAIN_DEFINE_FAILED',
    )
    expect(noMemory.message).toMatch(/^virsh define failed: .*memory/i)

    // Same name, another UUID: libvirt refuses to redefine.
    const img = path.join(tmp.dir, 'rej.img')
    makeBootDisk(img, 'MIG-REJ', 8 << 20)
    const first = await defineAndStart({
      virsh,
      manifest: vm('rej'),
      plan: { start: false },
      volumes: [{ label: 'boot', path: img }],
      domainType: 'qemu',
      defaultBridge: null,
      serialLogPath: path.join(tmp.dir, 'rej.log'),
    })
    const dumped = (await virsh.run(['dumpxml', '--domain', first.name])).stdout
    await expectMigThrown(
      () => virsh.define(dumped.replace(first.uuid, '00000000-1111-4222-8333-444444444444')),
      'E_MIG_DOMAIN_DEFINE_FAILED',
      `domain '${first.name}' already exists with uuid ${first.uuid}`,
    )
    await dispose(first.name)

    // A volume that does not exist never reaches libvirt.
    const missing = await thrown(() =>
      defineAndStart({
        virsh,
        manifest: vm('gone'),
        volumes: [{ label: 'boot', path: path.join(tmp.dir, 'nope.img') }],
        domainType: 'qemu',
        defaultBridge: null,
        serialLogPath: path.join(tmp.dir, 'g.log'),
      }),
    )
    expect(missing).toBeInstanceOf(MigError)
    expect(missing.code).toBe('E_MIG_DOMAIN_DEFINE_FAILED')
    expect(await virsh.exists(`${PREFIX}gone`)).toBe(false)
  }, 30_000)

  test('start failure (qemu cannot open the disk) -> E_MIG_GUEST_BOOT_FAILED, domain stays defined', async () => {
    const img = path.join(tmp.dir, 'vanish.img')
    makeBootDisk(img, 'MIG-VANISH', 8 << 20)
    const serial = path.join(tmp.dir, 'vanish.log')
    const r = await defineAndStart({
      virsh,
      manifest: vm('vanish'),
      plan: { start: false },
      volumes: [{ label: 'boot', path: img }],
      domainType: 'qemu',
      defaultBridge: null,
      serialLogPath: serial,
    })
    const { rmSync } = await import('node:fs')
    rmSync(img)
    await expectMigThrown(() => virsh.start(r.name), 'E_MIG_GUEST_BOOT_FAILED', `virsh start ${r.name} failed:`, img)
    expect(await virsh.state(r.name)).toBe('shut off')
    await dispose(r.name)
  }, 30_000)

  test('UEFI secure boot domain (q35, SMM, OVMF secboot) defines and runs under TCG; undefine removes its NVRAM', async () => {
    const img = path.join(tmp.dir, 'efi.img')
    makeBootDisk(img, 'MIG-EFI', 8 << 20)
    const nvramDir = path.join(tmp.dir, 'nvram')
    mkdirSync(nvramDir, { mode: 0o755 })
    const r = await defineAndStart({
      virsh,
      manifest: vm('efi', { firmware: 'efi', secure_boot: true, memory_bytes: 256 << 20 }),
      volumes: [{ label: 'boot', path: img }],
      domainType: 'qemu',
      defaultBridge: null,
      serialLogPath: path.join(tmp.dir, 'efi.log'),
      nvramDir,
      bootCheck: { graceSeconds: 1, timeoutSeconds: 1 },
    })
    expect(r.boot!.state.state).toBe('running')
    const nvram = path.join(nvramDir, `${r.name}_VARS.fd`)
    expect(existsSync(nvram)).toBe(true)
    const live = (await virsh.run(['dumpxml', '--domain', r.name])).stdout
    expect(live).toContain("<loader readonly='yes' secure='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.secboot.fd</loader>")
    expect(live).toContain("<smm state='on'/>")
    await dispose(r.name)
    expect(existsSync(nvram)).toBe(false)
  }, 30_000)

  test("a carried UEFI variable store is the defined domain's NVRAM, removed with it; one of another flash size is not carried", async () => {
    const img = path.join(tmp.dir, 'nv.img')
    makeBootDisk(img, 'MIG-NV', 8 << 20)
    const nvramDir = path.join(tmp.dir, 'nvram-carried')
    mkdirSync(nvramDir, { mode: 0o755 })
    const store = Buffer.from(readFileSync('/usr/share/OVMF/OVMF_VARS_4M.fd'))
    store.write('MIGRATOR-CARRIED-STORE', 200_000, 'latin1')
    const define = (suffix: string, bytes: Buffer) =>
      defineAndStart({
        virsh,
        manifest: vm(suffix, { firmware: 'efi' }),
        plan: { start: false },
        volumes: [{ label: 'boot', path: img }],
        domainType: 'qemu',
        defaultBridge: null,
        serialLogPath: path.join(tmp.dir, 'nv.log'),
        nvramDir,
        inspect: false,
        nvram: { source_path: '/var/lib/libvirt/qemu/nvram/web01_VARS.fd', bytes },
      })
    const r = await define('nv', store)
    const file = path.join(nvramDir, `${r.name}_VARS.fd`)
    expect(r.hardware.nvram).toMatchObject({ carried: true, source_path: '/var/lib/libvirt/qemu/nvram/web01_VARS.fd', path: file, bytes: store.length })
    expect(r.hardware.uefi_boot?.method).toBe('nvram-carried')
    expect(readFileSync(file).equals(store)).toBe(true)
    expect((await virsh.run(['dumpxml', '--domain', r.name])).stdout).toContain(file)
    await dispose(r.name)
    expect(existsSync(file)).toBe(false)
    // a store of the 2 MiB flash layout does not fit the 4 MiB code image: the template is used
    const small = await define('nv-small', Buffer.alloc(128 * 1024, 0xff))
    expect([small.hardware.nvram?.carried, /another flash size/.test(small.hardware.nvram?.detail ?? ''), small.hardware.uefi_boot?.method]).toEqual([
      false,
      true,
      'not-inspected',
    ])
    expect(existsSync(path.join(nvramDir, `${small.name}_VARS.fd`))).toBe(false)
    await dispose(small.name)
  }, 30_000)

  test('virsh client: missing domains', async () => {
    expect(await virsh.exists(`${PREFIX}absent`)).toBe(false)
    await virsh.destroy(`${PREFIX}absent`)
    await virsh.undefine(`${PREFIX}absent`)
    await expectMigThrown(() => virsh.state(`${PREFIX}absent`), 'E_MIG_GUEST_BOOT_FAILED', `failed to get domain '${PREFIX}absent'`)
    const down = new Virsh({ uri: 'qemu:///nonexistent-socket-dir', timeoutMs: 5000, reconnectMs: 0 })
    await expectMigThrown(() => down.uniqueName('x'), 'E_MIG_DOMAIN_DEFINE_FAILED')
  }, 30_000)
})
