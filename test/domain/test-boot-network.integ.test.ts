/**
 * A test boot's isolated network (lib/domain/test-boot-network.ts), real: libvirt's transient
 * network, the kernel's bridge, network namespaces and veth pairs. No guest boots here: a "guest"
 * is a network namespace of this test's own on the isolated bridge, holding the guest's addresses
 * (198.18.61.10/24, 2001:db8:61::10/64) and real servers (python3's http.server, openssl's
 * s_server). Checked: the checks pass from the test boot's namespace against both families, a
 * closed port and a wrong status fail with the tools' words, the host gets no address on the bridge
 * and no route through it, and everything made is removed, twice safely.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync, type ChildProcess, spawn } from 'node:child_process'
import * as path from 'node:path'
import { runServiceChecks } from '../../lib/domain/service-checks.ts'
import { checkerAddress, createTestBootNetwork, removeTestBootNetwork, type TestBootNetwork, testBootNetworkNames } from '../../lib/domain/test-boot-network.ts'
import { Virsh } from '../../lib/domain/virsh.ts'
import { ensureLibvirt } from '../helpers/libvirt.ts'
import { tempDir } from '../helpers/tmp.ts'

const JOB = 'i60n-00000000-test-boot-network'
const GUEST_NS = 'i60n-guest'
const GUEST_VETH = 'i60nguest'
const G4 = '198.18.61.10/24'
const G6 = '2001:db8:61::10/64'
const HTTP_PORT = 18080
const TLS_PORT = 18443

function sh(cmd: string, args: string[]): string {
  return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
}
function ok(cmd: string, args: string[]): boolean {
  try {
    sh(cmd, args)
    return true
  } catch {
    return false
  }
}

describe('test boot network: an isolated bridge and a namespace the checks run from', () => {
  const t = tempDir('mig-i60n-')
  const virsh = new Virsh({ uri: 'qemu:///system' })
  const names = testBootNetworkNames(JOB)
  let net: TestBootNetwork
  const servers: ChildProcess[] = []

  function cleanupGuest(): void {
    for (const s of servers) s.kill('SIGKILL')
    if (ok('ip', ['netns', 'pids', GUEST_NS])) for (const pid of sh('ip', ['netns', 'pids', GUEST_NS]).split('\n').filter(Boolean)) ok('kill', ['-9', pid])
    ok('ip', ['netns', 'del', GUEST_NS])
    ok('ip', ['link', 'del', GUEST_VETH])
  }

  beforeAll(async () => {
    await ensureLibvirt()
    cleanupGuest()
    await removeTestBootNetwork(virsh, JOB)
    net = await createTestBootNetwork(virsh, JOB)
    // The "guest": a namespace of its own on the isolated bridge with the guest's addresses.
    sh('ip', ['netns', 'add', GUEST_NS])
    sh('ip', ['link', 'add', GUEST_VETH, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', GUEST_NS])
    sh('sysctl', ['-q', '-w', `net.ipv6.conf.${GUEST_VETH}.disable_ipv6=1`])
    sh('ip', ['link', 'set', GUEST_VETH, 'master', names.bridge, 'up'])
    sh('ip', ['-n', GUEST_NS, 'link', 'set', 'lo', 'up'])
    sh('ip', ['-n', GUEST_NS, 'link', 'set', 'eth0', 'up'])
    sh('ip', ['-n', GUEST_NS, 'addr', 'add', G4, 'dev', 'eth0'])
    sh('ip', ['-n', GUEST_NS, '-6', 'addr', 'add', G6, 'dev', 'eth0', 'nodad'])
    sh('openssl', [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-subj',
      '/CN=guest.example',
      '-days',
      '1',
      '-keyout',
      path.join(t.dir, 'k.pem'),
      '-out',
      path.join(t.dir, 'c.pem'),
    ])
    servers.push(
      spawn('ip', ['netns', 'exec', GUEST_NS, 'python3', '-m', 'http.server', String(HTTP_PORT), '--bind', '::', '--directory', t.dir], { stdio: 'ignore' }),
      spawn(
        'ip',
        [
          'netns',
          'exec',
          GUEST_NS,
          'openssl',
          's_server',
          '-quiet',
          '-www',
          '-accept',
          String(TLS_PORT),
          '-cert',
          path.join(t.dir, 'c.pem'),
          '-key',
          path.join(t.dir, 'k.pem'),
        ],
        { stdio: 'ignore' },
      ),
    )
    for (let i = 0; i < 100 && !ok('ip', ['netns', 'exec', GUEST_NS, 'bash', '-c', `exec 3<>/dev/tcp/127.0.0.1/${HTTP_PORT}`]); i++) await Bun.sleep(100)
    for (let i = 0; i < 100 && !ok('ip', ['netns', 'exec', GUEST_NS, 'bash', '-c', `exec 3<>/dev/tcp/127.0.0.1/${TLS_PORT}`]); i++) await Bun.sleep(100)
  }, 60_000)

  afterAll(async () => {
    cleanupGuest()
    await removeTestBootNetwork(virsh, JOB).catch(() => undefined)
    t.cleanup()
  })

  test('checkerAddress: the highest free host address of the subnet, none for subnets without room', () => {
    expect(checkerAddress('198.18.61.10/24', ['198.18.61.10'])).toBe('198.18.61.254/24')
    expect(checkerAddress('198.18.61.254/24', ['198.18.61.254'])).toBe('198.18.61.253/24')
    expect(checkerAddress('10.0.0.1/30', ['10.0.0.1'])).toBe('10.0.0.2/30')
    expect(checkerAddress('10.0.0.1/31', [])).toBeNull()
    expect(checkerAddress('2001:db8:61::10/64', ['2001:db8:61::10'])).toBe('2001:db8:61:0:ffff:ffff:ffff:fffe/64')
    expect(checkerAddress('fd00::1/127', [])).toBeNull()
    expect(checkerAddress('not-an-address/24', [])).toBeNull()
    expect(checkerAddress('198.18.61.10', [])).toBeNull()
  })

  test('the network as made: a libvirt network with its bridge, no host address on it, the namespace on it', () => {
    expect(sh('virsh', ['-c', 'qemu:///system', 'net-info', names.network])).toMatch(/Active:\s+yes/)
    const dump = sh('virsh', ['-c', 'qemu:///system', 'net-dumpxml', names.network])
    expect(dump).not.toContain('<forward')
    expect(dump).not.toContain('<ip')
    expect(sh('ip', ['-o', 'addr', 'show', 'dev', names.bridge])).not.toMatch(/\binet6? /)
    expect(sh('ip', ['-o', 'link', 'show', names.hostVeth])).toContain(`master ${names.bridge}`)
    expect(sh('ip', ['netns', 'list'])).toMatch(new RegExp(`^${names.netns}( |$)`, 'm'))
  })

  test('checks from the namespace: HTTP and TCP on both families, HTTPS unverified, a closed port and a wrong status fail; the host has no route in', async () => {
    expect(await net.checks.reach([G4, G6, '10.0.0.1/32'])).toEqual(["no address of 10.0.0.1/32's subnet is free for the checks"])
    const inNs = sh('ip', ['-n', names.netns, '-o', 'addr', 'show', 'dev', names.nsVeth])
    expect(inNs).toContain('inet 198.18.61.254/24')
    expect(inNs).toContain('inet6 2001:db8:61:0:ffff:ffff:ffff:fffe/64')
    const targets = [
      { address: '198.18.61.10', source: 'static eth0' },
      { address: '2001:db8:61::10', source: 'static eth0' },
    ]
    const results = await runServiceChecks(
      [
        { name: 'web', http: { port: HTTP_PORT, path: '/', expect_status: 200 } },
        { name: 'port', tcp: { port: HTTP_PORT } },
        { name: 'tls', http: { scheme: 'https', port: TLS_PORT } },
      ],
      targets,
      { waitSeconds: 20, attempt: net.checks.attempt },
    )
    expect(results.map((r) => [r.name, r.ok, r.result, r.address])).toEqual([
      ['web', true, 'HTTP 200', '198.18.61.10'],
      ['port', true, 'connected', '198.18.61.10'],
      ['tls', true, 'HTTP 200', '198.18.61.10'],
    ])
    // IPv6 alone
    const six = await runServiceChecks(
      [
        { name: 'web6', http: { port: HTTP_PORT } },
        { name: 'port6', tcp: { port: HTTP_PORT } },
      ],
      [targets[1]!],
      {
        waitSeconds: 10,
        attempt: net.checks.attempt,
      },
    )
    expect(six.map((r) => [r.name, r.ok, r.result, r.target])).toEqual([
      ['web6', true, 'HTTP 200', `http://[2001:db8:61::10]:${HTTP_PORT}/`],
      ['port6', true, 'connected', `tcp [2001:db8:61::10]:${HTTP_PORT}`],
    ])
    const bad = await runServiceChecks(
      [
        { name: 'closed', tcp: { port: HTTP_PORT + 1 } },
        { name: 'missing', http: { port: HTTP_PORT, path: '/nothing-here', expect_status: 200 } },
      ],
      [targets[0]!],
      { waitSeconds: 0, attempt: net.checks.attempt },
    )
    expect(bad.map((r) => [r.name, r.ok])).toEqual([
      ['closed', false],
      ['missing', false],
    ])
    expect(bad[0]!.result).toContain('Connection refused')
    expect(bad[1]!.result).toStartWith('HTTP 404, expected 200')
    // the neighbour table of the namespace names the guest's MAC
    expect(await net.checks.neighbours()).toMatch(new RegExp(`^198\\.18\\.61\\.10 dev ${names.netns} lladdr [0-9a-f:]{17}`, 'm'))
    // the host has no address on the bridge and no route into the guest's subnets
    expect(sh('ip', ['-o', 'addr', 'show', 'dev', names.bridge])).not.toMatch(/\binet6? /)
    expect(sh('ip', ['route', 'get', '198.18.61.10'])).not.toContain(names.bridge)
    expect(sh('ip', ['-o', 'route', 'show', 'table', 'all'])).not.toContain(names.bridge)
  }, 90_000)

  test('removal: the namespace, the veth pair, the libvirt network and its bridge go; removing again is a no-op', async () => {
    await removeTestBootNetwork(virsh, JOB)
    expect(sh('ip', ['netns', 'list'])).not.toMatch(new RegExp(`^${names.netns}( |$)`, 'm'))
    expect(ok('ip', ['link', 'show', names.hostVeth])).toBe(false)
    expect(ok('ip', ['link', 'show', names.bridge])).toBe(false)
    expect(ok('virsh', ['-c', 'qemu:///system', 'net-info', names.network])).toBe(false)
    await removeTestBootNetwork(virsh, JOB)
  }, 60_000)
})
