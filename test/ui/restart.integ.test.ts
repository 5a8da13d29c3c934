/**
 * The console survives a server restart: a job page follows a throttled copy, the server stops
 * (its worker with it), the header shows the lost connection, a new server starts on the same
 * address and data directory and resumes the job from its watermark, and the page, never
 * reloaded, reconnects (its EventSource resumes with Last-Event-ID), catches up, and follows the
 * job to Completed; a job submitted after the restart shows in the list.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { mkdirSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput } from '../helpers/inputs.ts'
import { call, offlinePlan, submit, waitJob } from '../helpers/jobs.ts'
import { freePort, startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'
import { consoleUrl, openBrowser, prepareHost, teardown, type Browser } from './browser.ts'

const MiB = 1024 * 1024

describe('web console across a server restart', () => {
  const t = tempDir('i17s-ui-restart-')
  const data = path.join(t.dir, 'data')
  let env: Record<string, string>
  let srv: RunningServer
  let b: Browser

  beforeAll(async () => {
    await prepareHost(t.dir, 'i17s-')
    // a short lease (8 s, eight worker heartbeats of margin on a loaded machine): the restarted
    // server resumes the job soon after the first one stopped
    env = {
      MIGRATOR_LISTEN: `127.0.0.1:${await freePort()}`,
      MIGRATOR_LEASE_SECONDS: '8',
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(2 * MiB),
      MIGRATOR_FLUSH_EVERY_BYTES: String(4 * MiB),
      MIGRATOR_DOMAIN_TYPE: 'qemu',
    }
    srv = await startServer('bun', data, env)
    b = await openBrowser()
  }, 120_000)

  afterAll(() => teardown(b, srv, t, 'i17s-'))

  test('connection loss is shown, the page reconnects with Last-Event-ID and follows the resumed job to Completed', async () => {
    const root = path.join(data, 'imports')
    mkdirSync(root, { recursive: true })
    const raw = path.join(t.dir, 'restart.raw')
    writeFileSync(raw, randomBytes(16 * MiB))
    const input = buildInput('qcow2', root, 'i17s-restart', [raw])
    const job = await submit(srv.base, offlinePlan('qcow2', path.relative(root, input.path), { name: 'i17s-restart', start: false }))
    const { page } = b
    const streams: Array<{ url: string; lastEventId: string | undefined }> = []
    page.on('request', async (r) => {
      if (r.url().includes('/migrations/stream')) streams.push({ url: r.url(), lastEventId: (await r.allHeaders())['last-event-id'] })
    })
    await page.goto(consoleUrl(srv.base, `#/migrations/${job.id}`))
    await page.locator('[data-connection=live]').waitFor()
    await page.waitForFunction(() => Number(document.querySelector('[data-testid=job-bar]')?.getAttribute('aria-valuenow')) > 0, undefined, { timeout: 30_000 })
    const before = Number(await page.getByTestId('job-bar').getAttribute('aria-valuenow'))

    expect(await srv.stop()).toBe(0)
    await page.locator('[data-connection=lost]').waitFor({ timeout: 15_000 })
    expect(await page.getByTestId('connection').textContent()).toContain('connection lost')
    await b.screenshot('connection-lost')
    const requestsWhileDown = streams.length

    srv = await startServer('bun', data, env)
    await page.locator('[data-connection=live]').waitFor({ timeout: 30_000 })
    // the reconnection asked for what it missed: Last-Event-ID (header) or last_event_id (a new EventSource)
    const again = streams.slice(requestsWhileDown - 1)
    expect(again.some((s) => Number(s.lastEventId ?? new URL(s.url).searchParams.get('last_event_id')) > 0)).toBe(true)
    // the server side first (resumed from the watermark), then what the page shows of it
    const done = await waitJob(srv.base, job.id)
    if (done.state !== 'Completed') console.error('job after restart:', JSON.stringify(done.last_error), srv.stderr().slice(-3000), srv.stdout().slice(-4000))
    expect([done.state, done.progress.bytes_done]).toEqual(['Completed', 16 * MiB])
    await page.locator('[data-testid=job][data-state=Completed]').waitFor({ timeout: 15_000 })
    expect(Number(await page.getByTestId('job-bar').getAttribute('aria-valuenow'))).toBe(100)
    expect(before).toBeLessThan(100)

    // the list (same page, no reload) has the job Completed and shows a job submitted now
    await page.evaluate(() => (location.hash = '#/'))
    await page.locator(`[data-job="${job.id}"][data-state=Completed]`).waitFor()
    const second = await submit(srv.base, offlinePlan('qcow2', path.relative(root, input.path), { name: 'i17s-restart-2', start: false }))
    await page.locator(`[data-job="${second.id}"]`).waitFor({ timeout: 10_000 })
    await call(srv.base, 'POST', `/migrations/${second.id}/cancel`)
    await waitJob(srv.base, second.id)
  }, 240_000)
})
