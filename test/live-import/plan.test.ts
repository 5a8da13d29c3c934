/**
 * Plans asking for a live import (`plan.live_import`, docs/live-import.md): accepted for cold
 * offline imports and cold `vim_api` migrations that start the guest, refused with `E_MIG_INVALID_PLAN` naming
 * `plan.live_import` and the reason otherwise.
 */
import { describe, expect, test } from 'bun:test'
import { parseSubmitBody } from '../../lib/plan.ts'
import { thrown } from '../helpers/tmp.ts'

const base = {
  source: { Offline: 'vmx_folder' },
  source_ref: { kind: 'offline_host_path', path: 'vm/vm.vmx' },
  mode: 'Cold',
  live_import: true,
}

async function refusal(plan: Record<string, unknown>): Promise<{ code: string; issues: Array<{ path: string; message: string }> }> {
  const e = await thrown(() => parseSubmitBody({ plan }))
  return { code: e.code, issues: e.details.issues }
}

/** The source of a plan migrating VM `vm-1` of a registered source of live adapter `kind`. */
const vm = (kind: string) => ({
  source: { Live: kind },
  source_ref: { kind: 'live_vm', source_id: '0b5a4c1e-8d7f-4e3a-9c2b-1a2b3c4d5e6f', vm_id: 'vm-1' },
})

describe('plan.live_import', () => {
  test('accepted: offline host path, upload and remote sources, a vim_api VM, cold, started', () => {
    expect(parseSubmitBody({ plan: base }).live_import).toBe(true)
    expect(parseSubmitBody({ plan: { ...base, start: true } }).live_import).toBe(true)
    expect(
      parseSubmitBody({
        plan: { ...base, source: { Offline: 'ova_archive' }, source_ref: { kind: 'upload', upload_id: '0b5a4c1e-8d7f-4e3a-9c2b-1a2b3c4d5e6f' } },
      }).live_import,
    ).toBe(true)
    const url = { ...base, source: { Offline: 'qcow2' }, source_ref: { kind: 'offline_url', url: 'https://files.example/vm.qcow2' } }
    expect(parseSubmitBody({ plan: url }).live_import).toBe(true)
    expect(parseSubmitBody({ plan: { ...base, ...vm('vim_api') } }).live_import).toBe(true)
    expect(parseSubmitBody({ plan: { ...base, live_import: false, start: false } }).live_import).toBe(false)
  })

  test('refused with the reason: start false, a warm plan (vim_api too), another live adapter, the virt-v2v passthrough', async () => {
    for (const [plan, words] of [
      [{ ...base, start: false }, /"start": false/],
      [{ ...base, mode: 'Warm' }, /warm migration/],
      [{ ...base, ...vm('vim_api'), mode: 'Warm' }, /warm migration/],
      [{ ...base, ...vm('libvirt_remote') }, /libvirt_remote adapter's disks are not served/],
      [{ ...base, source: { Offline: 'vmcx_export' } }, /virt-v2v/],
    ] as Array<[Record<string, unknown>, RegExp]>) {
      const r = await refusal(plan)
      expect(r.code).toBe('E_MIG_INVALID_PLAN')
      const issue = r.issues.find((i) => i.path === 'plan.live_import')
      expect(issue?.message).toMatch(words)
    }
  })

  test('a wrong type is refused naming the field', async () => {
    const r = await refusal({ ...base, live_import: 'yes' })
    expect(r.issues.map((i) => i.path)).toContain('plan.live_import')
  })
})
