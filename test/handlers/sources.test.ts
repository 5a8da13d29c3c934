import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import * as create from '../../handlers/sources/create.ts'
import * as list from '../../handlers/sources/list.ts'
import * as get from '../../handlers/sources/get.ts'
import * as del from '../../handlers/sources/delete.ts'
import * as probe from '../../handlers/sources/test.ts'
import * as vmsList from '../../handlers/sources/vms/list.ts'
import * as vmsGet from '../../handlers/sources/vms/get.ts'
import { req, testCtx, thrown } from '../helpers/env.ts'
import type { Ctx } from '../../runtime/context.ts'

let ctx: Ctx
let cleanup: () => Promise<void>
beforeAll(async () => ({ ctx, cleanup } = await testCtx()))
afterAll(() => cleanup())

const body = {
  name: 'vc01',
  kind: 'vim_api',
  endpoint: 'https://vc01.example.test/sdk',
  username: 'administrator@vsphere.local',
  password: 'S3cret!pw',
  tls: { thumbprint: 'AB'.repeat(32) },
}

describe('sources handlers', () => {
  let id = ''
  test('POST /sources: 201, password sealed in the store and never returned', async () => {
    const res = await create.handle(req('POST', '/sources', body), ctx)
    expect(res.status).toBe(201)
    const text = await res.text()
    expect(text).not.toContain('S3cret')
    const s = JSON.parse(text)
    id = s.id
    expect(s).toMatchObject({
      name: 'vc01',
      kind: 'vim_api',
      endpoint: body.endpoint,
      username: body.username,
      tls: { insecure: false, thumbprint: 'AB'.repeat(32), has_ca: false },
    })
    expect(s.password).toBeUndefined()
    expect(s.secret).toBeUndefined()
    const row = await ctx.store.db.selectFrom('sources').selectAll().where('id', '=', id).executeTakeFirstOrThrow()
    expect(row.secret).not.toContain('S3cret')
    expect(ctx.sealer.open(row.secret, id)).toBe('S3cret!pw')
  })

  test('GET /sources and /sources/:id', async () => {
    const l = await (await list.handle(req('GET', '/sources'), ctx)).json()
    expect(l.items.map((s: any) => s.id)).toEqual([id])
    const g = await (await get.handle(req('GET', `/sources/${id}`), ctx, { id })).json()
    expect(g.name).toBe('vc01')
    expect(JSON.stringify(l) + JSON.stringify(g)).not.toContain('S3cret')
  })

  test('POST /sources: bad bodies are E_MIG_BAD_REQUEST with field paths, duplicate names E_MIG_CONFLICT', async () => {
    const bad = await thrown(() => create.handle(req('POST', '/sources', { ...body, name: 'x2', kind: 'esx', endpoint: 'ftp://h', password: '' }), ctx))
    expect(bad.code).toBe('E_MIG_BAD_REQUEST')
    expect(bad.details.issues.map((i: any) => i.path).sort()).toEqual(['endpoint', 'kind', 'password'])
    expect(bad.message).not.toContain('S3cret')
    expect((await thrown(() => create.handle(req('POST', '/sources', { ...body, endpoint: 'https://user:pw@h/sdk', name: 'x3' }), ctx))).code).toBe(
      'E_MIG_BAD_REQUEST',
    )
    expect((await thrown(() => create.handle(req('POST', '/sources', '{not json'), ctx))).code).toBe('E_MIG_BAD_REQUEST')
    expect((await thrown(() => create.handle(req('POST', '/sources', body), ctx))).code).toBe('E_MIG_CONFLICT')
  })

  test('POST /sources: the endpoint follows the rules of its kind (libvirt URIs with an SSH user, vim_api https /sdk only)', async () => {
    const key = '-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n-----END OPENSSH PRIVATE KEY-----\n'
    const knownHosts = 'kvm1.example.test ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH3kDutIm6bWag/95ZQ1ZvZ13TuJqGVFRE9a3OoS+g1r\n'
    const libvirt = {
      name: 'kvm1',
      kind: 'libvirt_remote',
      endpoint: 'qemu+ssh://root@kvm1.example.test/system',
      username: 'root',
      private_key: key,
      known_hosts: knownHosts,
    }
    const ok = await create.handle(req('POST', '/sources', libvirt), ctx)
    expect(ok.status).toBe(201)
    const text = await ok.text()
    // the private key is sealed, never returned; the pinned host key is
    expect(text).not.toContain('PRIVATE KEY')
    const created = JSON.parse(text)
    expect([created.endpoint, created.known_hosts]).toEqual(['qemu+ssh://root@kvm1.example.test/system', knownHosts])
    const row = await ctx.store.db.selectFrom('sources').selectAll().where('id', '=', created.id).executeTakeFirstOrThrow()
    expect(ctx.sealer.open(row.secret, created.id)).toBe(key)
    for (const [kind, endpoint, why] of [
      ['vim_api', 'http://vc02.example.test/sdk', /https only/],
      ['vim_api', 'https://vc02.example.test/api', /\/sdk/],
      ['pve_api', 'qemu+ssh://root@pve1/system', /scheme/],
      ['libvirt_remote', 'qemu+ssh://root:pw@kvm1/system', /credentials|URL|user/],
      ['libvirt_remote', 'qemu+tls://kvm1/other', /path/],
      ['libvirt_remote', 'qemu+tcp://kvm1/system', /neither authentication nor encryption/],
    ] as const) {
      const input = kind === 'libvirt_remote' ? { ...libvirt, name: `bad-${endpoint}`, endpoint } : { ...body, name: `bad-${kind}`, kind, endpoint }
      const e = await thrown(() => create.handle(req('POST', '/sources', input), ctx))
      expect([kind, endpoint, e.code, e.details.issues[0].path, why.test(e.message)]).toEqual([kind, endpoint, 'E_MIG_BAD_REQUEST', 'endpoint', true])
    }
    // each credential problem names its field; no secret is echoed
    const fields = async (over: Record<string, unknown>) => {
      const e = await thrown(() => create.handle(req('POST', '/sources', { ...libvirt, name: 'kvm-x', ...over }), ctx))
      expect(e.code).toBe('E_MIG_BAD_REQUEST')
      expect(e.message).not.toContain('b3BlbnNzaC1rZXktdjEAAAAABG5vbmU')
      return e.details.issues.map((i: any) => i.path).sort()
    }
    expect(await fields({ private_key: undefined, password: 'pw' })).toEqual(['password', 'private_key'])
    expect(await fields({ known_hosts: undefined })).toEqual(['known_hosts'])
    expect(await fields({ known_hosts: 'kvm1 not-a-key' })).toEqual(['known_hosts'])
    expect(await fields({ private_key: 'ssh-ed25519 AAAA public half' })).toEqual(['private_key'])
    expect(await fields({ username: 'admin' })).toEqual(['username'])
    expect(await fields({ endpoint: 'qemu+tls://kvm1/system', known_hosts: undefined })).toEqual(['client_cert', 'tls.ca_pem'])
    expect(await fields({ kind: 'vim_api', endpoint: 'https://vc9/sdk' })).toEqual(['known_hosts', 'password', 'private_key'])
    // tls.insecure skips the host key pin only by choice
    const insecure = await create.handle(req('POST', '/sources', { ...libvirt, name: 'kvm-insecure', known_hosts: undefined, tls: { insecure: true } }), ctx)
    expect(insecure.status).toBe(201)
  })

  test('control-plane calls: no adapter answers in this build -> E_MIG_SOURCE_UNREACHABLE', async () => {
    for (const h of [
      () => probe.handle(req('POST', `/sources/${id}/test`), ctx, { id }),
      () => vmsList.handle(req('GET', `/sources/${id}/vms`), ctx, { id }),
      () => vmsGet.handle(req('GET', `/sources/${id}/vms/vm-1`), ctx, { id, vm_id: 'vm-1' }),
    ]) {
      const e = await thrown(h)
      expect(e.code).toBe('E_MIG_SOURCE_UNREACHABLE')
      expect(e.status).toBe(502)
      expect(e.message).toContain('vc01.example.test')
    }
  })

  test('unknown source: E_MIG_NOT_FOUND everywhere', async () => {
    const nid = '00000000-0000-4000-8000-000000000000'
    for (const h of [get, del, probe, vmsList]) expect((await thrown(() => h.handle(req('GET', '/x'), ctx, { id: nid }))).code).toBe('E_MIG_NOT_FOUND')
    expect((await thrown(() => vmsGet.handle(req('GET', '/x'), ctx, { id: nid, vm_id: 'v' }))).code).toBe('E_MIG_NOT_FOUND')
  })

  test('DELETE /sources/:id: 409 while an active job uses it, then 204', async () => {
    const job = await ctx.store.jobs.create({
      id: crypto.randomUUID(),
      plan: { source: { Live: 'vim_api' }, source_ref: { kind: 'live_vm', source_id: id, vm_id: 'vm-1' }, mode: 'Cold' },
      strategy: 'live',
      effective_mode: 'Cold',
      now: new Date().toISOString(),
    })
    expect((await thrown(() => del.handle(req('DELETE', `/sources/${id}`), ctx, { id }))).code).toBe('E_MIG_CONFLICT')
    await ctx.store.jobs.requestCancel(job.id, new Date().toISOString())
    expect((await del.handle(req('DELETE', `/sources/${id}`), ctx, { id })).status).toBe(204)
    expect((await thrown(() => get.handle(req('GET', '/x'), ctx, { id }))).code).toBe('E_MIG_NOT_FOUND')
  })
})
