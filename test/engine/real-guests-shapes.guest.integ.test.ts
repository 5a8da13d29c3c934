/**
 * Guests of real fleets, several properties in one guest (fixtures/guest-image.ts `shapes`: a real
 * Debian 12 guest), exported as a VMX folder as VMware would (both disks on PVSCSI `scsi0:0` and
 * `scsi0:1`, vmxnet3 at PCI slot 192) and imported through the HTTP API (file sink, libvirt + qemu
 * under TCG) with service checks in the plan. Asserted from the job AND from the guest's own record
 * (a systemd unit in the guest appends its addresses, mounts, swap and kernel line to
 * /var/lib/migrator-test/boots; the test reads that file from the destination volumes):
 *
 * - names by device: the guest's fstab mounts `/dev/sdb1` at /srv and swaps on `/dev/sdb2`, its
 *   kernel line and initramfs-tools resume name `/dev/sdb2`; its generic initramfs has virtio, so
 *   the disks go on virtio-blk (`/dev/vdX`). The job must rewrite every one of those to UUID= on
 *   the destination volumes and say so (`hardware.device_names`), and the guest must come up with
 *   /srv mounted from the data disk, the swap in use and `resume=UUID=` on its kernel line;
 * - IPv6: ifupdown gives `ens192` a static IPv4 and a static IPv6 address; `ens192` is carried
 *   over and the job's address check must see both (ARP and neighbour discovery);
 * - a service: busybox httpd on port 8080 serving a page from /srv; the plan's checks (an HTTP
 *   request expecting 200 and a TCP connect) must pass against the guest's static address from
 *   this host, recorded in `hardware.checks`;
 * - a root logical volume spanning both disks (a PV on each, one segment of the root LV on each):
 *   the guest's record must show the root mounted from the LV, both PVs in its volume group and
 *   the LV's segments on `/dev/vda3` and `/dev/vdb3`.
 *
 * The NIC is on a bridge this test creates (a libvirt network with no forwarding, no DHCP, no DNS)
 * with the host's own addresses on the guest's networks (198.18.60.1/24, 2001:db8:60::1/64), so the
 * host can reach the service; nothing leaves that bridge.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import {
  type ExtraImage,
  type ExtraVariant,
  extraGuestImages,
  GUEST_RECORD_MARKER,
  GUEST_TEST_BOOT_TIMEOUT_S,
  GUEST_TEST_VCPUS,
  readGuestRecord,
  SHAPES,
} from '../../fixtures/guest-image.ts'
import { buildInput } from '../../fixtures/inputs.ts'
import { offlinePlan, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { runCli } from '../helpers/cli.ts'
import { cleanupDomains, domainsWithPrefix, ensureLibvirt } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { testBootNetworkNames } from '../../lib/domain/test-boot-network.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'i60s-'
const NET = 'mig60-shapes'
const BRIDGE = 'mig60br0'
const VMX_MAC = '00:0c:29:aa:bb:cc'
/** How long a booted guest may take, after its job ended, to write its record. */
const RECORD_WAIT_S = 240

function virsh(...args: string[]): string {
  try {
    return execFileSync('virsh', ['-c', 'qemu:///system', ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim()
  } catch (e) {
    return `error: ${(e as { stderr?: string }).stderr ?? (e as Error).message}`
  }
}

function blkid(file: string, offset?: number): string {
  return execFileSync('blkid', ['-p', ...(offset !== undefined ? ['-O', String(offset)] : []), '-s', 'UUID', '-o', 'value', file], { encoding: 'utf8' }).trim()
}

/** The last boot block of a guest record (`boot ...` to `end`). */
function lastBoot(record: string): string {
  const blocks = record.split(/^boot /m).slice(1)
  return blocks.length ? `boot ${blocks.at(-1)}` : ''
}

/** The test boot of the `start: false` job: the job when it ended, and what was seen while the clone ran. */
interface TestBootOutcome {
  /** The job at `Completed` (before the test boot) and after its test boot. */
  done: any
  job: any
  /** `migrator test-boot --wait`: its exit code and output. */
  cli: { code: number | null; out: string }
  /** sha256 of each volume before and after the test boot. */
  volumes: { before: string[]; after: string[] }
  /** The defined (real) domain's state before and after; whether the clone's overlays remain. */
  domainBefore: string
  domainAfter: string
  overlaysLeft: boolean
  /** The clone's domain XML, read while it ran. */
  cloneXml: string
  /** `ip netns list` and `virsh net-info` of the test boot's network while the clone ran, and after. */
  during: { netns: string; net: string }
  after: { netns: string; net: string; bridge: string }
}

interface Outcome {
  job: any
  xml: string
  record: string
  serialTail: string
  /** Seconds from the job's end to the guest's record marker on the serial console (NaN: none). */
  recordAfter: number
}

describe('real guest shapes: device names, IPv6, a service that answers (TCG), checked from the guest side', () => {
  const t = tempDir('mig-i60s-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let images: Record<ExtraVariant, ExtraImage>
  const outcomes = new Map<ExtraVariant, Promise<Outcome>>()
  let testBoot: Promise<TestBootOutcome>

  const netState = (id: string) => {
    const n = testBootNetworkNames(id)
    let bridge = ''
    try {
      bridge = execFileSync('ip', ['-o', 'link', 'show', n.bridge], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
    } catch {
      bridge = 'absent'
    }
    return { netns: execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }), net: virsh('net-info', n.network), bridge }
  }

  /** sha256 of each of the job's volumes. */
  const volumeSums = (job: any): string[] =>
    job.progress.disks.map((d: any) => execFileSync('sha256sum', [volumePath(t.dir, job.id, d.label)], { encoding: 'utf8' }).split(' ')[0])

  /** Waits for the `start: false` job, test-boots it with `migrator test-boot --wait` and follows it to its end. */
  async function testBootOf(id: string, name: string): Promise<TestBootOutcome> {
    const done = await waitJob(srv.base, id, undefined, 40 * 60_000)
    const none = { done, job: done, cli: { code: null, out: '' }, volumes: { before: [], after: [] }, domainBefore: '', domainAfter: '', overlaysLeft: false }
    if (done.state !== 'Completed') return { ...none, cloneXml: '', during: { netns: '', net: '' }, after: netState(id) }
    const domainBefore = virsh('domstate', name)
    const before = volumeSums(done)
    const cli = runCli(['test-boot', '--wait', id], { env: { MIGRATOR_URL: srv.base }, timeoutMs: 40 * 60_000 })
    let cloneXml = ''
    for (let i = 0; i < 6000 && !cloneXml.includes('<domain'); i++) {
      await Bun.sleep(100)
      cloneXml = virsh('dumpxml', `${name}-testboot`)
    }
    const during = netState(id)
    const ran = await cli
    const job = await waitJob(srv.base, id, (j) => ['passed', 'failed', 'cancelled'].includes(j.test_boot?.state), 40 * 60_000)
    return {
      done,
      job,
      cli: { code: ran.code, out: `${ran.stdout.trim()} ${ran.stderr.trim()}` },
      volumes: { before, after: volumeSums(done) },
      domainBefore,
      domainAfter: virsh('domstate', name),
      overlaysLeft: existsSync(path.join(t.dir, 'volumes', 'migrations', id, '.testboot')),
      cloneXml,
      during,
      after: netState(id),
    }
  }

  async function outcomeOf(id: string, name: string): Promise<Outcome> {
    const job = await waitJob(srv.base, id, undefined, 40 * 60_000)
    const serialLog = path.join(t.dir, 'logs', `${id}.serial.log`)
    const serial = () => (existsSync(serialLog) ? readFileSync(serialLog, 'latin1') : '')
    // The record unit runs after multi-user.target: give a booted guest time to write and sync it.
    const ended = Date.now()
    let recordAfter = Number.NaN
    if (job.state === 'Completed') {
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
    const disks = [...xml.matchAll(/<source file='([^']+)'/g)].map((m) => m[1]!)
    let record = ''
    try {
      record = disks.length ? readGuestRecord(disks) : ''
    } catch (e) {
      record = `(guestfish failed: ${(e as Error).message})`
    }
    return { job, xml, record, serialTail: serial().split(/\r?\n/).slice(-25).join('\n'), recordAfter }
  }

  beforeAll(async () => {
    const t0 = Date.now()
    images = extraGuestImages(['shapes'])
    console.log(`shapes guest image ready in ${((Date.now() - t0) / 1000).toFixed(1)} s`)
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    virsh('net-destroy', NET)
    execFileSync('virsh', ['-c', 'qemu:///system', 'net-create', '/dev/stdin'], {
      input: `<network ipv6='yes'><name>${NET}</name><bridge name='${BRIDGE}' stp='off' delay='0'/></network>`,
      stdio: ['pipe', 'ignore', 'pipe'],
    })
    // The host's side of the guest's networks (removed with the bridge).
    execFileSync('sysctl', ['-q', '-w', `net.ipv6.conf.${BRIDGE}.disable_ipv6=0`])
    execFileSync('ip', ['addr', 'add', SHAPES.host4, 'dev', BRIDGE])
    execFileSync('ip', ['-6', 'addr', 'add', SHAPES.host6, 'dev', BRIDGE, 'nodad'])
    srv = await startServer('bun', t.dir, {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: String(GUEST_TEST_BOOT_TIMEOUT_S),
    })
    const plans: Record<ExtraVariant, Record<string, unknown>> = {
      shapes: {
        networks: [{ source: 'VM Network', bridge: BRIDGE }],
        checks: [
          { name: 'web', http: { port: SHAPES.httpPort, path: '/index.html', expect_status: 200 } },
          { name: 'web-port', tcp: { port: SHAPES.httpPort } },
        ],
      },
    }
    for (const v of ['shapes'] as const) {
      const input = buildInput('vmx_folder', importRoot, `in-${v}`, images[v].disks, {}, { controller: 'pvscsi', nicSlot: 192, vcpus: GUEST_TEST_VCPUS })
      const rel = path.relative(importRoot, input.path)
      const job = await submit(srv.base, offlinePlan('vmx_folder', rel, { name: `${PREFIX}${v}`, ...plans[v] }))
      outcomes.set(v, outcomeOf(job.id, `${PREFIX}${v}`))
      // The same guest imported with `start: false` and test-booted: its clone on the test boot's
      // isolated network, the plan's checks run from there (at the same time as the real boot above,
      // whose guest holds the same addresses on the test's own bridge).
      const held = await submit(srv.base, offlinePlan('vmx_folder', rel, { name: `${PREFIX}${v}-tb`, start: false, ...plans[v] }))
      testBoot = testBootOf(held.id, `${PREFIX}${v}-tb`)
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
      `${v}: ${o.job.state} in ${((Date.parse(o.job.finished_at) - Date.parse(o.job.created_at)) / 1000).toFixed(0)} s (record ${o.recordAfter.toFixed(1)} s after), ` +
        `bus ${o.job.hardware?.disk_bus}\nboot ${JSON.stringify(o.job.hardware?.boot)}\nnetwork ${JSON.stringify(o.job.hardware?.network)}\n` +
        `device_names ${JSON.stringify(o.job.hardware?.device_names)}\nchecks ${JSON.stringify(o.job.hardware?.checks)}\nlast_error ${JSON.stringify(o.job.last_error)}\n` +
        `guest record (last boot):\n${lastBoot(o.record) || o.record.slice(0, 2000) || '(none)'}` +
        (o.job.hardware?.boot?.verified && Number.isFinite(o.recordAfter) ? '' : `\nserial tail:\n${o.serialTail}`),
    )

  test(
    'shapes, the job: Completed on virtio-blk, every name by device rewritten to UUID= on the destination (and said why), ens192 carried with both addresses seen, both service checks passed',
    async () => {
      const o = await outcomes.get('shapes')!
      report('shapes', o)
      const job = o.job
      expect([job.state, job.last_error]).toEqual(['Completed', null])
      expect(job.hardware.boot.verified).toBe(true)
      expect(job.hardware.disk_bus).toBe('virtio-blk')
      // The source images keep their names by device: the rewrite is on the destination only.
      const srvUuid = blkid(images.shapes.disks[1]!, 2048 * 512)
      const swapUuid = blkid(images.shapes.disks[1]!, 526336 * 512)
      expect([srvUuid, swapUuid].every((u) => /^[0-9a-f-]{36}$/.test(u))).toBe(true)
      const dn = job.hardware.device_names
      expect(dn).toMatchObject({ family: 'vd', written: true, error: null, kept: [] })
      const changes = dn.rewritten.map((c: any) => `${c.file} ${c.what} ${c.from} -> ${c.to}`)
      expect(changes).toEqual(
        expect.arrayContaining([
          `/etc/fstab fstab /srv (ext4) ${SHAPES.dataDevice} -> UUID=${srvUuid}`,
          `/etc/fstab fstab none (swap) ${SHAPES.swapDevice} -> UUID=${swapUuid}`,
          `/etc/default/grub kernel resume= ${SHAPES.swapDevice} -> UUID=${swapUuid}`,
          `/etc/initramfs-tools/conf.d/resume initramfs RESUME ${SHAPES.swapDevice} -> UUID=${swapUuid}`,
          `/boot/grub/grub.cfg kernel resume= ${SHAPES.swapDevice} -> UUID=${swapUuid}`,
        ]),
      )
      expect(dn.rewritten[0].why).toContain('virtio-blk, where the kernel names them /dev/vdX')
      // ens192 carried over, both addresses probed from the bridge and answered by the NIC's MAC.
      expect(job.hardware.network.interfaces).toHaveLength(1)
      const ens = job.hardware.network.interfaces[0]
      expect(ens).toMatchObject({
        name: SHAPES.iface,
        mac: VMX_MAC,
        carried: true,
        how: 'link-file',
        addresses: [SHAPES.address4, SHAPES.address6],
        address_check: 'seen',
      })
      expect(ens.address_evidence).toContain(`${SHAPES.address4.split('/')[0]} answered an ARP probe on bridge ${BRIDGE} from MAC ${VMX_MAC}`)
      expect(ens.address_evidence).toContain(`${SHAPES.address6.split('/')[0]} answered a neighbour solicitation on bridge ${BRIDGE} from MAC ${VMX_MAC}`)
      // The service checks, from this host against the carried static address.
      expect(job.hardware.checks.map((c: any) => [c.name, c.kind, c.ok, c.result, c.address_source])).toEqual([
        ['web', 'http', true, 'HTTP 200', `static ${SHAPES.iface}`],
        ['web-port', 'tcp', true, 'connected', `static ${SHAPES.iface}`],
      ])
      for (const c of job.hardware.checks) {
        expect([SHAPES.address4.split('/')[0], SHAPES.address6.split('/')[0]]).toContain(c.address)
        expect(Number.isNaN(Date.parse(c.at))).toBe(false)
      }
    },
    45 * 60_000,
  )

  test(
    "shapes, the guest's record: multi-user, the root LV over a PV on each disk, /srv mounted from the data disk by its UUID, swap in use, resume=UUID= on its kernel line, ens192 UP with both addresses",
    async () => {
      const o = await outcomes.get('shapes')!
      const boot = lastBoot(o.record)
      expect(boot).toMatch(/^end$/m)
      expect(boot).toMatch(/^multiuser: active$/m)
      const srvUuid = blkid(images.shapes.disks[1]!, 2048 * 512)
      const swapUuid = blkid(images.shapes.disks[1]!, 526336 * 512)
      expect(boot).toMatch(new RegExp(`^srv: /dev/vdb1 +ext4 +/srv +${srvUuid}$`, 'm'))
      expect(boot).toMatch(new RegExp(`^swap: /dev/vdb2 ${swapUuid}`, 'm'))
      expect(boot).toMatch(new RegExp(`^cmdline: .* resume=UUID=${swapUuid}( |$)`, 'm'))
      expect(boot).toMatch(new RegExp(`^\\d+: ${SHAPES.iface}\\s+inet ${SHAPES.address4.replace(/\./g, '\\.')} `, 'm'))
      expect(boot).toMatch(new RegExp(`^\\d+: ${SHAPES.iface}\\s+inet6 ${SHAPES.address6} scope global`, 'm'))
      expect(boot).toMatch(new RegExp(`^\\d+: ${SHAPES.iface}: <[^>]*\\bUP\\b[^>]*>.* state UP `, 'm'))
      // The root LV spans both disks: the initramfs assembled the volume group from a PV on each
      // virtio disk, and the root's two segments are one on each.
      expect(boot).toMatch(new RegExp(`^root: ${SHAPES.rootDevice} +ext4 +/ `, 'm'))
      const pvs = [...boot.matchAll(/^pv: (\S+) +(\S+)$/gm)].map((m) => `${m[1]} ${m[2]}`)
      expect(pvs.sort()).toEqual([`/dev/vda3 ${SHAPES.vg}`, `/dev/vdb3 ${SHAPES.vg}`])
      const segments = [...boot.matchAll(/^lv: (\S+) +(\S+) +(\S+)$/gm)].map((m) => `${m[1]} ${m[2]} ${m[3]}`)
      expect(segments).toEqual([`${SHAPES.lv} ${SHAPES.vg} /dev/vda3(0)`, `${SHAPES.lv} ${SHAPES.vg} /dev/vdb3(0)`])
    },
    45 * 60_000,
  )

  test(
    'shapes, a test boot of the start: false job (migrator test-boot --wait): its clone on an isolated network the migrator made, both checks passed from its namespace, all of it removed after, the defined domain never started and its volumes unchanged',
    async () => {
      const o = await testBoot
      const tb = o.job.test_boot
      console.log(`test boot: ${o.cli.out} ${JSON.stringify({ ...tb, serial_tail: tb?.serial_tail?.slice(-5), hardware: { checks: tb?.hardware?.checks } })}`)
      expect([o.done.state, o.done.domain, o.domainBefore]).toEqual(['Completed', `${PREFIX}shapes-tb`, 'shut off'])
      expect([o.cli.code, o.cli.out]).toEqual([0, expect.stringContaining('test boot passed')])
      expect([o.job.state, o.job.last_error]).toEqual(['Completed', null])
      expect([tb.state, tb.verified, tb.error]).toEqual(['passed', true, null])
      // the clone had the defined domain's hardware, from the inspection
      expect([tb.hardware.disk_bus, tb.hardware.inspected]).toEqual([o.done.hardware.disk_bus, true])
      // the real domain is still defined and was never started; its volumes are unchanged, the overlays gone
      expect(o.domainAfter).toBe('shut off')
      expect(o.volumes.after).toEqual(o.volumes.before)
      expect(o.overlaysLeft).toBe(false)
      expect(await domainsWithPrefix(`${PREFIX}shapes-tb-testboot`)).toEqual([])
      const names = testBootNetworkNames(o.job.id)
      // the clone's NIC: the guest's MAC, on the isolated bridge (never the plan's bridge)
      expect(o.cloneXml).toContain(`<mac address='${VMX_MAC}'/>`)
      expect(o.cloneXml).toContain(`<source bridge='${names.bridge}'/>`)
      expect(o.cloneXml).not.toContain(BRIDGE)
      expect(o.during.netns).toMatch(new RegExp(`^${names.netns}( |$)`, 'm'))
      expect(o.during.net).toMatch(/Active:\s+yes/)
      // the checks, from the namespace against the carried static address
      expect(tb.hardware.checks.map((c: any) => [c.name, c.kind, c.ok, c.result, c.address_source])).toEqual([
        ['web', 'http', true, 'HTTP 200', `static ${SHAPES.iface}`],
        ['web-port', 'tcp', true, 'connected', `static ${SHAPES.iface}`],
      ])
      for (const c of tb.hardware.checks) expect([SHAPES.address4.split('/')[0], SHAPES.address6.split('/')[0]]).toContain(c.address)
      // everything the test boot made is gone: its domain, namespace, network and bridge
      expect(virsh('domstate', `${PREFIX}shapes-tb-testboot`)).toContain('error')
      expect(o.after.netns).not.toMatch(new RegExp(`^${names.netns}( |$)`, 'm'))
      expect(o.after.net).toContain('error')
      expect(o.after.bridge).toBe('absent')
    },
    45 * 60_000,
  )
})
