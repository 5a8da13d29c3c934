/**
 * The console's warm cutover and bulk plans against govmomi's vCenter simulator (test/vcsim
 * harness; ESXi itself cannot run here), the real server (Bun) and Chromium:
 * - a warm job with `cutover: {mode: "manual"}` waits in DeltaSyncing; its page shows the delta
 *   passes (last sync time and bytes) and the projected downtime; Cut over (confirmed in the
 *   dialog) sends `POST /migrations/:id/cutover` and the job goes on to Completed; before that,
 *   Test boot boots a clone of its disk (no OS on it: the card shows the failure, the job waits);
 * - a Cut over confirmed after the job was cancelled under the open dialog shows the server's
 *   409 with its code (`E_MIG_CONFLICT`);
 * - a bulk plan of two warm VMs (app depends on db) is listed on the Plans page with its counts;
 *   its page lists the VMs with depends_on, and Cut over all cuts over db and then app (which
 *   reaches the wait after db completed) to a Completed plan, after which the button is disabled.
 * No guest boots (`start: false`): the cutover is the point.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import * as path from 'node:path'
import { makeRawImage } from '../helpers/inputs.ts'
import { call, livePlan, submit, waitJob } from '../helpers/jobs.ts'
import { putVmdk, registerVcsim, startVcsim, type Vcsim, SMALL_LINUX_VM } from '../helpers/vcsim.ts'
import { consoleUrl, consoleSuite } from './browser.ts'
import type { Locator, Page } from 'playwright-core'

const MiB = 1024 * 1024

describe('web console: warm cutover and bulk plans (vCenter simulator)', () => {
  let v: Vcsim
  const { t, srv, b } = consoleSuite(
    'i17x-',
    'i17x-ui-cut-',
    { MIGRATOR_DOMAIN_TYPE: 'qemu', MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: '5' },
    { also: () => [v] },
  )
  let sourceId: string

  /** A running VM with CBT and one 8 MiB flat disk the guest writes 128 KiB to before every delta snapshot. */
  async function makeVm(name: string): Promise<string> {
    const raw = makeRawImage(path.join(t.dir, `${name}.raw`), 8 * MiB, name.length)
    const file = await putVmdk(v, name, name, raw, 'flat')
    const id = await v.createVm({
      name,
      ...SMALL_LINUX_VM,
      cbt: true,
      power_on: true,
      disks: [{ file, capacity_bytes: 8 * MiB }],
      nics: [{ mac: '00:50:56:17:00:01' }],
    })
    await v.scheduleWrites(id, [{ before_snapshot: 1, every: true, file, offset: 2 * MiB, length: 128 * 1024, pattern: 0x50 }])
    return id
  }

  /**
   * Waits for `locator`; on a timeout fails with the plan's jobs (state, last error, progress) and
   * the server's log tail, so that a failure says why (this wait timed out once in a CI-like run).
   */
  async function waitOrExplain(locator: Locator, timeout: number, planId: string): Promise<void> {
    try {
      await locator.waitFor({ timeout })
    } catch (e) {
      const plan = (await call(srv.base, 'GET', `/plans/${planId}`)).body
      const jobs = await Promise.all((plan.vms ?? []).map(async (x: any) => (x.job_id ? (await call(srv.base, 'GET', `/migrations/${x.job_id}`)).body : null)))
      const brief = jobs.map((j: any) => j && { key: j.bulk_key, state: j.state, last_error: j.last_error, progress: j.progress })
      throw new Error(`${(e as Error).message}\nplan ${plan.state}: ${JSON.stringify(brief)}\nserver log (tail):\n${srv.stderr().slice(-4000)}`)
    }
  }

  const warmPlan = (vmId: string, name: string) => livePlan(sourceId, vmId, 'Warm', { name, start: false })

  /** A new VM `name` and its warm job with a manual cutover (a delta pass every second), the job's page open. */
  async function openManualCutoverJob(name: string): Promise<{ vm: string; job: any; page: Page }> {
    const vm = await makeVm(name)
    const job = await submit(srv.base, { ...warmPlan(vm, name), cutover: { mode: 'manual' }, precopy_interval_seconds: 1 })
    const { page } = b
    await page.goto(consoleUrl(srv.base, `#/migrations/${job.id}`))
    return { vm, job, page }
  }

  beforeAll(async () => {
    v = await startVcsim()
    sourceId = await registerVcsim(srv.base, v)
  }, 180_000)

  test('a warm job waits for the cutover, shows its last delta sync, and cuts over from the page', async () => {
    const { vm, job, page } = await openManualCutoverJob('i17x-cut')
    const card = page.getByTestId('cutover')
    await card.waitFor()
    expect(await card.getAttribute('data-mode')).toBe('manual')
    // waiting in DeltaSyncing with two passes done: the button is enabled, the last pass shown
    await page.locator('[data-testid=cutover][data-waiting=true]').waitFor({ timeout: 120_000 })
    await page.waitForFunction(() => Number(document.querySelector('[data-testid=cutover-passes]')?.getAttribute('data-passes')) >= 2, null, {
      timeout: 60_000,
    })
    const button = page.getByTestId('cutover-button')
    expect(await button.isEnabled()).toBe(true)
    expect(await page.getByTestId('cutover-phase').textContent()).toContain('Waiting for the cutover')
    expect(await page.getByTestId('cutover-last-pass').textContent()).toContain('128.0 KiB changed, pass took')
    expect(await page.getByTestId('cutover-downtime').textContent()).toContain('shutdown ≤ 5 s')
    expect((await call(srv.base, 'GET', `/migrations/${job.id}`)).body.state).toBe('DeltaSyncing')
    await card.screenshot({ path: path.join(path.dirname(await b.screenshot('cutover-waiting')), 'cutover-card.png') })
    // a test boot from the page: the disk holds no OS, so the clone does not boot; the card says
    // so with the reason and the job keeps waiting for its cutover
    await page.getByTestId('test-boot-button').click()
    await page.locator('[data-testid=test-boot][data-state=failed]').waitFor({ timeout: 120_000 })
    expect(await page.getByTestId('test-boot-state').textContent()).toContain('read why before cutting over')
    await page.getByTestId('test-boot').screenshot({ path: path.join(path.dirname(await b.screenshot('test-boot-failed')), 'test-boot-card.png') })
    const tested = (await call(srv.base, 'GET', `/migrations/${job.id}`)).body
    expect([tested.state, tested.test_boot.state, tested.test_boot.domain]).toEqual(['DeltaSyncing', 'failed', 'i17x-cut-testboot'])
    // the dialog asks first; "Not yet" sends nothing
    await button.click()
    await page.getByTestId('cutover-dialog').waitFor()
    await page.getByRole('button', { name: 'Not yet' }).click()
    expect((await call(srv.base, 'GET', `/migrations/${job.id}`)).body.cutover.requested_at).toBeNull()
    await button.click()
    await page.getByTestId('confirm-cutover').click()
    await page.locator('[data-testid=job][data-state=Completed]').waitFor({ timeout: 120_000 })
    expect(await page.getByTestId('cutover-button').count()).toBe(0)
    expect(await page.getByTestId('error').count()).toBe(0)
    const done = await waitJob(srv.base, job.id)
    expect([done.state, done.effective_mode, done.last_error, typeof done.cutover.requested_at]).toEqual(['Completed', 'Warm', null, 'string'])
    expect(Date.parse(done.cutover.started_at)).toBeGreaterThanOrEqual(Date.parse(done.cutover.requested_at))
    expect((await v.vm(vm)).power_state).toBe('poweredOff')
    expect(b.errors).toEqual([])
  }, 300_000)

  test('a Cut over confirmed after the job was cancelled under the dialog shows E_MIG_CONFLICT', async () => {
    const { job, page } = await openManualCutoverJob('i17x-cut409')
    await page.locator('[data-testid=cutover][data-waiting=true]').waitFor({ timeout: 120_000 })
    await page.getByTestId('cutover-button').click()
    await page.getByTestId('cutover-dialog').waitFor()
    // another operator cancels the job meanwhile
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/cancel`)).status).toBe(202)
    await page.locator('[data-testid=job][data-state=Cancelled]').waitFor({ timeout: 60_000 })
    await page.getByTestId('confirm-cutover').click()
    // the job's own last_error (E_MIG_CANCELLED) shows above; the cutover's answer in its card
    const err = page.getByTestId('cutover').getByTestId('error')
    await err.waitFor()
    expect(await err.textContent()).toContain('E_MIG_CONFLICT')
    expect(await err.textContent()).toContain('not waiting for a cutover')
    expect(await page.getByTestId('cutover-button').isDisabled()).toBe(true)
    // the browser logs the refused request; nothing else went wrong
    expect(b.errors).toEqual(['console: Failed to load resource: the server responded with a status of 409 (Conflict)'])
    b.errors.length = 0
  }, 240_000)

  test('Plans: the list shows a bulk plan with counts, its page lists the VMs and Cut over all completes it', async () => {
    const db = await makeVm('i17x-db')
    const app = await makeVm('i17x-app')
    const created = await call(srv.base, 'POST', '/plans', {
      name: 'i17x-erp',
      cutover: { mode: 'manual' },
      precopy_interval_seconds: 1,
      vms: [
        { key: 'db', plan: warmPlan(db, 'i17x-db') },
        { key: 'app', plan: warmPlan(app, 'i17x-app'), depends_on: ['db'] },
      ],
    })
    expect(created.status).toBe(201)
    const id = created.body.id
    const { page } = b
    await page.goto(consoleUrl(srv.base, '#/plans'))
    const row = page.locator(`[data-plan="${id}"]`)
    await row.waitFor()
    expect(await row.textContent()).toContain('2 VMs')
    await row.getByRole('link', { name: 'i17x-erp' }).click()
    await page.waitForURL(new RegExp(`#/plans/${id}$`))
    await page.getByTestId('plan-vms').waitFor()
    expect(await page.getByTestId('depends-app').textContent()).toBe('db')
    expect(await page.getByTestId('depends-db').textContent()).toBe('–')
    // db waits in DeltaSyncing, app waits for db: the shared cutover is offered
    await waitOrExplain(page.locator('[data-vm=db][data-state=DeltaSyncing]'), 120_000, id)
    const button = page.getByTestId('plan-cutover')
    await page.waitForFunction(() => !(document.querySelector('[data-testid=plan-cutover]') as HTMLButtonElement | null)?.disabled, null, { timeout: 60_000 })
    expect(await page.locator('[data-vm=app]').getAttribute('data-state')).toBe('Queued')
    expect(await page.getByTestId('plan-cutover-text').textContent()).toContain('1 of 2 warm VM(s) wait in DeltaSyncing')
    // a test boot of db (its disk holds no OS) shows in the plan's test boot column
    expect(await page.getByTestId('test-boot-db').textContent()).toBe('–')
    const dbJob = await page.getByTestId('vm-job-db').getAttribute('href')
    await call(srv.base, 'POST', `/migrations/${dbJob!.split('/').pop()}/test-boot`)
    await page.waitForFunction(() => document.querySelector('[data-testid=test-boot-db]')?.textContent === 'failed', null, { timeout: 120_000 })
    await b.screenshot('plan-page')
    // the VM's job link leads to its job page, which links back to the plan
    await page.getByTestId('vm-job-db').click()
    await page.getByTestId('job-plan').click()
    await page.waitForURL(new RegExp(`#/plans/${id}$`))
    await button.click()
    await page.getByTestId('confirm-plan-cutover').click()
    await waitOrExplain(page.locator('[data-testid=plan][data-state=Completed]'), 150_000, id)
    expect(await button.isDisabled()).toBe(true)
    expect(await page.getByTestId('error').count()).toBe(0)
    expect(await page.getByTestId('plan-counts').textContent()).toBe('2 completed')
    await b.screenshot('plan-completed')
    const plan = (await call(srv.base, 'GET', `/plans/${id}`)).body
    expect([plan.state, typeof plan.cutover_requested_at]).toEqual(['Completed', 'string'])
    const jobs = await Promise.all(plan.vms.map((x: any) => waitJob(srv.base, x.job_id)))
    expect(jobs.map((j) => [j.bulk_key, j.state, j.cutover.requested_at])).toEqual([
      ['db', 'Completed', plan.cutover_requested_at],
      ['app', 'Completed', plan.cutover_requested_at],
    ])
    // app started after db completed (dependency order)
    expect(Date.parse(jobs[1].started_at)).toBeGreaterThanOrEqual(Date.parse(jobs[0].finished_at))
    // the list follows too
    await page.goto(consoleUrl(srv.base, '#/plans'))
    await page.locator(`[data-plan="${id}"][data-state=Completed]`).waitFor()
    expect(b.errors).toEqual([])
  }, 360_000)
})
