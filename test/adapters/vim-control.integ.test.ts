/**
 * The vim_api control plane against a real peer: govmomi's vCenter simulator (test/vcsim, built
 * and started by test/helpers/vcsim.ts on 127.0.0.1 with TLS and a checked password). Covers
 * connect (CA, pinned thumbprint, insecure, bare host:port), wrong password, closed port, untrusted
 * or mismatching certificates, VM list with property-collector paging, inspect, unknown VM,
 * re-login after the session is terminated, hostile answers, and the HTTP endpoints of the real
 * server (Bun and Node).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { createServer, type Server } from 'node:http'
import { writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { createVimAdapter, type VimSession } from '../../lib/adapters/vim/adapter.ts'
import { retrieveAll } from '../../lib/adapters/vim/props.ts'
import { VimClient, vimSdkUrl, x } from '../../lib/adapters/vim/soap.ts'
import { RUNTIMES, freePort, startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'
import { putVmdk, startVcsim, type Vcsim } from '../helpers/vcsim.ts'

const MiB = 1024 * 1024
let v: Vcsim
const t = tempDir('mig-vim-ctl-')
let linuxVm = ''
let windowsVm = ''

const adapter = createVimAdapter({ requestTimeoutMs: 10_000 })
const conn = (over: Partial<{ endpoint: string; username: string; password: string; tls: any }> = {}) => ({
  endpoint: v.url,
  username: v.username,
  password: v.password,
  tls: { ca_pem: v.certPem },
  ...over,
})

beforeAll(async () => {
  v = await startVcsim()
  writeFileSync(path.join(t.dir, 'a.raw'), randomBytes(3 * MiB))
  writeFileSync(path.join(t.dir, 'b.raw'), Buffer.alloc(2 * MiB))
  const a = await putVmdk(v, 'web01', 'web01', path.join(t.dir, 'a.raw'), 'flat')
  const b = await putVmdk(v, 'web01', 'web01_1', path.join(t.dir, 'b.raw'), 'sparse')
  linuxVm = await v.createVm({
    name: 'web01',
    guest_id: 'ubuntu64Guest',
    firmware: 'efi',
    num_cpu: 4,
    cores_per_socket: 2,
    memory_mb: 2048,
    cbt: true,
    power_on: true,
    disks: [
      { file: a, capacity_bytes: 3 * MiB },
      { file: b, capacity_bytes: 2 * MiB },
    ],
    nics: [{ mac: '00:50:56:AA:00:01' }, { mac: '00:50:56:aa:00:02' }],
  })
  const c = await putVmdk(v, 'sql01', 'sql01', path.join(t.dir, 'b.raw'), 'flat')
  windowsVm = await v.createVm({
    name: 'sql01',
    guest_id: 'windows9Server64Guest',
    firmware: 'bios',
    num_cpu: 2,
    memory_mb: 4096,
    cbt: false,
    power_on: false,
    disks: [{ file: c, capacity_bytes: 2 * MiB }],
    nics: [],
  })
}, 120_000)

afterAll(async () => {
  await v?.stop()
  t.cleanup()
})

describe('vim_api connect', () => {
  test('trusted by CA, by pinned thumbprint, or explicitly insecure; bare host:port endpoint; describe reports the product', async () => {
    for (const tls of [{ ca_pem: v.certPem }, { thumbprint: v.thumbprint }, { thumbprint: v.thumbprint.replace(/:/g, '').toLowerCase() }, { insecure: true }]) {
      const s = await adapter.connect(conn({ tls }))
      expect(await s.describe()).toEqual({ product: 'VMware vCenter Server 6.5.0 build-5973321', version: '6.5.0' })
      await s.close()
    }
    const s = await adapter.connect(conn({ endpoint: v.hostPort }))
    expect((await s.describe()).version).toBe('6.5.0')
    await s.close()
    expect(adapter.supportsWarm()).toBe(true)
  })

  test('wrong password: E_MIG_AUTH_FAILED; unknown user too', async () => {
    const e = await thrown(() => adapter.connect(conn({ password: 'wrong' })))
    expect(e.code).toBe('E_MIG_AUTH_FAILED')
    expect(e.message).not.toContain('wrong')
    expect((await thrown(() => adapter.connect(conn({ username: 'nobody@vsphere.local' })))).code).toBe('E_MIG_AUTH_FAILED')
  })

  test('closed port, unresolvable host, untrusted certificate, mismatching thumbprint: E_MIG_SOURCE_UNREACHABLE', async () => {
    const port = await freePort()
    const closed = await thrown(() => adapter.connect(conn({ endpoint: `https://127.0.0.1:${port}/sdk` })))
    expect(closed.code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(closed.message).toContain(`127.0.0.1:${port}`)
    expect((await thrown(() => adapter.connect(conn({ endpoint: 'https://vc.invalid/sdk' })))).code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect((await thrown(() => adapter.connect(conn({ tls: {} })))).code).toBe('E_MIG_SOURCE_UNREACHABLE')
    const pin = await thrown(() => adapter.connect(conn({ tls: { thumbprint: '00'.repeat(32) } })))
    expect(pin.code).toBe('E_MIG_SOURCE_UNREACHABLE')
    expect(pin.message).toContain('thumbprint')
  })

  test('endpoint rules: https only, path /sdk, no credentials: E_MIG_BAD_REQUEST', async () => {
    expect(vimSdkUrl('vc01.example.test')).toBe('https://vc01.example.test/sdk')
    expect(vimSdkUrl('https://vc01:8443/')).toBe('https://vc01:8443/sdk')
    for (const bad of ['http://vc01/sdk', 'https://vc01/api', 'https://u:p@vc01/sdk', 'https://vc01/sdk?x=1', 'ftp://vc01']) {
      expect([bad, (await thrown(() => adapter.connect(conn({ endpoint: bad })))).code]).toEqual([bad, 'E_MIG_BAD_REQUEST'])
    }
  })
})

describe('vim_api inventory', () => {
  let s: VimSession
  beforeAll(async () => {
    s = (await adapter.connect(conn())) as VimSession
  })
  afterAll(async () => {
    await s?.close()
  })

  test('list VMs: every VM of the inventory with power state, guest, CPU and memory', async () => {
    const vms = await s.listVms()
    const web = vms.find((m) => m.vm_id === linuxVm)
    expect(web).toEqual({ vm_id: linuxVm, name: 'web01', power_state: 'on', guest_id: 'ubuntu64Guest', cpu_count: 4, memory_bytes: 2048 * MiB })
    expect(vms.find((m) => m.vm_id === windowsVm)?.power_state).toBe('off')
    // the simulator's own inventory (VPX model) is listed too
    expect(vms.filter((m) => m.name.startsWith('DC0_')).length).toBeGreaterThanOrEqual(4)
    // ContinueRetrievePropertiesEx paging: two objects per page gives the same set
    const paged = await retrieveAll(s.client, 'VirtualMachine', ['name'], 2)
    expect(paged.map((o) => o.obj.value).sort()).toEqual(vms.map((m) => m.vm_id).sort())
  })

  test('inspect: disks with capacity, device key and datastore path, NICs with MACs, firmware, guest, CPU, memory, CBT', async () => {
    const m = await s.inspect(linuxVm)
    expect(m).toEqual({
      name: 'web01',
      source_format: 'vim_api',
      guest_os: { family: 'linux', id: 'ubuntu64Guest' },
      firmware: 'efi',
      secure_boot: false,
      cpu: { count: 4, cores_per_socket: 2 },
      memory_bytes: 2048 * MiB,
      disks: [
        {
          label: 'web01',
          capacity_bytes: 3 * MiB,
          disk_format: 'vmdk',
          source: { path: '[LocalDS_0] web01/web01.vmdk', device_key: 2000 },
          controller: 'scsi',
          address: 'scsi0:0',
        },
        {
          label: 'web01_1',
          capacity_bytes: 2 * MiB,
          disk_format: 'vmdk',
          source: { path: '[LocalDS_0] web01/web01_1.vmdk', device_key: 2001 },
          controller: 'scsi',
          address: 'scsi0:1',
        },
      ],
      nics: [
        { label: expect.any(String), mac: '00:50:56:aa:00:01', model: 'vmxnet3', network: 'VM Network' },
        { label: expect.any(String), mac: '00:50:56:aa:00:02', model: 'vmxnet3', network: 'VM Network' },
      ],
      cbt_available: true,
      warnings: [],
    })
    const w = await s.inspect(windowsVm)
    expect([w.guest_os.family, w.firmware, w.cbt_available, w.disks.length, w.nics.length, w.memory_bytes]).toEqual([
      'windows',
      'bios',
      false,
      1,
      0,
      4096 * MiB,
    ])
  })

  test('unknown VM: E_MIG_VM_NOT_FOUND (also for ids that are no managed object id)', async () => {
    for (const id of ['vm-999999', '../etc/passwd', '']) {
      const e = await thrown(() => s.inspect(id))
      expect([id, e.code]).toEqual([id, 'E_MIG_VM_NOT_FOUND'])
    }
  })

  test('a session terminated on the server is logged in again on NotAuthenticated', async () => {
    const other = (await adapter.connect(conn())) as VimSession
    const before = s.client.loginKey
    expect(before).toBeTruthy()
    await other.client.call('TerminateSession', x.ref('_this', other.client.serviceContent.sessionManager) + x.list('sessionId', [before!]))
    await other.close()
    expect((await s.listVms()).some((m) => m.vm_id === linuxVm)).toBe(true)
    expect(s.client.loginKey).not.toBe(before)
  })
})

describe('SOAP client against hostile peers (plain HTTP servers standing in for a broken endpoint)', () => {
  let srv: Server
  let base = ''
  let answer: (res: import('node:http').ServerResponse) => void = () => {}
  beforeAll(async () => {
    srv = createServer((_req, res) => answer(res))
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()))
    base = `http://127.0.0.1:${(srv.address() as { port: number }).port}/sdk`
  })
  afterAll(async () => {
    srv.closeAllConnections()
    await new Promise((r) => srv.close(() => r(null)))
  })
  const client = () => new VimClient({ sdkUrl: base, tls: {}, timeoutMs: 1500, retries: 1, retryBaseMs: 10, maxResponseBytes: 64 * 1024 })

  test('not a SOAP endpoint, a DOCTYPE, an oversized answer, deep nesting, silence: E_MIG_SOURCE_UNREACHABLE, nothing hangs', async () => {
    const cases: [string, (res: import('node:http').ServerResponse) => void, RegExp][] = [
      ['html', (res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html><body>hello</body></html>'), /not a SOAP envelope/],
      ['404', (res) => res.writeHead(404).end('nope'), /HTTP 404/],
      ['doctype', (res) => res.writeHead(200).end('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><x>&a;</x>'), /DOCTYPE/],
      ['huge', (res) => res.writeHead(200).end('<a>' + 'x'.repeat(200_000) + '</a>'), /exceeds/],
      [
        'deep',
        (res) =>
          res
            .writeHead(200)
            .end('<soapenv:Envelope xmlns:soapenv="s"><soapenv:Body>' + '<a>'.repeat(500) + '</a>'.repeat(500) + '</soapenv:Body></soapenv:Envelope>'),
        /well-formed|not a SOAP/,
      ],
      ['silent', () => {}, /RetrieveServiceContent/],
    ]
    for (const [name, fn, msg] of cases) {
      answer = fn
      const c = client()
      const started = Date.now()
      const e = await thrown(() => c.connect())
      await c.close()
      expect([name, e.code]).toEqual([name, 'E_MIG_SOURCE_UNREACHABLE'])
      expect(e.message).toMatch(msg)
      expect(Date.now() - started).toBeLessThan(10_000)
    }
  })
})

for (const runtime of RUNTIMES) {
  describe(`source endpoints of the real server under ${runtime}`, () => {
    const d = tempDir(`mig-vim-http-${runtime}-`)
    let srv: RunningServer
    const call = async (method: string, p: string, body?: unknown) => {
      const res = await fetch(srv.base + p, {
        method,
        headers: body ? { 'content-type': 'application/json' } : {},
        body: body ? JSON.stringify(body) : undefined,
      })
      const text = await res.text()
      return { status: res.status, body: text ? JSON.parse(text) : null }
    }
    beforeAll(async () => {
      srv = await startServer(runtime, d.dir)
    }, 120_000)
    afterAll(async () => {
      await srv?.stop()
      d.cleanup()
    })

    test('POST /sources, test, list VMs, inspect, unknown VM 404, wrong password 502 E_MIG_AUTH_FAILED, closed port 502', async () => {
      const c = await call('POST', '/sources', {
        name: 'vcsim',
        kind: 'vim_api',
        endpoint: v.url,
        username: v.username,
        password: v.password,
        tls: { ca_pem: v.certPem },
      })
      expect(c.status).toBe(201)
      const id = c.body.id
      const probe = await call('POST', `/sources/${id}/test`)
      expect([probe.status, probe.body]).toEqual([200, { ok: true, product: 'VMware vCenter Server 6.5.0 build-5973321', version: '6.5.0' }])
      const list = await call('GET', `/sources/${id}/vms`)
      expect(list.status).toBe(200)
      expect(list.body.items.find((m: any) => m.vm_id === linuxVm)?.name).toBe('web01')
      const one = await call('GET', `/sources/${id}/vms/${linuxVm}`)
      expect([one.status, one.body.disks.map((x: any) => [x.label, x.capacity_bytes]), one.body.cbt_available]).toEqual([
        200,
        [
          ['web01', 3 * MiB],
          ['web01_1', 2 * MiB],
        ],
        true,
      ])
      const missing = await call('GET', `/sources/${id}/vms/vm-424242`)
      expect([missing.status, missing.body.error.code]).toEqual([404, 'E_MIG_VM_NOT_FOUND'])

      const bad = await call('POST', '/sources', {
        name: 'vcsim-badpw',
        kind: 'vim_api',
        endpoint: v.url,
        username: v.username,
        password: 'not-it',
        tls: { thumbprint: v.thumbprint },
      })
      const auth = await call('POST', `/sources/${bad.body.id}/test`)
      expect([auth.status, auth.body.error.code]).toEqual([502, 'E_MIG_AUTH_FAILED'])
      const port = await freePort()
      const gone = await call('POST', '/sources', {
        name: 'vcsim-gone',
        kind: 'vim_api',
        endpoint: `127.0.0.1:${port}`,
        username: 'u',
        password: 'p',
        tls: { insecure: true },
      })
      const unreachable = await call('GET', `/sources/${gone.body.id}/vms`)
      expect([unreachable.status, unreachable.body.error.code]).toEqual([502, 'E_MIG_SOURCE_UNREACHABLE'])
    })
  })
}
