/**
 * The hardware choice (lib/domain/hardware.ts) over inspection results, the serial console
 * classification of the boot check (lib/domain/boot-check.ts classifySerial), the disk layout probe
 * and the grub.cfg / fstab / module-list parsers of lib/domain/inspect.ts. The inspection results
 * here are written by hand; the real libguestfs inspection of real guests runs in
 * test/engine/real-guests.guest.integ.test.ts.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { classifySerial } from '../../lib/domain/boot-check.ts'
import { chooseHardware } from '../../lib/domain/hardware.ts'
import { grubDefaultEntry, inspectGuest, moduleNames, parseFstab, probeDiskLayout, type GuestInspection } from '../../lib/domain/inspect.ts'
import { bootSector } from '../../fixtures/bootdisk.ts'
import { tempDir } from '../helpers/tmp.ts'

const tmp = tempDir('mig-hw-')
afterAll(() => tmp.cleanup())

const ROOT_UUID = '2f4c6f0e-1d2b-4c43-9a54-5f1a6f0b7e11'

function linux(over: Partial<GuestInspection> = {}): GuestInspection {
  return {
    inspected: true,
    skipped: null,
    layout: { partitioned: true, filesystem: false, biosBootCode: true },
    os: { type: 'linux', distro: 'debian', product: 'Debian GNU/Linux 12 (bookworm)' },
    filesystems: [
      { device: '/dev/sda2', type: 'vfat', uuid: 'ABCD-1234', label: 'ESP' },
      { device: '/dev/sda3', type: 'ext4', uuid: ROOT_UUID, label: 'root' },
    ],
    fstab: [{ spec: `UUID=${ROOT_UUID}`, mountpoint: '/', type: 'ext4' }],
    kernelVersion: '6.1.0-50-amd64',
    kernelCmdline: `root=UUID=${ROOT_UUID} ro console=ttyS0,115200n8`,
    rootSpec: `UUID=${ROOT_UUID}`,
    initramfs: '/boot/initrd.img-6.1.0-50-amd64',
    initramfsModules: ['ahci', 'libahci', 'sd_mod', 'virtio_blk', 'virtio_pci', 'virtio_scsi', 'vmw_pvscsi', 'mptsas', 'ext4'],
    builtinModules: [],
    installedModules: ['virtio_net', 'vmxnet3', 'e1000e', 'e1000'],
    esp: true,
    esps: [],
    network: null,
    mounts: [{ mountpoint: '/', device: '/dev/sda3' }],
    seconds: 1,
    ...over,
  }
}
const BIOS = { manifest: 'bios' as const }

describe('chooseHardware', () => {
  test('generic initramfs: virtio-blk and virtio NIC, serial console seen', () => {
    const c = chooseHardware(linux(), 'linux', BIOS)
    expect([c.disk_bus, c.bus, c.nic_model, c.firmware, c.fatal, c.serialConsole]).toEqual(['virtio-blk', 'virtio', 'virtio', 'bios', null, true])
    expect(c.reason).toContain('disk bus virtio-blk: initramfs /boot/initrd.img-6.1.0-50-amd64 has virtio_blk, virtio_pci')
  })

  test('host-only initramfs for PVSCSI / SATA: the controller the guest has drivers for; LSI SAS only: no bus qemu emulates, fatal unless converted (convertible)', () => {
    const pv = chooseHardware(linux({ initramfsModules: ['vmw_pvscsi', 'sd_mod', 'ext4'] }), 'linux', BIOS)
    expect([pv.disk_bus, pv.bus, pv.scsiModel, pv.fatal]).toEqual(['pvscsi', 'scsi', 'vmpvscsi', null])
    expect(pv.reason).toContain('has vmw_pvscsi but no virtio_blk/virtio_scsi')
    const sas = chooseHardware(linux({ initramfsModules: ['mptsas', 'mptscsih', 'mptbase', 'sd_mod'] }), 'linux', BIOS)
    // qemu's mptsas1068 presents no disk to Linux's mptsas (measured): no bootable bus, a fatal verdict naming the fix.
    expect(sas.scsiModel).toBeNull()
    expect(sas.fatal).toContain("it has mptsas (LSI Logic SAS) only, and qemu's LSI SAS 1068 emulation presents no disk")
    expect(sas.fatal).toContain('add virtio_blk')
    // ... which a conversion (virt-v2v-in-place) mends: the only fault is the missing driver.
    expect(sas.convertible).toBe(true)
    expect(pv.convertible).toBe(false)
    const sata = chooseHardware(linux({ initramfsModules: ['ahci', 'libahci', 'sd_mod'] }), 'linux', BIOS)
    expect([sata.disk_bus, sata.bus, sata.scsiModel]).toEqual(['sata', 'sata', null])
  })

  test('/dev/sdX names: a bus that names disks sdX (virtio-scsi), never virtio-blk', () => {
    const c = chooseHardware(linux({ rootSpec: '/dev/sda3', fstab: [{ spec: '/dev/sda3', mountpoint: '/', type: 'ext4' }] }), 'linux', BIOS)
    expect([c.disk_bus, c.scsiModel]).toEqual(['virtio-scsi', 'virtio-scsi'])
    expect(c.reason).toContain('names its root disk /dev/sdX (/dev/sda3)')
  })

  test('static evidence of a guest that cannot boot: missing root UUID, no driver at all', () => {
    const gone = chooseHardware(linux({ rootSpec: 'UUID=00000000-dead-beef-0000-000000000000' }), 'linux', BIOS)
    expect(gone.fatal).toContain('the kernel would not find its root device UUID=00000000-dead-beef-0000-000000000000')
    const none = chooseHardware(linux({ initramfsModules: ['ext4', 'hv_storvsc'] }), 'linux', BIOS)
    expect(none.fatal).toContain('initramfs /boot/initrd.img-6.1.0-50-amd64 has no driver for virtio-blk (virtio_blk)')
    // A missing root file system is not mended by a conversion; a missing driver is.
    expect([gone.convertible, none.convertible]).toEqual([false, true])
    const both = chooseHardware(linux({ rootSpec: 'UUID=00000000-dead-beef-0000-000000000000', initramfsModules: ['mptsas', 'sd_mod'] }), 'linux', BIOS)
    expect([both.fatal?.includes('root device'), both.convertible]).toEqual([true, false])
    // Kernel built-ins count as drivers the boot path has.
    const builtin = chooseHardware(linux({ initramfs: null, initramfsModules: [], builtinModules: ['virtio_blk', 'virtio_pci'] }), 'linux', BIOS)
    expect([builtin.disk_bus, builtin.fatal]).toEqual(['virtio-blk', null])
  })

  test('NIC: the first model whose driver the guest has installed', () => {
    expect(chooseHardware(linux({ installedModules: ['vmxnet3', 'e1000'] }), 'linux', BIOS).nic_model).toBe('vmxnet3')
    expect(chooseHardware(linux({ installedModules: ['e1000'] }), 'linux', BIOS).nic_model).toBe('e1000')
  })

  test('firmware: plan wins; a disk without BIOS boot code but with an ESP starts on UEFI', () => {
    const efi = linux({ layout: { partitioned: true, filesystem: false, biosBootCode: false } })
    expect(chooseHardware(efi, 'linux', BIOS).firmware).toBe('efi')
    expect(chooseHardware(efi, 'linux', { plan: 'bios', manifest: 'bios' }).firmware).toBe('bios')
    expect(chooseHardware(linux(), 'linux', BIOS).firmware).toBe('bios')
  })

  test('not inspected, no OS, Windows: the family defaults, no serial evidence expected', () => {
    const skipped = chooseHardware(
      {
        ...linux(),
        inspected: false,
        skipped: 'the boot disk has no partition table nor file system',
        layout: { partitioned: false, filesystem: false, biosBootCode: true },
      },
      'linux',
      BIOS,
    )
    expect([skipped.disk_bus, skipped.nic_model, skipped.serialConsole]).toEqual(['virtio-blk', 'virtio', false])
    expect(skipped.reason).toContain('not inspected (the boot disk has no partition table nor file system)')
    expect(chooseHardware(null, 'unknown', BIOS).disk_bus).toBe('sata')
    // A failed inspection of a partitioned disk: defaults, but the boot check waits for serial evidence.
    const failed = chooseHardware({ ...linux(), inspected: false, skipped: 'libguestfs inspection failed: guestfish run: exit status -1' }, 'linux', BIOS)
    expect([failed.disk_bus, failed.serialConsole]).toEqual(['virtio-blk', true])
    const win = chooseHardware(null, 'windows', BIOS)
    expect([win.disk_bus, win.nic_model]).toEqual(['sata', 'e1000'])
    expect(chooseHardware(linux({ os: null }), 'linux', BIOS).reason).toContain('libguestfs found no operating system')
  })
})

describe('classifySerial', () => {
  test('failures: initramfs-tools root wait, initramfs shell, panic, emergency mode, no bootable device', () => {
    const initramfs = [
      'Begin: Waiting for root file system ... Begin: Running /scripts/local-block ... done.',
      'done.',
      'Gave up waiting for root file system device.  Common problems:',
      ' - Boot args (cat /proc/cmdline)',
      'ALERT!  UUID=00000000-dead-beef-0000-000000000000 does not exist.  Dropping to a shell!',
      '',
      'BusyBox v1.35.0 (Debian 1:1.35.0-4+b3) built-in shell (ash)',
      '(initramfs) ',
    ].join('\r\n')
    expect(classifySerial(initramfs)).toEqual({
      verdict: 'failed',
      why: 'the kernel could not find its root device UUID=00000000-dead-beef-0000-000000000000 (initramfs gave up waiting for it)',
    })
    expect(classifySerial('BusyBox\n(initramfs) ')!.why).toBe('the guest dropped to the initramfs shell')
    // the line before the ALERT that names the device is no verdict yet; without an ALERT, the
    // shell prompt after it is
    const gaveUp = initramfs.slice(0, initramfs.indexOf('ALERT!'))
    expect(classifySerial(gaveUp)).toBeNull()
    expect(classifySerial(`${gaveUp}\r\n(initramfs) `)!.why).toBe('the kernel could not find its root device (initramfs gave up waiting for it)')
    expect(classifySerial('[    2.1] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n')!.why).toBe(
      'the guest kernel panicked: VFS: Unable to mount root fs on unknown-block(0,0)',
    )
    expect(classifySerial('You are in emergency mode. After logging in, type "journalctl -xb"')!.verdict).toBe('failed')
    expect(classifySerial('No bootable device.\n')!.why).toBe('the firmware found no bootable disk')
    expect(classifySerial('grub rescue> ')!.why).toContain('GRUB could not load the kernel')
    // Not final: SeaBIOS goes on to the next device, GRUB boots without its locale file.
    expect(classifySerial('Booting from Floppy...\r\nBoot failed: not a bootable disk\r\nBooting from Hard Disk...\r\n')).toBeNull()
    expect(classifySerial("error: file `/boot/grub/locale/en.mo.gz' not found.\r\nLoading Linux 6.1.0-28-amd64 ...\r\n")).toBeNull()
  })

  test('successes: a login prompt, systemd multi-user target; nothing recognizable is null', () => {
    expect(classifySerial('Debian GNU/Linux 12 migrator-guest ttyS0\r\n\r\nmigrator-guest login: ')).toEqual({
      verdict: 'booted',
      why: 'a login prompt on the serial console',
    })
    // A kernel console message printed right after the prompt, on its line (seen in CI: a guest
    // running virt-sysprep's firstboot scripts); before this case the boot went unverified for 600 s.
    expect(classifySerial('migrator-guest login: [   42.685758] firstboot.sh[303]: Ign:1 http://deb.debian.org/debian bookworm InRelease\r\n')!.why).toBe(
      'a login prompt on the serial console',
    )
    expect(classifySerial('Password for login: wrong\r\n')).toBeNull()
    expect(classifySerial('[  OK  ] Reached target \x1b[0;1;39mmulti-user.target\x1b[0m - Multi-User System.')!.verdict).toBe('booted')
    expect(classifySerial('SeaBIOS (version 1.16.2-debian-1.16.2-1)\nBooting from Hard Disk...\nMIGRATOR-E2E-BOOT\n')).toBeNull()
    // A failure wins over a later-looking success line.
    expect(classifySerial('login: \nKernel panic - not syncing: Attempted to kill init!')!.verdict).toBe('failed')
  })
})

describe('inspection helpers', () => {
  test('probeDiskLayout: a bare boot sector is neither partitioned nor a file system', async () => {
    const f = path.join(tmp.dir, 'bs.raw')
    const buf = Buffer.alloc(1 << 20)
    bootSector('HELLO').copy(buf, 0)
    writeFileSync(f, buf)
    expect(await probeDiskLayout(f)).toEqual({ partitioned: false, filesystem: false, biosBootCode: true })
    buf.write('EFI PART', 512, 'latin1')
    buf.fill(0, 0, 440)
    writeFileSync(f, buf)
    expect(await probeDiskLayout(f)).toEqual({ partitioned: true, filesystem: false, biosBootCode: false })
    expect(await probeDiskLayout(path.join(tmp.dir, 'missing.raw'))).toEqual({ partitioned: false, filesystem: false, biosBootCode: false })
  })

  test('inspectGuest: a bare ext4 file system without boot code is not inspected (no firmware boots it), at once', async () => {
    const f = path.join(tmp.dir, 'bare-ext4.raw')
    writeFileSync(f, Buffer.alloc(0))
    execFileSync('truncate', ['-s', '16M', f])
    execFileSync('mkfs.ext4', ['-q', '-F', f])
    expect(await probeDiskLayout(f)).toEqual({ partitioned: false, filesystem: true, biosBootCode: false })
    const t0 = Date.now()
    const r = await inspectGuest([f], { tcg: true })
    expect([r.inspected, r.skipped]).toEqual([false, expect.stringContaining('bare file system without boot code')])
    expect(Date.now() - t0).toBeLessThan(2000)
  })

  test('grub.cfg default entry, fstab, module names', () => {
    const cfg = [
      "menuentry 'Debian GNU/Linux' --class debian {",
      '        insmod ext2',
      `        linux   /boot/vmlinuz-6.1.0-50-amd64 root=UUID=${ROOT_UUID} ro console=ttyS0,115200n8`,
      '        initrd  /boot/initrd.img-6.1.0-50-amd64',
      '}',
      "menuentry 'old' { linux /boot/vmlinuz-6.1.0-40-amd64 root=/dev/sda1 }",
    ].join('\n')
    expect(grubDefaultEntry(cfg)).toEqual({
      kernel: '/boot/vmlinuz-6.1.0-50-amd64',
      version: '6.1.0-50-amd64',
      cmdline: `root=UUID=${ROOT_UUID} ro console=ttyS0,115200n8`,
      initrd: '/boot/initrd.img-6.1.0-50-amd64',
    })
    expect(grubDefaultEntry('set timeout=5\n')).toBeNull()
    expect(parseFstab('# comment\nUUID=x / ext4 errors=remount-ro 0 1\n\n/dev/sdb1\t/data xfs defaults 0 2\n')).toEqual([
      { spec: 'UUID=x', mountpoint: '/', type: 'ext4' },
      { spec: '/dev/sdb1', mountpoint: '/data', type: 'xfs' },
    ])
    expect(
      moduleNames([
        'usr/lib/modules/6.1.0/kernel/drivers/scsi/vmw_pvscsi.ko',
        'kernel/drivers/ata/ahci.ko.xz: kernel/drivers/ata/libahci.ko.xz',
        'kernel/fs/ext4/ext4.ko.zst',
        'etc/modprobe.d',
        'kernel/drivers/net/virtio-net.ko',
      ]),
    ).toEqual(['ahci', 'ext4', 'virtio_net', 'vmw_pvscsi'])
  })
})
