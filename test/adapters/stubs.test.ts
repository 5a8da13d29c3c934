/**
 * The five live adapter stubs (spec 1.1): endpoint rules per product, E_MIG_SOURCE_UNREACHABLE
 * when nothing listens, and a session (against a real TCP listener on 127.0.0.1) whose listing,
 * inspection and data plane fail with E_MIG_INTERNAL, snapshots with E_MIG_SNAPSHOT_FAILED.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createServer, type Server } from 'node:net'
import { adapterFor } from '../../lib/adapters/index.ts'
import { STUB_KINDS, validateStubEndpoint, type StubKind } from '../../lib/adapters/stubs.ts'
import type { LiveSession } from '../../lib/adapters/types.ts'
import { freePort } from '../helpers/server.ts'
import { thrown } from '../helpers/tmp.ts'

const RULES: Record<StubKind, { good: [string, string][]; bad: string[] }> = {
  wmi_api: {
    good: [
      ['hv01.example.test', 'https://hv01.example.test:5986/wsman'],
      ['http://hv01:5985/wsman', 'http://hv01:5985/wsman'],
      ['https://10.0.0.5/wsman/', 'https://10.0.0.5:5986/wsman'],
    ],
    bad: ['ftp://hv01/wsman', 'https://hv01/api', 'https://admin:pw@hv01/wsman', 'https://hv01:70000/wsman', 'https://hv01/wsman?x=1', 'hv_01.bad!'],
  },
  pve_api: {
    good: [
      ['pve1', 'https://pve1:8006/api2/json'],
      ['https://pve1.lan:8006/api2/json', 'https://pve1.lan:8006/api2/json'],
      ['https://[fd00::1]', 'https://[fd00::1]:8006/api2/json'],
    ],
    bad: ['http://pve1:8006/api2/json', 'https://pve1/api2/xml', 'https://root@pve1/api2/json', 'pve1/api2/json'],
  },
  xen_api: {
    good: [
      ['xen1', 'https://xen1:443/'],
      ['http://xen1', 'http://xen1:80/'],
      ['https://xen1:8443/', 'https://xen1:8443/'],
    ],
    bad: ['https://xen1/json', 'xmlrpc://xen1', 'https://xen1:0/'],
  },
  prism_api: {
    good: [
      ['prism.lan', 'https://prism.lan:9440/api/nutanix/v3'],
      ['https://prism.lan:9440/PrismGateway/services/rest/v2.0', 'https://prism.lan:9440/PrismGateway/services/rest/v2.0'],
    ],
    bad: ['http://prism.lan:9440/api/nutanix/v3', 'https://prism.lan/api/nutanix/v4', 'https://prism.lan/#x'],
  },
}

describe('stub adapters: endpoint rules', () => {
  for (const kind of STUB_KINDS) {
    test(`${kind}: product schemes, default port and API path; bad endpoints E_MIG_BAD_REQUEST`, async () => {
      for (const [input, url] of RULES[kind].good) expect([input, validateStubEndpoint(kind, input).url]).toEqual([input, url])
      for (const input of RULES[kind].bad) {
        const e = await thrown(() => adapterFor(kind).connect({ endpoint: input, username: 'u', password: 'p', tls: {} }))
        expect([input, e.code]).toEqual([input, 'E_MIG_BAD_REQUEST'])
      }
      expect(adapterFor(kind).supportsWarm()).toBe(false)
      expect(adapterFor(kind).kind).toBe(kind)
    })
  }
})

describe('stub adapters: reachability and the failing data plane', () => {
  let srv: Server
  let port = 0
  beforeAll(async () => {
    srv = createServer((s) => s.end())
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()))
    port = (srv.address() as { port: number }).port
  })
  afterAll(async () => {
    await new Promise((r) => srv.close(() => r(null)))
  })

  const endpoint = (kind: StubKind, p: number) => (kind === 'xen_api' ? `https://127.0.0.1:${p}/` : `127.0.0.1:${p}`)

  for (const kind of STUB_KINDS) {
    test(`${kind}: nothing listening -> E_MIG_SOURCE_UNREACHABLE; a listener -> a session whose every data-plane method fails`, async () => {
      const closed = await freePort()
      const e = await thrown(() => adapterFor(kind).connect({ endpoint: endpoint(kind, closed), username: 'u', password: 'p', tls: {} }))
      expect(e.code).toBe('E_MIG_SOURCE_UNREACHABLE')
      expect(e.message).toContain(String(closed))

      const s = (await adapterFor(kind).connect({ endpoint: endpoint(kind, port), username: 'u', password: 'p', tls: {} })) as LiveSession
      const about = await s.describe()
      expect(about.product).toContain('stub adapter')
      expect(about.version).toBeNull()
      expect(s.supportsWarm()).toBe(false)
      const disk = { label: 'd', capacity_bytes: 1, disk_format: 'raw' as const, source: { path: '/x' }, controller: 'scsi' as const, address: 'scsi0:0' }
      const snap = { id: 's', change_ids: {} }
      const calls: [string, () => Promise<unknown>, string][] = [
        ['listVms', () => s.listVms(), 'E_MIG_INTERNAL'],
        ['inspect', () => s.inspect('vm-1'), 'E_MIG_INTERNAL'],
        ['enableCbt', () => s.enableCbt('vm-1'), 'E_MIG_INTERNAL'],
        ['createSnapshot', () => s.createSnapshot('vm-1', 'migrator-x-0'), 'E_MIG_SNAPSHOT_FAILED'],
        ['openDisk', () => s.openDisk('vm-1', snap, disk), 'E_MIG_INTERNAL'],
        ['changedAreas', () => s.changedAreas('vm-1', snap, disk, '*'), 'E_MIG_INTERNAL'],
        ['removeSnapshot', () => s.removeSnapshot('vm-1', snap), 'E_MIG_INTERNAL'],
        ['shutdown', () => s.shutdown('vm-1'), 'E_MIG_INTERNAL'],
        ['mark', () => s.mark('vm-1', 'job'), 'E_MIG_INTERNAL'],
      ]
      for (const [name, fn, code] of calls) expect([name, (await thrown(fn)).code]).toEqual([name, code])
      await s.cleanup('vm-1') // never throws
      await s.close()
    })
  }
})
