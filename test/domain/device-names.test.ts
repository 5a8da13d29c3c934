/**
 * The device name rewrite (lib/domain/device-names.ts) on real guest texts: a hand-written fstab
 * with the data disk and swap by device, Debian's grub.cfg and /etc/default/grub, crypttab,
 * initramfs-tools' resume setting; and hostile input (huge files, NUL bytes, unknown devices,
 * odd spacing, comments).
 */
import { describe, expect, test } from 'bun:test'
import { applianceName, parseBlkid, planDeviceNames, planGuestDeviceNames, whyRewrite, type BlockId } from '../../lib/domain/device-names.ts'

const ROOT = '6a0c2f5e-6b8e-4f7a-9e0b-1f2d3c4b5a69'
const SWAP = '0d5d4d61-2a9b-4a53-8e61-c3a5a1a9f001'
const SRV = 'c1b3a6e2-0f65-4c21-9d0c-7d6f3c2e9a10'
const LUKS = '3f6c7c1e-9a2b-4e8d-b1a0-5e4d3c2b1a00'
const IDS: BlockId[] = [
  { device: '/dev/sda1', uuid: '', partuuid: 'e2a1c3d4-0000-4000-8000-000000000001', type: '' },
  { device: '/dev/sda3', uuid: ROOT, partuuid: 'e2a1c3d4-0000-4000-8000-000000000003', type: 'ext4' },
  { device: '/dev/sda4', uuid: SWAP, partuuid: 'e2a1c3d4-0000-4000-8000-000000000004', type: 'swap' },
  { device: '/dev/sdb1', uuid: SRV, partuuid: '5c0ffee0-01', type: 'ext4' },
  { device: '/dev/sdc', uuid: LUKS, partuuid: '', type: 'crypto_LUKS' },
]

const FSTAB = `# /etc/fstab: static file system information.
#
# <file system> <mount point>   <type>  <options>       <dump>  <pass>
UUID=${ROOT} /               ext4    errors=remount-ro 0       1
/dev/sdb1 /srv ext4 defaults 0 2
/dev/sda4	none	swap	sw	0	0
  /dev/sdz9 /mnt/gone ext4 noauto 0 0
/dev/sr0        /media/cdrom0   udf,iso9660 user,noauto     0       0
tmpfs /tmp tmpfs defaults 0 0
`

const GRUB_CFG = `### BEGIN /etc/grub.d/10_linux ###
menuentry 'Debian GNU/Linux' --class debian --class gnu-linux --class gnu --class os $menuentry_id_option 'gnulinux-simple-${ROOT}' {
	load_video
	insmod part_gpt
	insmod ext2
	set root='hd0,gpt3'
	search --no-floppy --fs-uuid --set=root ${ROOT}
	echo	'Loading Linux 6.1.0-50-amd64 ...'
	linux	/boot/vmlinuz-6.1.0-50-amd64 root=/dev/sda3 ro resume=/dev/sda4 quiet
	echo	'Loading initial ramdisk ...'
	initrd	/boot/initrd.img-6.1.0-50-amd64
}
`

const DEFAULT_GRUB = `GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_CMDLINE_LINUX_DEFAULT="quiet resume=/dev/sda4"
GRUB_CMDLINE_LINUX="root=/dev/sda3 console=ttyS0,115200n8"
# GRUB_CMDLINE_LINUX="root=/dev/sda3"
`

const virtio = { family: 'vd' as const, disks: 2, initramfs: true }

describe('device names: what breaks on the destination', () => {
  test('a family the bus does not give, hdX everywhere, sdX with several disks on a SCSI bus', () => {
    expect(whyRewrite('/dev/sdb1', virtio)).toContain('virtio-blk, where the kernel names them /dev/vdX')
    expect(whyRewrite('/dev/vda1', { family: 'sd', disks: 1, initramfs: true })).toContain('SCSI/SATA bus')
    expect(whyRewrite('/dev/hda1', { family: 'sd', disks: 1, initramfs: true })).toContain('no /dev/hdX')
    expect(whyRewrite('/dev/sdb1', { family: 'sd', disks: 2, initramfs: true })).toContain('in the order it probes them')
    // One disk on a bus of the same family keeps its letter; UUID=, LABEL=, LVM and cdrom names are no disk names.
    expect(whyRewrite('/dev/sda3', { family: 'sd', disks: 1, initramfs: true })).toBeNull()
    expect(whyRewrite('/dev/vdb1', { family: 'vd', disks: 2, initramfs: true })).toBeNull()
    for (const s of [`UUID=${ROOT}`, 'LABEL=root', '/dev/mapper/vg0-root', '/dev/sr0', '/dev/sda1/../../etc', '/dev/sdaaaa1'])
      expect(whyRewrite(s, virtio)).toBeNull()
    expect([applianceName('/dev/vdb1'), applianceName('/dev/hdc'), applianceName('/dev/xvda1')]).toEqual(['/dev/sdb1', '/dev/sdc', null])
  })
})

describe('device names: the rewrite on real texts', () => {
  test('fstab: the data disk and swap by device become UUID=, the rest unchanged byte for byte; an unknown disk is kept and reported', () => {
    const p = planDeviceNames([{ path: '/etc/fstab', text: FSTAB }], IDS, virtio)
    expect(p.writes).toHaveLength(1)
    const out = p.writes[0]!.content
    expect(p.writes[0]!.expect).toBe(FSTAB)
    expect(out).toContain(`UUID=${SRV} /srv ext4 defaults 0 2\n`)
    expect(out).toContain(`UUID=${SWAP}\tnone\tswap\tsw\t0\t0\n`)
    // Comments, the root by UUID, the cdrom, tmpfs and the layout are untouched.
    expect(out.split('\n').filter((l) => !/sdb1|sda4|UUID=(c1b3|0d5d)/.test(l))).toEqual(FSTAB.split('\n').filter((l) => !/sdb1|sda4/.test(l)))
    expect(out).toContain('  /dev/sdz9 /mnt/gone ext4 noauto 0 0\n')
    expect(p.rewritten.map((c) => [c.line, c.what, c.from, c.to])).toEqual([
      [5, 'fstab /srv (ext4)', '/dev/sdb1', `UUID=${SRV}`],
      [6, 'fstab none (swap)', '/dev/sda4', `UUID=${SWAP}`],
    ])
    expect(p.rewritten[0]!.why).toContain('/dev/sdb1 would not exist')
    expect(p.kept).toEqual([
      expect.objectContaining({ line: 7, from: '/dev/sdz9', to: null, why: expect.stringContaining('no disk or partition of the guest is /dev/sdz9') }),
    ])
  })

  test("grub.cfg and /etc/default/grub: root= and resume= on the kernel's lines only; GRUB's own root and comments untouched", () => {
    const p = planDeviceNames(
      [
        { path: '/boot/grub/grub.cfg', text: GRUB_CFG },
        { path: '/etc/default/grub', text: DEFAULT_GRUB },
      ],
      IDS,
      virtio,
    )
    const cfg = p.writes.find((w) => w.path === '/boot/grub/grub.cfg')!.content
    expect(cfg).toContain(`linux\t/boot/vmlinuz-6.1.0-50-amd64 root=UUID=${ROOT} ro resume=UUID=${SWAP} quiet\n`)
    expect(cfg).toContain("set root='hd0,gpt3'")
    const dflt = p.writes.find((w) => w.path === '/etc/default/grub')!.content
    expect(dflt).toContain(`GRUB_CMDLINE_LINUX_DEFAULT="quiet resume=UUID=${SWAP}"`)
    expect(dflt).toContain(`GRUB_CMDLINE_LINUX="root=UUID=${ROOT} console=ttyS0,115200n8"`)
    expect(dflt).toContain('# GRUB_CMDLINE_LINUX="root=/dev/sda3"')
    expect(p.rewritten.map((c) => `${c.file}:${c.line} ${c.what}`)).toEqual([
      '/boot/grub/grub.cfg:9 kernel root=',
      '/boot/grub/grub.cfg:9 kernel resume=',
      '/etc/default/grub:3 kernel resume=',
      '/etc/default/grub:4 kernel root=',
    ])
  })

  test('a kernel without an initramfs gets root=PARTUUID= (the kernel resolves it itself); a whole disk without one is kept', () => {
    const noInitrd = { ...virtio, initramfs: false }
    const p = planDeviceNames([{ path: '/boot/grub/grub.cfg', text: GRUB_CFG }], IDS, noInitrd)
    expect(p.writes[0]!.content).toContain('root=PARTUUID=e2a1c3d4-0000-4000-8000-000000000003 ro resume=UUID=')
    const whole = planDeviceNames([{ path: '/boot/grub/grub.cfg', text: 'linux /vmlinuz root=/dev/sdc\n' }], IDS, noInitrd)
    expect(whole.writes).toEqual([])
    expect(whole.kept[0]!.why).toContain('has no partition UUID')
  })

  test('crypttab (the source device) and initramfs-tools resume (quoted or not)', () => {
    const p = planDeviceNames(
      [
        { path: '/etc/crypttab', text: '# <target name> <source device> <key file> <options>\ncrypt-data /dev/sdc none luks,discard\n' },
        { path: '/etc/initramfs-tools/conf.d/resume', text: 'RESUME="/dev/sda4"\n' },
      ],
      IDS,
      virtio,
    )
    expect(p.writes.map((w) => w.content)).toEqual([
      `# <target name> <source device> <key file> <options>\ncrypt-data UUID=${LUKS} none luks,discard\n`,
      `RESUME="UUID=${SWAP}"\n`,
    ])
    expect(p.rewritten.map((c) => c.what)).toEqual(['crypttab crypt-data', 'initramfs RESUME'])
  })

  test('nothing to do: names by UUID, one disk on its own family, or files not on the list', () => {
    const one = { family: 'sd' as const, disks: 1, initramfs: true }
    expect(planDeviceNames([{ path: '/etc/fstab', text: '/dev/sda3 / ext4 defaults 0 1\n' }], IDS, one)).toEqual({ writes: [], rewritten: [], kept: [] })
    expect(planDeviceNames([{ path: '/etc/passwd', text: '/dev/sdb1 /srv ext4 defaults 0 2\n' }], IDS, virtio).writes).toEqual([])
  })

  test('hostile input: a huge file, NUL bytes, CRLF, garbage lines and shell-looking specs never throw and are never half-written', () => {
    const huge = `/dev/sdb1 /srv ext4 defaults 0 2\n${'#'.repeat(1024 * 1024)}\n`
    const p = planDeviceNames(
      [
        { path: '/etc/fstab', text: huge },
        { path: '/etc/crypttab', text: 'x /dev/sdb1\0 none\n' },
      ],
      IDS,
      virtio,
    )
    expect(p.writes).toEqual([])
    expect(p.kept.map((k) => k.why)).toEqual([expect.stringContaining('not read'), expect.stringContaining('not read')])
    const odd = planDeviceNames(
      [{ path: '/etc/fstab', text: '/dev/sdb1 /srv ext4 defaults 0 2\r\n$(rm -rf /) /x ext4\n\n   \n/dev/sdb1\n/dev/sd\n/dev/sdb1;reboot / ext4\n' }],
      IDS,
      virtio,
    )
    // The CRLF line keeps its \r; a lone spec is still an entry; nothing else matches a device name.
    expect(odd.writes[0]!.content).toBe(`UUID=${SRV} /srv ext4 defaults 0 2\r\n$(rm -rf /) /x ext4\n\n   \nUUID=${SRV}\n/dev/sd\n/dev/sdb1;reboot / ext4\n`)
    const cmd = planDeviceNames([{ path: '/boot/grub/grub.cfg', text: 'linux /vmlinuz root=/dev/sdb1$(x) resume=/dev/sda4x\n' }], IDS, virtio)
    expect(cmd.writes).toEqual([])
  })

  test('the guest plan: Linux inspected guests only; the record says the family and what changed', () => {
    const ins = {
      inspected: true,
      os: { type: 'linux' },
      initramfs: '/boot/initrd.img',
      bootFiles: [{ path: '/etc/fstab', text: FSTAB }],
      blockIds: IDS,
    }
    const g = planGuestDeviceNames(ins, 'virtio', 2)!
    expect(g.record).toMatchObject({ family: 'vd', written: false, error: null })
    expect(g.record.rewritten).toHaveLength(2)
    expect(planGuestDeviceNames({ ...ins, os: { type: 'windows' } }, 'virtio', 2)).toBeNull()
    expect(planGuestDeviceNames({ ...ins, bootFiles: [{ path: '/etc/fstab', text: `UUID=${ROOT} / ext4 defaults 0 1\n` }] }, 'virtio', 2)).toBeNull()
    expect(planGuestDeviceNames(null, 'virtio', 2)).toBeNull()
  })

  test('blkid listings as guestfish prints them', () => {
    const text = `DEVNAME: /dev/sdb1\nUUID: ${SRV}\nBLOCK_SIZE: 4096\nTYPE: ext4\nPART_ENTRY_SCHEME: dos\nPART_ENTRY_UUID: 5c0ffee0-01\nPART_ENTRY_TYPE: 0x83\n`
    expect(parseBlkid('/dev/sdb1', text)).toEqual({ device: '/dev/sdb1', uuid: SRV, partuuid: '5c0ffee0-01', type: 'ext4' })
    expect(parseBlkid('/dev/sda1', '')).toEqual({ device: '/dev/sda1', uuid: '', partuuid: '', type: '' })
  })
})
