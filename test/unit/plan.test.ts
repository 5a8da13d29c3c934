import { describe, expect, test } from 'bun:test'
import { parseSubmitBody, strategyOf } from '../../lib/plan.ts'
import { thrown } from '../helpers/tmp.ts'

const live = { source: { Live: 'vim_api' }, source_ref: { kind: 'live_vm', source_id: '6f1c2a8e-4b7d-4c3e-9a2b-1d2e3f4a5b6c', vm_id: 'vm-42' }, mode: 'Warm' }
const offline = { source: { Offline: 'ova_archive' }, source_ref: { kind: 'offline_host_path', path: 'exports/web01.ova' }, mode: 'Cold' }

describe('plan validation (spec 2.1)', () => {
  test('accepts the live and offline forms of spec 4', () => {
    expect(parseSubmitBody({ plan: live }).mode).toBe('Warm')
    expect(parseSubmitBody({ plan: offline }).source).toEqual({ Offline: 'ova_archive' })
    expect(strategyOf(parseSubmitBody({ plan: live }))).toBe('live')
    expect(strategyOf(parseSubmitBody({ plan: offline }))).toBe('offline')
    expect(strategyOf(parseSubmitBody({ plan: { ...offline, source: { Offline: 'vmcx_export' } } }))).toBe('passthrough')
  })

  test('accepts the optional fields of DESIGN.md section 3', () => {
    const p = parseSubmitBody({
      plan: {
        ...offline,
        name: 'web01',
        destination: { pool: 'tank' },
        guest_os: 'windows',
        networks: [{ source: 'VM Network', bridge: 'br0' }],
        firmware: 'efi',
        start: false,
        restore_point: { backup_job_id: '6f1c2a8e-4b7d-4c3e-9a2b-1d2e3f4a5b6c', require_quiesced: true },
      },
    })
    expect(p.guest_os).toBe('windows')
  })

  async function issues(body: unknown): Promise<string[]> {
    const e = await thrown(() => parseSubmitBody(body))
    expect(e.code).toBe('E_MIG_INVALID_PLAN')
    expect(e.status).toBe(400)
    return e.details.issues.map((i: { path: string }) => i.path)
  }

  test('lists every failing field path', async () => {
    const paths = await issues({ plan: { source: { Live: 'vim_api' }, source_ref: { kind: 'live_vm', source_id: 'nope', vm_id: '' }, mode: 'Hot' } })
    expect(paths).toContain('plan.source_ref.source_id')
    expect(paths).toContain('plan.source_ref.vm_id')
    expect(paths).toContain('plan.mode')
  })

  test('rejects unknown fields, unknown kinds, both tags, mixed live/offline, __proto__', async () => {
    expect(await issues({ plan: { ...offline, extra: 1 } })).toContain('plan')
    expect(await issues({ plan: offline, more: true })).toContain('(body)')
    expect((await issues({ plan: { ...offline, source: { Offline: 'iso_image' } } })).some((p) => p.startsWith('plan.source'))).toBe(true)
    expect((await issues({ plan: { ...offline, source: { Offline: 'ova_archive', Live: 'vim_api' } } })).some((p) => p.startsWith('plan.source'))).toBe(true)
    expect(await issues({ plan: { ...live, source_ref: offline.source_ref } })).toContain('plan.source_ref.kind')
    expect(await issues({ plan: { ...offline, source_ref: live.source_ref } })).toContain('plan.source_ref.kind')
    expect(await issues(JSON.parse(`{"plan": ${JSON.stringify(offline).replace(/^\{/, '{"__proto__": {"x": 1},')}}`))).toContain('plan')
    expect(await issues({})).toContain('plan')
    expect(await issues({ plan: { ...offline, networks: [{ source: 'a', bridge: 'br0; rm -rf /' }] } })).toContain('plan.networks.0.bridge')
  })
})
