/**
 * The web console in a real browser (Debian's Chromium through playwright-core) against the real
 * server (Bun) and its workers: upload an OVA from the page (SHA-256 computed in the browser) and
 * watch the job's progress bar move to Completed; browse the import root, inspect an OVA, see its
 * manifest and submit a plan; a plan with bad fields shows each error next to its field; cancel a
 * running job from the page. Copies are throttled (MIGRATOR_COPY_MAX_BYTES_PER_SECOND) so the
 * page can be seen while they run; a guest whose boot check fails shows E_MIG_GUEST_BOOT_FAILED and
 * the tail of its serial log. Domains are defined with `start: false` where a boot is not the
 * point (prefix `i17c-`).
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { existsSync, mkdirSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { makePowerOffBootDisk } from '../helpers/bootdisk.ts'
import { buildInput, fileSha256 } from '../helpers/inputs.ts'
import { call, offlinePlan, waitJob } from '../helpers/jobs.ts'
import { consoleSuite, consoleUrl, submitPlan } from './browser.ts'

const MiB = 1024 * 1024
/** Source read cap of the server: 2 MiB/s. */
const CAP = 2 * MiB

/** A raw image: `dataBytes` of random data, then zeros up to `sizeBytes`. */
function rawImage(file: string, sizeBytes: number, dataBytes: number): string {
  const b = Buffer.alloc(sizeBytes)
  randomBytes(dataBytes).copy(b)
  writeFileSync(file, b)
  return file
}

describe('web console (Bun server, Chromium)', () => {
  // No MIGRATOR_BOOT_SERIAL_PATTERN: the failed boot below is a guest that really stops.
  const { t, srv, b } = consoleSuite('i17c-', 'i17c-ui-', {
    MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(CAP),
    MIGRATOR_DOMAIN_TYPE: 'qemu',
    MIGRATOR_BOOT_GRACE_SECONDS: '1',
    MIGRATOR_BOOT_TIMEOUT_SECONDS: '4',
  })
  const inputs = path.join(t.dir, 'inputs')
  const data = path.join(t.dir, 'data')
  /** Every URL the page requested: the console works offline, so all are the migrator's. */
  const requested: string[] = []

  beforeAll(async () => {
    mkdirSync(inputs)
    b.page.on('request', (r) => requested.push(r.url()))
  }, 120_000)

  test('upload an OVA from the page: the browser hashes and uploads it, the manifest shows, the progress bar moves and reaches Completed', async () => {
    // 8 MiB of data then 8 MiB of zeros: 4 s at the cap, the zeros skipped
    const raw = rawImage(path.join(inputs, 'up.raw'), 16 * MiB, 8 * MiB)
    const ova = buildInput('ova_archive', inputs, 'i17c-upload', [raw]).path
    const { page } = b
    await page.goto(consoleUrl(srv.base, '#/new'))
    await page.getByTestId('upload-input').setInputFiles(ova)
    await page.locator('[data-testid=upload-progress][data-phase=done]').waitFor({ timeout: 30_000 })
    // the server checked the browser's SHA-256 against the bytes it received
    const uploads = (await call(srv.base, 'GET', '/uploads')).body.items
    expect(uploads.map((u: any) => [u.filename, u.sha256])).toEqual([['i17c-upload.ova', fileSha256(ova)]])
    await expect(page.getByTestId('upload-progress').textContent()).resolves.toContain(`sha256 ${fileSha256(ova)}`)
    // the manifest: the disk with its capacity, the NIC with its MAC
    const manifest = page.getByTestId('manifest')
    await manifest.waitFor()
    expect(await page.getByTestId('disks').textContent()).toContain('16.0 MiB')
    expect(await page.getByTestId('nics').textContent()).toContain('00:50:56:01:02:03')
    const id = await submitPlan(page, page, 'i17c-upload')
    // watch the bar: some value strictly between 0 and 100 while copying, 100 at the end
    const seen = new Set<number>()
    const deadline = Date.now() + 60_000
    let state = ''
    while (Date.now() < deadline) {
      state = (await page.getByTestId('job').getAttribute('data-state')) ?? ''
      seen.add(Number(await page.getByTestId('job-bar').getAttribute('aria-valuenow')))
      if (state === 'Completed') break
      await Bun.sleep(100)
    }
    expect(state).toBe('Completed')
    expect([...seen].some((v) => v > 0 && v < 100)).toBe(true)
    expect(await page.getByTestId('job-bar').getAttribute('aria-valuenow')).toBe('100')
    const job = (await call(srv.base, 'GET', `/migrations/${id}`)).body
    expect([job.state, job.plan.source_ref.kind, job.plan.start, job.domain, job.progress.bytes_done]).toEqual([
      'Completed',
      'upload',
      false,
      'i17c-upload',
      16 * MiB,
    ])
    // figures, per-disk bar, chart from the progress events, timeline through Starting
    const figures = await page.getByTestId('figures').textContent()
    expect(figures).toContain('16.0 MiB of 16.0 MiB')
    expect(figures).toContain(`${(job.progress.bytes_zero / MiB).toFixed(1)} MiB zero, skipped`)
    expect(job.progress.bytes_zero).toBeGreaterThanOrEqual(7 * MiB)
    expect(await page.getByTestId('disk-bars').locator('[role=progressbar]').count()).toBe(1)
    expect(Number(await page.getByTestId('chart').getAttribute('data-samples'))).toBeGreaterThanOrEqual(2)
    expect(await page.locator('[data-testid=timeline] li.done .st').allTextContents()).toEqual(['Queued', 'CopyingFull', 'Starting'])
    expect(await page.getByTestId('domain').textContent()).toBe('i17c-upload')
    await b.screenshot('job-completed')
    // the list shows it Completed too
    await page.goto(consoleUrl(srv.base, '#/'))
    await page.locator(`[data-job="${id}"][data-state=Completed]`).waitFor()
    await b.screenshot('migrations-list')
    // no CDN, no external font: everything came from the migrator (or is inline)
    const origin = new URL(srv.base).origin
    expect(requested.length).toBeGreaterThan(3)
    expect(requested.filter((u) => !u.startsWith(`${origin}/`) && !u.startsWith('data:'))).toEqual([])
    expect(b.errors).toEqual([])
  }, 120_000)

  async function inspectHostFile(rel: string, dir: string): Promise<void> {
    const { page } = b
    await page.goto(consoleUrl(srv.base, '#/new'))
    await page.reload()
    await page.locator(`[data-file="${dir}"] a`).click()
    await page.locator(`[data-file="${rel}"] button`).click()
    await page.getByTestId('manifest').waitFor()
  }

  test('a plan with bad fields: each E_MIG_INVALID_PLAN issue is shown next to its field, nothing is submitted', async () => {
    const root = path.join(data, 'imports', 'i17c-bad')
    mkdirSync(root, { recursive: true })
    buildInput('ova_archive', root, 'i17c-bad', [rawImage(path.join(inputs, 'bad.raw'), 4 * MiB, 1 * MiB)])
    const before = (await call(srv.base, 'GET', '/migrations')).body.items.length
    await inspectHostFile('i17c-bad/i17c-bad.ova', 'i17c-bad')
    const { page } = b
    await page.locator('input[name=name]').fill('bad name!')
    await page.locator('input[name=bridge-0]').fill('not a bridge name at all')
    await page.getByTestId('submit-plan').click()
    const nameErr = page.getByTestId('field-error-name')
    await nameErr.waitFor()
    expect(await nameErr.textContent()).toContain('must be 1-63 characters')
    expect(await nameErr.textContent()).toContain('plan.name')
    expect(await page.getByTestId('field-error-networks.0').textContent()).toContain('must be a Linux interface name')
    // the error sits right under its own input
    const under = await page.locator('input[name=name]').evaluate((el) => el.closest('label')!.nextElementSibling?.getAttribute('data-testid'))
    expect(under).toBe('field-error-name')
    await b.screenshot('plan-field-errors')
    expect((await call(srv.base, 'GET', '/migrations')).body.items.length).toBe(before)
    expect(page.url()).toContain('#/new')
  }, 60_000)

  test('browse the import root, inspect an OVA, see its manifest, submit the plan: the job page follows it to Completed', async () => {
    const root = path.join(data, 'imports', 'i17c-host')
    mkdirSync(root, { recursive: true })
    buildInput('ova_archive', root, 'i17c-host', [rawImage(path.join(inputs, 'host.raw'), 8 * MiB, 2 * MiB)])
    await inspectHostFile('i17c-host/i17c-host.ova', 'i17c-host')
    const { page } = b
    expect(await page.getByTestId('firmware').textContent()).toBe('bios')
    expect(await page.getByTestId('disks').textContent()).toContain('8.0 MiB')
    expect(await page.getByTestId('nics').textContent()).toContain('00:50:56:01:02:03')
    const id = await submitPlan(page, page, 'i17c-host')
    await page.locator('[data-testid=job][data-state=Completed]').waitFor({ timeout: 60_000 })
    const job = (await call(srv.base, 'GET', `/migrations/${id}`)).body
    expect([job.state, job.plan.source, job.plan.source_ref, job.plan.name, job.plan.start]).toEqual([
      'Completed',
      { Offline: 'ova_archive' },
      { kind: 'offline_host_path', path: 'i17c-host/i17c-host.ova' },
      'i17c-host',
      false,
    ])
  }, 90_000)

  test('cancel a running job from the page: confirmation, then Cancelled with E_MIG_CANCELLED and its volumes removed', async () => {
    // 32 MiB of data at 2 MiB/s: 16 s of copy, cancelled after the first bytes
    const root = path.join(data, 'imports', 'i17c-cancel')
    mkdirSync(root, { recursive: true })
    buildInput('qcow2', root, 'i17c-cancel', [rawImage(path.join(inputs, 'cancel.raw'), 32 * MiB, 32 * MiB)])
    const created = await call(srv.base, 'POST', '/migrations', {
      plan: offlinePlan('qcow2', 'i17c-cancel/i17c-cancel/i17c-cancel.qcow2', { name: 'i17c-cancel', start: false }),
    })
    expect(created.status).toBe(201)
    const id = created.body.id
    const { page } = b
    // from the previous test's job page: a hash navigation, the page must not show that job
    await page.goto(consoleUrl(srv.base, `#/migrations/${id}`))
    await page.waitForFunction(
      () =>
        document.querySelector('[data-testid=job]')?.getAttribute('data-state') === 'CopyingFull' &&
        Number(document.querySelector('[data-testid=job-bar]')?.getAttribute('aria-valuenow')) > 0,
      undefined,
      { timeout: 30_000 },
    )
    expect(await page.getByTestId('job-meta').textContent()).toContain(id)
    // the first click only asks
    await page.getByTestId('cancel').click()
    const dialog = page.getByTestId('cancel-dialog')
    await dialog.waitFor()
    await b.screenshot('cancel-confirm')
    expect((await call(srv.base, 'GET', `/migrations/${id}`)).body.status).toBe('running')
    // the 202 answer (still CopyingFull) is held until the stream has shown Cancelled: the order
    // CI met once, which left the page on the stale answer
    const held = `**/migrations/${id}/cancel`
    await page.route(held, async (route) => {
      const answer = await route.fetch()
      await page.locator('[data-testid=job][data-state=Cancelled]').waitFor({ timeout: 30_000 })
      await route.fulfill({ response: answer })
    })
    const answered = page.waitForResponse((r) => r.url().endsWith(`/migrations/${id}/cancel`))
    await page.getByTestId('confirm-cancel').click()
    const answer = await answered
    expect((await answer.json()).state).toBe('CopyingFull')
    await page.unroute(held)
    // the page keeps the fresher copy: still Cancelled once it has had time to apply the stale answer
    await answer.finished()
    await page.evaluate(() => new Promise((done) => setTimeout(done, 300)))
    expect(await page.getByTestId('job').getAttribute('data-state')).toBe('Cancelled')
    expect(await page.getByTestId('error').textContent()).toContain('E_MIG_CANCELLED')
    expect(await page.getByTestId('cancel').count()).toBe(0)
    const job = await waitJob(srv.base, id)
    expect([job.state, job.last_error.code, job.progress.bytes_done < 32 * MiB]).toEqual(['Cancelled', 'E_MIG_CANCELLED', true])
    expect(existsSync(path.join(data, 'volumes', 'migrations', id))).toBe(false)
  }, 90_000)

  test('a failed boot: the job page shows E_MIG_GUEST_BOOT_FAILED, the defined domain and the tail of its serial log', async () => {
    const root = path.join(data, 'imports', 'i17c-boot')
    mkdirSync(root, { recursive: true })
    // prints its marker, then powers the VM off: the domain does not stay up, whatever the serial says
    const disk = makePowerOffBootDisk(path.join(inputs, 'boot.raw'), 'I17-SERIAL-TAIL-4242', 2 * MiB)
    const input = buildInput('qcow2', root, 'i17c-boot', [disk.path])
    const created = await call(srv.base, 'POST', '/migrations', {
      plan: offlinePlan('qcow2', path.relative(path.join(data, 'imports'), input.path), { name: 'i17c-boot' }),
    })
    expect(created.status).toBe(201)
    const { page } = b
    await page.goto(consoleUrl(srv.base, `#/migrations/${created.body.id}`))
    await page.locator('[data-testid=job][data-state=Failed]').waitFor({ timeout: 90_000 })
    expect(await page.getByTestId('error').textContent()).toContain('E_MIG_GUEST_BOOT_FAILED')
    expect(await page.getByTestId('domain').textContent()).toBe('i17c-boot')
    const serial = page.getByTestId('serial-log')
    await serial.waitFor()
    expect(await serial.textContent()).toContain('I17-SERIAL-TAIL-4242')
    await b.screenshot('failed-boot-serial')
  }, 120_000)
})
