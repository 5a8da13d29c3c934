/**
 * More of what real guests look like (fixtures/guest-image.ts fleet variants: real Debian 12
 * guests), exported as VMware would and imported through the HTTP API (file sink, libvirt + qemu
 * under TCG), each asserted FROM THE GUEST'S SIDE: a systemd unit in the guest appends, once the
 * network is up and multi-user.target reached, the target's state, its addresses, links, routes,
 * name servers and the sources of `/srv`, `/` and `/boot` to /var/lib/migrator-test/boots, then
 * prints a marker on the serial console; the test waits for the marker, destroys the domain and
 * reads that file from the destination volumes (guestfish --ro), not the job's own claim.
 *
 * - staticip, VMX folder (PVSCSI, vmxnet3 at PCI slot 192, so the guest calls it ens192; ifupdown
 *   static 192.0.2.10/24): the NIC becomes virtio at another slot; the job must carry ens192 over
 *   (a .link file naming the kept MAC ens192), the guest must come up with 192.0.2.10/24 on an UP
 *   ens192 with its routes and name server, and the job's ARP probe must see the address.
 *   Its NIC is on an isolated bridge the test creates (a libvirt network with no IP, no
 *   forwarding, no DHCP/DNS: nothing leaves it and the host's addressing is untouched),
 *   mapped with plan.networks.
 * - enterprise, VMX folder with the boot disk on `scsi0:0` (PVSCSI) and the data disk on
 *   `nvme0:0`: `/boot` on its own partition, root on LVM `/dev/mapper/vg0-root`, a dracut
 *   host-only initramfs with vmw_pvscsi and nvme and no virtio. The product must attach both disks
 *   on PVSCSI without modifying the guest (libvirt 9.0 has no NVMe bus, and the guest needs no
 *   NVMe driver for a data disk mounted after the root); the guest must reach multi-user with `/`
 *   from the LV, `/boot` from its partition and `/srv` mounted by UUID from the disk that was
 *   `nvme0:0` (told apart by file system UUID: the kernel may name either disk sda); no network
 *   configuration: nothing carried, no notice.
 * The two jobs run on one server at once; each domain is destroyed as soon as its guest has
 * written its record.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import {
  ENTERPRISE,
  fleetGuestImages,
  GUEST_RECORD_MARKER,
  GUEST_TEST_BOOT_TIMEOUT_S,
  GUEST_TEST_VCPUS,
  readGuestRecord,
  STATICIP,
  type FleetImage,
  type FleetVariant,
} from '../../fixtures/guest-image.ts'
import { buildInput, type ExportHardware } from '../../fixtures/inputs.ts'
import { offlinePlan, openStream, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'i45n-'
/** How long a booted guest may take, after its job ended, to write its record. */
const RECORD_WAIT_S = 240
const NET = 'mig45-isolated'
const BRIDGE = 'mig45br0'
const VMX_MAC = '00:0c:29:aa:bb:cc'

function virsh(...args: string[]): string {
  try {
    return execFileSync('virsh', ['-c', 'qemu:///system', ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim()
  } catch (e) {
    return `error: ${(e as { stderr?: string }).stderr ?? (e as Error).message}`
  }
}

/** The UUID of the file system on a raw image with no partition table (blkid). */
function fsUuid(file: string): string {
  return execFileSync('blkid', ['-p', '-s', 'UUID', '-o', 'value', file], { encoding: 'utf8' }).trim()
}

interface Case {
  variant: FleetVariant
  kind: string
  hw?: ExportHardware
  networks?: Array<{ source: string; bridge: string }>
}

const CASES: Case[] = [
  { variant: 'staticip', kind: 'vmx_folder', hw: { controller: 'pvscsi', nicSlot: 192 }, networks: [{ source: 'VM Network', bridge: BRIDGE }] },
  { variant: 'enterprise', kind: 'vmx_folder', hw: { diskControllers: ['pvscsi', 'nvme'] } },
]

interface Outcome {
  job: any
  xml: string
  vmx: string
  record: string
  serialTail: string
  /** Seconds from the job's `Starting` event to its end (NaN when the event was not seen). */
  startingToEnd: number
  /** Seconds from the job's end to the guest's record marker on the serial console (NaN: none). */
  recordAfter: number
}

/** The last boot block of a guest record (`boot ...` to `end`). */
function lastBoot(record: string): string {
  const blocks = record.split(/^boot /m).slice(1)
  return blocks.length ? `boot ${blocks.at(-1)}` : ''
}

/** The `<disk>` elements of a domain XML: source file, target dev and bus, driver type. */
function domainDisks(xml: string): Array<{ file: string; dev: string; bus: string; type: string }> {
  return [...xml.matchAll(/<disk type='file' device='disk'>([\s\S]*?)<\/disk>/g)].map((m) => ({
    file: /<source file='([^']+)'/.exec(m[1]!)?.[1] ?? '',
    dev: /<target dev='([^']+)'/.exec(m[1]!)?.[1] ?? '',
    bus: /<target dev='[^']+' bus='([^']+)'/.exec(m[1]!)?.[1] ?? '',
    type: /<driver name='qemu' type='([^']+)'/.exec(m[1]!)?.[1] ?? '',
  }))
}

describe('real guest fleet: network identity, the enterprise guest (TCG), checked from the guest side', () => {
  const t = tempDir('mig-i45n-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let stream: ReturnType<typeof openStream>
  let images: Record<FleetVariant, FleetImage>
  const outcomes = new Map<FleetVariant, Promise<Outcome>>()

  async function outcomeOf(job: { id: string }, name: string, vmx: string): Promise<Outcome> {
    const done = await waitJob(srv.base, job.id, undefined, 40 * 60_000)
    const serialLog = path.join(t.dir, 'logs', `${job.id}.serial.log`)
    const serial = () => (existsSync(serialLog) ? readFileSync(serialLog, 'latin1') : '')
    // The record unit runs after multi-user.target, which may come after the boot check's
    // evidence: give a booted guest time to write and sync it before the power is cut.
    const ended = Date.now()
    let recordAfter = Number.NaN
    if (done.state === 'Completed') {
      for (let i = 0; i < RECORD_WAIT_S * 2; i++) {
        if (serial().includes(GUEST_RECORD_MARKER)) {
          recordAfter = (Date.now() - ended) / 1000
          break
        }
        await Bun.sleep(500)
      }
    }
    const xml = virsh('dumpxml', name)
    virsh('destroy', name)
    const disks = domainDisks(xml).map((d) => d.file)
    let record = ''
    try {
      record = disks.length ? readGuestRecord(disks) : ''
    } catch (e) {
      record = `(guestfish failed: ${(e as Error).message})`
    }
    const serialTail = serial().split(/\r?\n/).slice(-25).join('\n')
    const startingAt = stream.events.find((e) => e.event === 'migration' && e.data.id === job.id && e.data.state === 'Starting')?.data.updated_at
    const startingToEnd = startingAt ? (Date.parse(done.finished_at) - Date.parse(startingAt)) / 1000 : Number.NaN
    return { job: done, xml, vmx, record, serialTail, startingToEnd, recordAfter }
  }

  beforeAll(async () => {
    const t0 = Date.now()
    images = fleetGuestImages()
    console.log(`fleet guest images ready in ${((Date.now() - t0) / 1000).toFixed(1)} s`)
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    virsh('net-destroy', NET)
    execFileSync('virsh', ['-c', 'qemu:///system', 'net-create', '/dev/stdin'], {
      input: `<network><name>${NET}</name><bridge name='${BRIDGE}' stp='off'/></network>`,
      stdio: ['pipe', 'ignore', 'pipe'],
    })
    srv = await startServer('bun', t.dir, {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: String(GUEST_TEST_BOOT_TIMEOUT_S),
      MIGRATOR_MAX_JOBS: '2',
    })
    stream = openStream(srv.base)
    await stream.ready
    for (const c of CASES) {
      const input = buildInput(c.kind, importRoot, `in-${c.variant}`, images[c.variant].disks, {}, { ...c.hw, vcpus: GUEST_TEST_VCPUS })
      const vmx = readFileSync(path.join(input.path, `in-${c.variant}.vmx`), 'utf8')
      const job = await submit(
        srv.base,
        offlinePlan(c.kind, path.relative(importRoot, input.path), { name: `${PREFIX}${c.variant}`, ...(c.networks ? { networks: c.networks } : {}) }),
      )
      outcomes.set(c.variant, outcomeOf(job, `${PREFIX}${c.variant}`, vmx))
    }
  }, 45 * 60_000)

  afterAll(async () => {
    stream?.close()
    await srv?.stop()
    await cleanupDomains(PREFIX)
    virsh('net-destroy', NET)
    t.cleanup()
  })

  const report = (v: string, o: Outcome) =>
    console.log(
      `${v}: ${o.job.state} in ${((Date.parse(o.job.finished_at) - Date.parse(o.job.created_at)) / 1000).toFixed(0)} s ` +
        `(Starting -> end ${o.startingToEnd.toFixed(1)} s, record ${o.recordAfter.toFixed(1)} s after), bus ${o.job.hardware?.disk_bus}, ` +
        `boot ${JSON.stringify(o.job.hardware?.boot)}, network ${JSON.stringify(o.job.hardware?.network)}, last_error ${JSON.stringify(o.job.last_error)}\n` +
        `reason: ${o.job.hardware?.reason}\n` +
        `guest record (last boot):\n${lastBoot(o.record) || o.record.slice(0, 2000) || '(none)'}` +
        (o.job.hardware?.boot?.verified && Number.isFinite(o.recordAfter) ? '' : `\nserial tail:\n${o.serialTail}`),
    )

  test(
    'staticip (VMX, vmxnet3 at slot 192, ens192 static): the guest comes up with 192.0.2.10/24 on an UP ens192, its routes and DNS; the job says ens192 was carried by a .link file and saw the address',
    async () => {
      const o = await outcomes.get('staticip')!
      report('staticip', o)
      expect([o.job.state, o.job.last_error]).toEqual(['Completed', null])
      expect(o.job.hardware.boot.verified).toBe(true)
      expect(o.job.hardware.nic_model).toBe('virtio')
      // The domain keeps the source MAC on the isolated bridge.
      expect(o.xml).toContain(`<mac address='${VMX_MAC}'/>`)
      expect(o.xml).toContain(`<source bridge='${BRIDGE}'/>`)
      // The job's claim.
      expect(o.job.hardware.network.interfaces).toHaveLength(1)
      expect(o.job.hardware.network.interfaces[0]).toMatchObject({
        name: STATICIP.iface,
        mac: VMX_MAC,
        nic: 'ethernet0',
        carried: true,
        how: 'link-file',
        matched_by: 'slot',
        link_file: `/etc/systemd/network/10-migrator-${STATICIP.iface}.link`,
        method: 'static',
        addresses: [STATICIP.address],
        gateway: STATICIP.gateway,
        config: [`ifupdown:/etc/network/interfaces.d/${STATICIP.iface}`],
        address_check: 'seen',
      })
      // The guest's side: the last boot's record.
      const boot = lastBoot(o.record)
      expect(boot).toMatch(/^end$/m)
      expect(boot).toMatch(/^multiuser: active$/m)
      expect(boot).toMatch(new RegExp(`^\\d+: ${STATICIP.iface}\\s+inet ${STATICIP.address.replace(/\./g, '\\.')} `, 'm'))
      expect(boot).toMatch(new RegExp(`^\\d+: ${STATICIP.iface}: <[^>]*\\bUP\\b[^>]*>.* state UP `, 'm'))
      expect(boot).toMatch(new RegExp(`^\\d+: ${STATICIP.iface}: .*link/ether ${VMX_MAC} `, 'm'))
      expect(boot).toMatch(new RegExp(`^default via ${STATICIP.gateway.replace(/\./g, '\\.')} dev ${STATICIP.iface}`, 'm'))
      expect(boot).toMatch(new RegExp(`^${STATICIP.route.replace(/\./g, '\\.')} dev ${STATICIP.iface}`, 'm'))
      expect(boot).toContain(`resolv: nameserver ${STATICIP.dns}`)
      // No interface of the default predictable scheme took the NIC instead.
      expect(boot).not.toMatch(/^\d+: enp\d+s\d+/m)
    },
    45 * 60_000,
  )

  test(
    'enterprise (VMX: LVM root and /boot on scsi0:0 PVSCSI, data disk on nvme0:0; dracut host-only): both disks on PVSCSI, the guest unmodified; it reaches multi-user with / from /dev/mapper/vg0-root, /boot from its partition, /srv by UUID from the disk that was nvme0:0; nothing carried, no notice',
    async () => {
      const o = await outcomes.get('enterprise')!
      report('enterprise', o)
      // The export: the boot disk on PVSCSI, the data disk on VMware's NVMe controller.
      expect(o.vmx).toMatch(/^scsi0\.virtualDev = "pvscsi"$/m)
      expect(o.vmx).toMatch(/^scsi0:0\.fileName = "in-enterprise\.vmdk"$/m)
      expect(o.vmx).toMatch(/^nvme0:0\.fileName = "in-enterprise_1\.vmdk"$/m)
      expect([o.job.state, o.job.last_error]).toEqual(['Completed', null])
      // Positive evidence of the boot: the guest's console (serial, or its screen read by OCR).
      expect(o.job.hardware.boot.verified).toBe(true)
      expect(['serial', 'screen']).toContain(o.job.hardware.boot.source)
      expect(o.job.hardware.boot.evidence).toMatch(/login prompt|multi-user target/)
      // The bus the product chose, and why: the dracut initramfs has vmw_pvscsi and no virtio.
      expect(o.job.hardware.disk_bus).toBe('pvscsi')
      expect(o.job.hardware.reason).toMatch(
        /^disk bus pvscsi: initramfs \/boot\/initrd\.img-\S+ has vmw_pvscsi but no virtio_blk\/virtio_scsi: attached on the controller the guest has drivers for, the guest is not modified/,
      )
      expect(o.job.hardware.reason).not.toMatch(/virt-v2v|converted/)
      expect(o.job.hardware.network).toEqual({ interfaces: [], notes: [] })
      // Both disks attached, in the VMX's order, on the PVSCSI controller.
      const disks = domainDisks(o.xml)
      expect(disks.map((d) => [d.dev, d.bus, d.type])).toEqual([
        ['sda', 'scsi', 'raw'],
        ['sdb', 'scsi', 'raw'],
      ])
      expect(o.xml).toMatch(/<controller type='scsi' index='0' model='vmpvscsi'/)
      // The data disk that was nvme0:0 is the destination's sdb: same file system UUID, and the
      // guest's fstab mounts that UUID at /srv.
      const srvUuid = fsUuid(images.enterprise.disks[1]!)
      expect(srvUuid).toMatch(/^[0-9a-f-]{36}$/)
      expect(fsUuid(disks[1]!.file)).toBe(srvUuid)
      const fstab = execFileSync('debugfs', ['-R', 'cat /etc/fstab', `${images.enterprise.disks[0]}?offset=${ENTERPRISE.rootOffsetBytes}`], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'ignore'],
      })
      expect(fstab).toContain(`UUID=${srvUuid} /srv ext4 `)
      expect(fstab).toContain(`${ENTERPRISE.rootDevice} / ext4 `)
      const bootUuid = /^UUID=(\S+) \/boot ext4 /m.exec(fstab)?.[1]
      expect(bootUuid).toMatch(/^[0-9a-f-]{36}$/)
      // The guest's side: the last boot's record. The kernel names the two PVSCSI disks in its
      // probe order (either may be sda), so the record's file system UUIDs tell them apart.
      const boot = lastBoot(o.record)
      expect(boot).toMatch(/^end$/m)
      expect(boot).toMatch(/^multiuser: active$/m)
      expect(boot).toMatch(new RegExp(`^root: ${ENTERPRISE.rootDevice} +ext4 +/ +[0-9a-f-]{36}$`, 'm'))
      const bootfs = new RegExp(`^bootfs: /dev/(sd[a-z])2 +ext4 +/boot +${bootUuid}$`, 'm')
      const srvfs = new RegExp(`^srv: /dev/(sd[a-z]) +ext4 +/srv +${srvUuid}$`, 'm')
      expect(boot).toMatch(bootfs)
      expect(boot).toMatch(srvfs)
      // /boot is partition 2 of one disk, /srv the whole other disk.
      expect(bootfs.exec(boot)![1]).not.toBe(srvfs.exec(boot)![1])
    },
    45 * 60_000,
  )
})
