// The plan's service checks (lib/domain/service-checks.ts) against real servers on 127.0.0.1 and
// ::1: TCP connects, HTTP statuses, HTTPS with a self-signed certificate, a closed port, a server
// that never answers, the order of the addresses tried; and the plan's validation of `checks`.
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import * as http from 'node:http'
import * as https from 'node:https'
import * as net from 'node:net'
import * as path from 'node:path'
import { checkTarget, checkVerdict, parseDomifaddr, parseNeighbours, runServiceChecks } from '../../lib/domain/service-checks.ts'
import { parseSubmitBody } from '../../lib/plan.ts'
import { selfSignedCert } from '../helpers/tls.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const t = tempDir('mig-checks-')
let web: http.Server
let tls: https.Server
let silent: net.Server
const held: net.Socket[] = []
let webPort = 0
let tlsPort = 0
let silentPort = 0
let closedPort = 0

const listen = (s: net.Server, host = '127.0.0.1') => new Promise<number>((r) => s.listen(0, host, () => r((s.address() as net.AddressInfo).port)))

beforeAll(async () => {
  web = http.createServer((req, res) => {
    res.statusCode = req.url === '/health' ? 200 : req.url === '/teapot' ? 418 : 404
    res.end('x')
  })
  webPort = await listen(web)
  selfSignedCert(path.join(t.dir, 'k.pem'), path.join(t.dir, 'c.pem'), 'guest.example')
  tls = https.createServer({ key: readFileSync(path.join(t.dir, 'k.pem')), cert: readFileSync(path.join(t.dir, 'c.pem')) }, (_req, res) => res.end('ok'))
  tlsPort = await listen(tls)
  // Accepts and never answers: an HTTP check must time out, not hang.
  silent = net.createServer((s) => held.push(s))
  silentPort = await listen(silent)
  const probe = net.createServer()
  closedPort = await listen(probe)
  await new Promise((r) => probe.close(r))
})

afterAll(async () => {
  for (const s of held) s.destroy()
  await Promise.all([web, tls, silent].map((s) => new Promise((r) => s.close(r))))
  t.cleanup()
})

const at = (address: string) => [{ address, source: 'static ens192' }]

describe('service checks against real servers', () => {
  test('TCP connect and HTTP status: ok, with the address, target, time and attempts recorded', async () => {
    const [tcp, h] = await runServiceChecks(
      [
        { name: 'ssh-like', tcp: { port: webPort } },
        { name: 'health', http: { port: webPort, path: '/health' } },
      ],
      at('127.0.0.1'),
      { waitSeconds: 0 },
    )
    expect(tcp).toMatchObject({
      name: 'ssh-like',
      kind: 'tcp',
      ok: true,
      result: 'connected',
      address: '127.0.0.1',
      address_source: 'static ens192',
      target: `tcp 127.0.0.1:${webPort}`,
      attempts: 1,
      on_failure: 'fail',
    })
    expect(h).toMatchObject({ kind: 'http', ok: true, result: 'HTTP 200', target: `http://127.0.0.1:${webPort}/health` })
    expect(Date.parse(h!.at)).toBeGreaterThan(Date.now() - 60_000)
  })

  test('an unexpected status, a closed port and a silent server fail with the words; the expected 418 passes; HTTPS does not verify the certificate', async () => {
    const r = await runServiceChecks(
      [
        { name: 'home', http: { port: webPort, path: '/' } },
        { name: 'teapot', http: { port: webPort, path: '/teapot', expect_status: 418 } },
        { name: 'closed', tcp: { port: closedPort }, on_failure: 'notice' },
        { name: 'silent', http: { port: silentPort } },
        { name: 'tls', http: { scheme: 'https', port: tlsPort } },
      ],
      at('127.0.0.1'),
      { waitSeconds: 0, attemptTimeoutMs: 1500 },
    )
    expect(r.map((x) => [x.name, x.ok, x.result])).toEqual([
      ['home', false, expect.stringMatching(/^HTTP 404, expected 200 \(1 attempts in \d+ s\)$/)],
      ['teapot', true, 'HTTP 418'],
      ['closed', false, expect.stringMatching(/^ECONNREFUSED/)],
      ['silent', false, expect.stringMatching(/^no answer within 1.5 s/)],
      ['tls', true, 'HTTP 200'],
    ])
    expect(checkVerdict(r)).toEqual({
      failure: expect.stringMatching(/^service check "home" failed: http:\/\/127\.0\.0\.1:\d+\/ HTTP 404.*; service check "silent" failed: /),
      notice: expect.stringMatching(/^service check "closed" failed: tcp 127\.0\.0\.1:\d+ ECONNREFUSED/),
    })
  })

  test('addresses are tried in order until one answers, retried until the wait ends; IPv6 literals are bracketed', async () => {
    const v6 = http.createServer((_q, s) => s.end('6'))
    const p6 = await listen(v6, '::1')
    try {
      const [r] = await runServiceChecks(
        [{ name: 'v6', http: { port: p6 } }],
        [
          { address: '127.0.0.1', source: 'static ens192' },
          { address: '::1', source: 'static ens192' },
        ],
        { waitSeconds: 0 },
      )
      expect(r).toMatchObject({ ok: true, address: '::1', target: `http://[::1]:${p6}/`, attempts: 2 })
    } finally {
      await new Promise((res) => v6.close(res))
    }
    const t0 = Date.now()
    const [late] = await runServiceChecks([{ name: 'never', tcp: { port: closedPort } }], at('127.0.0.1'), { waitSeconds: 3 })
    expect(late!.ok).toBe(false)
    expect(late!.attempts).toBeGreaterThanOrEqual(2)
    expect(Date.now() - t0).toBeGreaterThanOrEqual(3000)
    const [none] = await runServiceChecks([{ name: 'x', tcp: { port: 1 } }], [], { waitSeconds: 5 })
    expect(none).toMatchObject({ ok: false, address: null, attempts: 0, result: expect.stringContaining('no address of the guest is known') })
    expect(checkTarget({ name: 's', http: { scheme: 'https' } }, '2001:db8::10')).toBe('https://[2001:db8::10]:443/')
  })

  test('DHCP leases and neighbour entries of the guest MACs only', () => {
    const leases = ` Name       MAC address          Protocol     Address
-------------------------------------------------------------------------------
 vnet3      52:54:00:aa:bb:cc    ipv4         192.168.122.57/24
 vnet4      52:54:00:00:00:01    ipv4         192.168.122.58/24
`
    expect(parseDomifaddr(leases, new Set(['52:54:00:aa:bb:cc']))).toEqual([{ address: '192.168.122.57', source: 'dhcp lease' }])
    const neigh = `198.51.100.10 dev mig60br0 lladdr 00:0c:29:aa:bb:cc REACHABLE
198.51.100.11 dev mig60br0 lladdr 00:0c:29:aa:bb:cc FAILED
fe80::20c:29ff:feaa:bbcc dev mig60br0 lladdr 00:0c:29:aa:bb:cc STALE
2001:db8:60::10 dev mig60br0 lladdr 00:0c:29:aa:bb:cc router STALE
10.0.0.1 dev eth0 lladdr 52:54:00:12:34:56 REACHABLE
`
    expect(parseNeighbours(neigh, new Set(['00:0c:29:aa:bb:cc'])).map((x) => x.address)).toEqual(['198.51.100.10', '2001:db8:60::10'])
  })
})

describe('plan.checks validation', () => {
  const offline = { source: { Offline: 'ova_archive' }, source_ref: { kind: 'offline_host_path', path: 'exports/web01.ova' }, mode: 'Cold' }
  test('accepted shapes', () => {
    const p = parseSubmitBody({
      plan: {
        ...offline,
        checks: [
          { name: 'ssh', tcp: { port: 22 } },
          { name: 'web', http: { port: 8080, path: '/health?x=1', scheme: 'https', expect_status: 204 }, on_failure: 'notice' },
        ],
      },
    })
    expect(p.checks).toHaveLength(2)
    // with "start": false a test boot runs them (docs/test-boot.md)
    expect(parseSubmitBody({ plan: { ...offline, start: false, checks: [{ name: 'ssh', tcp: { port: 22 } }] } }).checks).toHaveLength(1)
  })
  test('every bad check is named by its field', async () => {
    const bad = async (checks: unknown, extra: object = {}) =>
      (await thrown(() => parseSubmitBody({ plan: { ...offline, ...extra, checks } }))) as unknown as {
        code: string
        details: { issues: Array<{ path: string }> }
      }
    const e = await bad([{ name: 'a', tcp: { port: 0 } }])
    expect(e.code).toBe('E_MIG_INVALID_PLAN')
    expect(e.details.issues.map((i) => i.path)).toEqual(['plan.checks.0.tcp.port'])
    expect((await bad([{ name: 'a' }])).details.issues.map((i) => i.path)).toEqual(['plan.checks.0'])
    expect((await bad([{ name: 'a', tcp: { port: 1 }, http: {} }])).details.issues.map((i) => i.path)).toEqual(['plan.checks.0'])
    expect((await bad([{ name: 'a', http: { path: 'no-slash' } }])).details.issues.map((i) => i.path)).toEqual(['plan.checks.0.http.path'])
    expect((await bad([{ name: 'a', http: { path: '/a b\r\nHost: evil' } }])).details.issues.map((i) => i.path)).toEqual(['plan.checks.0.http.path'])
    expect((await bad([{ name: 'a', http: { expect_status: 999 } }])).details.issues.map((i) => i.path)).toEqual(['plan.checks.0.http.expect_status'])
    expect((await bad([{ name: '../x', tcp: { port: 1 } }])).details.issues.map((i) => i.path)).toEqual(['plan.checks.0.name'])
    expect((await bad([{ name: 'a', tcp: { port: 1 }, shell: 'rm -rf /' }])).details.issues.map((i) => i.path)).toEqual(['plan.checks.0'])
    expect(
      (
        await bad([
          { name: 'a', tcp: { port: 1 } },
          { name: 'a', tcp: { port: 2 } },
        ])
      ).details.issues.map((i) => i.path),
    ).toEqual(['plan.checks.1.name'])
    expect((await bad(Array.from({ length: 33 }, (_, i) => ({ name: `c${i}`, tcp: { port: 1 } })))).details.issues.map((i) => i.path)).toEqual(['plan.checks'])
  })
})
