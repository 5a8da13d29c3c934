/**
 * More of what real guests look like (fixtures/guest-image.ts fleet variants: real Debian 12
 * guests), exported as VMware would and imported through the HTTP API (file sink, libvirt + qemu
 * under TCG), each asserted FROM THE GUEST'S SIDE: a systemd unit in the guest appends its
 * addresses, links, routes, name servers and `/srv` mount to /var/lib/migrator-test/boots once
 * the network is up; the test reads that file from the destination volume after the domain is
 * destroyed (guestfish --ro), not the job's own claim.
 *
 * - staticip, VMX folder (PVSCSI, vmxnet3 at PCI slot 192, so the guest calls it ens192; ifupdown
 *   static 192.0.2.10/24): the NIC becomes virtio at another slot; the job must carry ens192 over
 *   (a .link file naming the kept MAC ens192), the guest must come up with 192.0.2.10/24 on an UP
 *   ens192 with its routes and name server, and the job's ARP probe must see the address.
 *   Its NIC is on an isolated bridge the test creates (a libvirt network with no IP, no
 *   forwarding, no DHCP/DNS: nothing leaves it and the host's addressing is untouched),
 *   mapped with plan.networks.
 * - datadisk, OVA (two disks): /srv mounted by UUID from the second disk.
 * The two jobs run on one server at once; each domain is destroyed as soon as its job ended.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { fleetGuestImages, readGuestRecord, STATICIP, type FleetImage, type FleetVariant } from '../../fixtures/guest-image.ts'
import { buildInput, type ExportHardware } from '../../fixtures/inputs.ts'
import { offlinePlan, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'i45n-'
const BOOT_TIMEOUT_S = 600
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

interface Case {
  variant: FleetVariant
  kind: string
  hw?: ExportHardware
  networks?: Array<{ source: string; bridge: string }>
}

const CASES: Case[] = [
  { variant: 'staticip', kind: 'vmx_folder', hw: { controller: 'pvscsi', nicSlot: 192 }, networks: [{ source: 'VM Network', bridge: BRIDGE }] },
  { variant: 'datadisk', kind: 'ova_archive' },
]

interface Outcome {
  job: any
  xml: string
  record: string
  serialTail: string
}

/** The last boot block of a guest record (`boot ...` to `end`). */
function lastBoot(record: string): string {
  const blocks = record.split(/^boot /m).slice(1)
  return blocks.length ? `boot ${blocks.at(-1)}` : ''
}

describe('real guest fleet: network identity, data disks (TCG), checked from the guest side', () => {
  const t = tempDir('mig-i45n-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let images: Record<FleetVariant, FleetImage>
  const outcomes = new Map<FleetVariant, Promise<Outcome>>()

  async function outcomeOf(job: { id: string }, name: string): Promise<Outcome> {
    const done = await waitJob(srv.base, job.id, undefined, 40 * 60_000)
    const xml = virsh('dumpxml', name)
    virsh('destroy', name)
    const disks = [...xml.matchAll(/<source file='([^']+)'/g)].map((m) => m[1]!)
    let record = ''
    try {
      record = disks.length ? readGuestRecord(disks) : ''
    } catch (e) {
      record = `(guestfish failed: ${(e as Error).message})`
    }
    let serialTail = ''
    try {
      serialTail = readFileSync(path.join(t.dir, 'logs', `${job.id}.serial.log`), 'latin1')
        .split(/\r?\n/)
        .slice(-25)
        .join('\n')
    } catch {
      serialTail = ''
    }
    return { job: done, xml, record, serialTail }
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
      MIGRATOR_BOOT_TIMEOUT_SECONDS: String(BOOT_TIMEOUT_S),
      MIGRATOR_MAX_JOBS: '2',
    })
    for (const c of CASES) {
      const input = buildInput(c.kind, importRoot, `in-${c.variant}`, images[c.variant].disks, {}, c.hw)
      const job = await submit(
        srv.base,
        offlinePlan(c.kind, path.relative(importRoot, input.path), { name: `${PREFIX}${c.variant}`, ...(c.networks ? { networks: c.networks } : {}) }),
      )
      outcomes.set(c.variant, outcomeOf(job, `${PREFIX}${c.variant}`))
    }
  }, 45 * 60_000)

  afterAll(async () => {
    await srv?.stop()
    await cleanupDomains(PREFIX)
    virsh('net-destroy', NET)
    t.cleanup()
  })

  const report = (v: string, o: Outcome) =>
    console.log(
      `${v}: ${o.job.state} in ${((Date.parse(o.job.finished_at) - Date.parse(o.job.created_at)) / 1000).toFixed(0)} s, bus ${o.job.hardware?.disk_bus}, ` +
        `boot ${JSON.stringify(o.job.hardware?.boot)}, network ${JSON.stringify(o.job.hardware?.network)}, last_error ${JSON.stringify(o.job.last_error)}\n` +
        `guest record (last boot):\n${lastBoot(o.record) || o.record.slice(0, 2000) || '(none)'}` +
        (o.job.hardware?.boot?.verified ? '' : `\nserial tail:\n${o.serialTail}`),
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
    'datadisk (OVA, two disks): /srv mounted by UUID from the second disk, seen from the guest; no network configuration, nothing carried, no notice',
    async () => {
      const o = await outcomes.get('datadisk')!
      report('datadisk', o)
      expect([o.job.state, o.job.last_error]).toEqual(['Completed', null])
      expect(o.job.hardware.boot.verified).toBe(true)
      expect(o.job.hardware.network).toEqual({ interfaces: [], notes: [] })
      expect([...o.xml.matchAll(/<disk type='file' device='disk'>/g)]).toHaveLength(2)
      const boot = lastBoot(o.record)
      expect(boot).toMatch(/^end$/m)
      expect(boot).toMatch(/^srv: \/dev\/[sv]db +ext4 +\/srv$/m)
    },
    45 * 60_000,
  )
})
