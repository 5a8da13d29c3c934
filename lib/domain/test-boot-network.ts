/**
 * The isolated network of a test boot (docs/test-boot.md "Checks in a test boot"): where the
 * clone's NICs are attached and from where the plan's checks reach the guest, without touching the
 * host's routes nor reaching the host's networks.
 *
 * What is made, per job (names derived from the job id, so that a crash leaves enough to find and
 * remove them: {@link testBootNetworkNames}):
 * - a transient libvirt network with its own bridge and nothing else: no `<forward>` (isolated),
 *   no `<ip>` (no host address, no dnsmasq, no route in the host's table);
 * - a network namespace holding one end of a veth pair, the other end a port of that bridge (IPv6
 *   off on the host's end: the host takes no link-local address and no router advertisement there);
 * - in the namespace, once the guest's static addresses are known, an address of each of their
 *   subnets ({@link checkerAddress}); the checks run there (`ip netns exec`), so the guest's
 *   subnet, which may be the host's own LAN's, is only ever routed inside the namespace.
 *
 * The checks in the namespace are run by curl (HTTP and HTTPS, certificate not verified, as on the
 * host) and by bash's `/dev/tcp` (a TCP connect), both bounded by the attempt's time limit.
 * {@link removeTestBootNetwork} removes all of it and is safe to repeat.
 */
import { createHash } from 'node:crypto'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { isIP } from 'node:net'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { exec } from '../exec.ts'
import type { CheckNetwork, ServiceCheck } from './service-checks.ts'
import { checkTarget } from './service-checks.ts'
import type { Virsh } from './virsh.ts'

/** The names of job `jobId`'s test boot network: libvirt network, its bridge, the namespace, the veth ends (host side, namespace side). */
export interface TestBootNetworkNames {
  network: string
  bridge: string
  netns: string
  hostVeth: string
  nsVeth: string
}

/** The names of job `jobId`'s test boot network (see the module comment); interface names stay within the kernel's 15 characters. */
export function testBootNetworkNames(jobId: string): TestBootNetworkNames {
  const h = createHash('sha256').update(jobId).digest('hex').slice(0, 8)
  return { network: `migrator-tb-${h}`, bridge: `migtb${h}`, netns: `migrator-tb-${h}`, hostVeth: `mtb${h}h`, nsVeth: `mtb${h}n` }
}

function parseV4(a: string): number | null {
  const p = a.split('.')
  if (p.length !== 4 || p.some((x) => !/^\d{1,3}$/.test(x) || Number(x) > 255)) return null
  return p.reduce((n, x) => n * 256 + Number(x), 0)
}

function formatV4(n: number): string {
  return [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.')
}

function parseV6(a: string): bigint | null {
  const halves = a.split('::')
  if (halves.length > 2) return null
  const groups = (s: string) => (s === '' ? [] : s.split(':'))
  const head = groups(halves[0]!)
  const tail = halves.length === 2 ? groups(halves[1]!) : []
  const missing = 8 - head.length - tail.length
  if ((halves.length === 2 ? missing < 1 : missing !== 0) || [...head, ...tail].some((g) => !/^[0-9a-f]{1,4}$/i.test(g))) return null
  return [...head, ...Array(missing).fill('0'), ...tail].reduce((n, g) => (n << 16n) | BigInt(Number.parseInt(g, 16)), 0n)
}

function formatV6(n: bigint): string {
  const g: string[] = []
  for (let i = 7; i >= 0; i--) g.push(((n >> BigInt(i * 16)) & 0xffffn).toString(16))
  return g.join(':')
}

/**
 * The address the checks take in the subnet of the guest's address `cidr` (`198.18.60.10/24`,
 * `2001:db8:60::10/64`): the highest host address of the subnet (IPv4: below the broadcast
 * address) that is none of `avoid` (the guest's own addresses, without prefix), with the subnet's
 * prefix length. Null when the subnet has no room for it (IPv4 /31 and /32, IPv6 /127 and /128)
 * or `cidr` is not an address with a prefix length.
 */
export function checkerAddress(cidr: string, avoid: string[]): string | null {
  const [addr, len] = cidr.split('/')
  const prefix = Number(len)
  if (!addr || !/^\d{1,3}$/.test(len ?? '')) return null
  const v4 = parseV4(addr)
  if (v4 !== null) {
    if (prefix > 30) return null
    const size = 2 ** (32 - prefix)
    const net = v4 - (v4 % size)
    const taken = new Set(avoid.map(parseV4))
    for (let n = net + size - 2; n > net; n--) if (!taken.has(n)) return `${formatV4(n)}/${prefix}`
    return null
  }
  const v6 = parseV6(addr)
  if (v6 === null || prefix > 126) return null
  const hostBits = BigInt(128 - prefix)
  const net = (v6 >> hostBits) << hostBits
  const taken = new Set(avoid.map(parseV6))
  for (let n = net + (1n << hostBits) - 2n; n > net; n--) if (!taken.has(n)) return `${formatV6(n)}/${prefix}`
  return null
}

async function run(cmd: string, args: string[], what: string): Promise<void> {
  const r = await exec(cmd, args, { timeoutMs: 30_000 })
  if (r.code !== 0)
    throw new MigError('E_MIG_GUEST_BOOT_FAILED', `test boot network: ${what} failed (${cmd} ${args.join(' ')}): ${r.stderr.trim() || `exit ${r.code}`}`)
}

/** A test boot's isolated network (see the module comment): its names and the check network the boot's checks run from. */
export interface TestBootNetwork {
  names: TestBootNetworkNames
  checks: CheckNetwork
}

/**
 * Makes job `jobId`'s isolated network (libvirt network, bridge, namespace, veth; see the module
 * comment), first removing a stale one of the same job. On a failure removes what it made and
 * throws `E_MIG_GUEST_BOOT_FAILED` naming the step and the tool's message.
 */
export async function createTestBootNetwork(virsh: Virsh, jobId: string): Promise<TestBootNetwork> {
  const names = testBootNetworkNames(jobId)
  await removeTestBootNetwork(virsh, jobId)
  const { network, bridge, netns, hostVeth, nsVeth } = names
  try {
    const dir = await mkdtemp(path.join(tmpdir(), 'mig-tbnet-'))
    try {
      const file = path.join(dir, 'network.xml')
      await writeFile(file, `<network><name>${network}</name><bridge name='${bridge}' stp='off' delay='0'/></network>\n`, { mode: 0o600 })
      const created = await virsh.run(['net-create', '--file', file])
      if (created.code !== 0) throw new MigError('E_MIG_GUEST_BOOT_FAILED', `test boot network: virsh net-create ${network} failed: ${created.stderr.trim()}`)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
    await run('ip', ['netns', 'add', netns], 'making the network namespace')
    await run('ip', ['link', 'add', hostVeth, 'type', 'veth', 'peer', 'name', nsVeth, 'netns', netns], 'making the veth pair')
    await run('sysctl', ['-q', '-w', `net.ipv6.conf.${hostVeth}.disable_ipv6=1`], "turning IPv6 off on the host's veth end")
    await run('ip', ['link', 'set', hostVeth, 'master', bridge, 'up'], 'attaching the veth to the bridge')
    await run('ip', ['-n', netns, 'link', 'set', 'lo', 'up'], 'bringing the namespace up')
    await run('ip', ['-n', netns, 'link', 'set', nsVeth, 'up'], 'bringing the namespace up')
  } catch (e) {
    await removeTestBootNetwork(virsh, jobId).catch(() => undefined)
    throw e
  }
  const added = new Set<string>()
  const checks: CheckNetwork = {
    where: `network namespace ${netns} on the isolated bridge ${bridge}`,
    async reach(addresses) {
      const plain = addresses.map((a) => a.split('/')[0]!)
      const notes: string[] = []
      for (const cidr of addresses) {
        const mine = checkerAddress(cidr, plain)
        if (!mine) {
          notes.push(`no address of ${cidr}'s subnet is free for the checks`)
          continue
        }
        if (added.has(mine)) continue
        const six = mine.includes(':')
        const r = await exec('ip', ['-n', netns, ...(six ? ['-6'] : []), 'addr', 'add', mine, 'dev', nsVeth, ...(six ? ['nodad'] : [])], { timeoutMs: 30_000 })
        if (r.code === 0 || /exists/i.test(r.stderr)) added.add(mine)
        else notes.push(`adding ${mine} in ${netns} failed: ${r.stderr.trim()}`)
      }
      return notes
    },
    attempt: (check, address, timeoutMs) => attemptInNetns(netns, check, address, timeoutMs),
    async neighbours() {
      const r = await exec('ip', ['-n', netns, 'neigh', 'show'], { timeoutMs: 10_000 })
      return r.code === 0 ? r.stdout.replace(/^(\S+\s+dev\s+)\S+/gm, `$1${netns}`) : ''
    },
  }
  return { names, checks }
}

/**
 * One attempt of `check` on `address` from namespace `netns`: curl for HTTP(S) (`HTTP <status>`,
 * with `expected <n>` when it differs), bash's `/dev/tcp` for TCP (`connected`); otherwise the
 * tool's message. Bounded by `timeoutMs`.
 */
export async function attemptInNetns(netns: string, check: ServiceCheck, address: string, timeoutMs: number): Promise<{ ok: boolean; result: string }> {
  // the address comes from the guest's configuration: only an IP address goes into a URL or a path
  if (!isIP(address)) return { ok: false, result: `${JSON.stringify(address.slice(0, 64))} is not an IP address` }
  const secs = String(Math.max(1, Math.round(timeoutMs / 1000)))
  if (check.tcp) {
    const r = await exec('ip', ['netns', 'exec', netns, 'timeout', secs, 'bash', '-c', 'exec 3<>"/dev/tcp/$0/$1"', address, String(check.tcp.port)], {
      timeoutMs: timeoutMs + 5000,
    })
    if (r.code === 0) return { ok: true, result: 'connected' }
    const why =
      r.stderr
        .trim()
        .split('\n')
        .at(-1)
        ?.replace(/^.*?line \d+: /, '') ?? ''
    return { ok: false, result: r.code === 124 ? `no answer within ${secs} s` : why || `exit ${r.code}` }
  }
  const expect = check.http?.expect_status ?? 200
  const url = checkTarget(check, address)
  const r = await exec(
    'ip',
    ['netns', 'exec', netns, 'curl', '-sS', '-g', '-k', '-o', '/dev/null', '-w', '%{http_code}', '-A', 'vm-migrator-check', '--max-time', secs, url],
    { timeoutMs: timeoutMs + 5000 },
  )
  const status = Number(r.stdout.trim())
  if (r.code === 0 && status > 0) return { ok: status === expect, result: `HTTP ${status}${status === expect ? '' : `, expected ${expect}`}` }
  return { ok: false, result: r.stderr.trim().split('\n').at(-1) || `curl exit ${r.code}` }
}

/**
 * Removes job `jobId`'s test boot network: the namespace (its veth end and so the pair), the
 * host's veth end if still there, the libvirt network (and its bridge). What does not exist is
 * skipped. Throws `E_MIG_GUEST_BOOT_FAILED` naming what could not be removed, after trying all.
 */
export async function removeTestBootNetwork(virsh: Virsh, jobId: string): Promise<void> {
  const { network, netns, hostVeth } = testBootNetworkNames(jobId)
  const failures: string[] = []
  const ns = await exec('ip', ['netns', 'list'], { timeoutMs: 10_000 })
  if (ns.code === 0 && new RegExp(`^${netns}( |$)`, 'm').test(ns.stdout)) {
    const r = await exec('ip', ['netns', 'del', netns], { timeoutMs: 30_000 })
    if (r.code !== 0) failures.push(`namespace ${netns}: ${r.stderr.trim()}`)
  }
  const link = await exec('ip', ['link', 'show', hostVeth], { timeoutMs: 10_000 })
  if (link.code === 0) {
    // the kernel tears a deleted namespace's devices down after `ip netns del` returns, the pair's
    // host end with them: one that vanished in between is removed, not a failure
    const r = await exec('ip', ['link', 'del', hostVeth], { timeoutMs: 30_000 })
    if (r.code !== 0 && !/Cannot find device/i.test(r.stderr)) failures.push(`veth ${hostVeth}: ${r.stderr.trim()}`)
  }
  const info = await virsh.run(['net-info', network])
  if (info.code === 0) {
    const r = await virsh.run(['net-destroy', network])
    if (r.code !== 0 && !/not found|no network/i.test(r.stderr)) failures.push(`libvirt network ${network}: ${r.stderr.trim()}`)
    else {
      // a network made persistent by hand would stay defined
      await virsh.run(['net-undefine', network])
    }
  }
  if (failures.length) throw new MigError('E_MIG_GUEST_BOOT_FAILED', `removing the test boot network failed: ${failures.join('; ')}`)
}
