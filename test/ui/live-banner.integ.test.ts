/**
 * The console's Sources page against govmomi's vCenter simulator (test/vcsim harness; ESXi itself
 * cannot run here) and the real server (Bun): register a vim_api source from the form (the
 * password goes only to the API), test it, list and inspect its VMs, start a Warm migration of a
 * VM without CBT; the job page shows the non-fatal E_MIG_CBT_UNSUPPORTED downgrade as a banner
 * (spec 1.4, 6) while the job runs on to Completed.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import * as path from 'node:path'
import { makeRawImage } from '../helpers/inputs.ts'
import { call } from '../helpers/jobs.ts'
import { putVmdk, startVcsim, type Vcsim, SMALL_LINUX_VM } from '../helpers/vcsim.ts'
import { consoleUrl, submitPlan, consoleSuite } from './browser.ts'

const MiB = 1024 * 1024

describe('web console: vSphere source, warm plan without CBT (vCenter simulator)', () => {
  let v: Vcsim
  const { t, srv, b } = consoleSuite('i17l-', 'i17l-ui-vim-', { MIGRATOR_DOMAIN_TYPE: 'qemu' }, { also: () => [v] })

  beforeAll(async () => {
    v = await startVcsim()
  }, 180_000)

  test('register, test, list, inspect, start Warm: the downgrade banner shows and the job completes cold', async () => {
    const raw = makeRawImage(path.join(t.dir, 'nocbt.raw'), 8 * MiB, 3)
    const file = await putVmdk(v, 'i17l-nocbt', 'i17l-nocbt', raw, 'flat')
    await v.createVm({
      name: 'i17l-nocbt',
      ...SMALL_LINUX_VM,
      cbt: false,
      power_on: true,
      disks: [{ file, capacity_bytes: 8 * MiB }],
      nics: [{ mac: '00:50:56:0a:0b:0c' }],
    })
    const { page } = b
    await page.goto(consoleUrl(srv.base, '#/sources'))
    const form = page.getByTestId('add-source')
    await form.locator('input[name=name]').fill('vcsim')
    await form.locator('input[name=endpoint]').fill(v.url)
    await form.locator('input[name=username]').fill(v.username)
    await form.locator('input[name=password]').fill(v.password)
    await form.locator('input[name=thumbprint]').fill(v.thumbprint)
    await form.locator('button[type=submit]').click()
    const card = page.getByTestId('source-vcsim')
    await card.waitFor()
    // the API has the source, never its password
    const sources = (await call(srv.base, 'GET', '/sources')).body.items
    expect(sources.map((s: any) => [s.name, s.kind, s.endpoint, s.tls.thumbprint])).toEqual([['vcsim', 'vim_api', v.url, v.thumbprint]])
    expect(JSON.stringify(sources)).not.toContain(v.password)
    await card.getByRole('button', { name: 'Test' }).click()
    expect(await card.getByTestId('source-test').textContent()).toContain('Connected: ')
    await card.getByTestId('list-vms').click()
    await card.locator('[data-vm=i17l-nocbt]').waitFor()
    await card.getByTestId('inspect-vm-i17l-nocbt').click()
    await card.getByTestId('manifest').waitFor()
    expect(await card.getByTestId('manifest').textContent()).toContain('CBTnot available')
    expect(await card.getByTestId('nics').textContent()).toContain('00:50:56:0a:0b:0c')
    await card.locator('input[name=mode][value=Warm]').check()
    const id = await submitPlan(page, card, 'i17l-nocbt')
    const banner = page.getByTestId('notice-banner')
    await banner.waitFor({ timeout: 60_000 })
    expect(await banner.textContent()).toContain('E_MIG_CBT_UNSUPPORTED')
    await page.locator('[data-testid=job][data-state=Completed]').waitFor({ timeout: 90_000 })
    // a notice, not an error: the banner stays, no error box
    expect(await banner.isVisible()).toBe(true)
    expect(await page.getByTestId('error').count()).toBe(0)
    await b.screenshot('warm-downgrade-banner')
    const job = (await call(srv.base, 'GET', `/migrations/${id}`)).body
    expect([job.plan.mode, job.effective_mode, job.state, job.last_error?.code, job.last_error?.fatal, job.plan.source_ref.source_id]).toEqual([
      'Warm',
      'Cold',
      'Completed',
      'E_MIG_CBT_UNSUPPORTED',
      false,
      sources[0].id,
    ])
    expect(await page.getByTestId('job-meta').textContent()).toContain('live, cold (asked warm)')
  }, 180_000)
})
