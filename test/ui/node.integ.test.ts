/**
 * Smoke test of the console on the Node server (`npm run start:node`'s build) with the Basic
 * guard on: the page is refused without credentials, and with them it loads, its SSE stream is
 * live, it lists a host file and follows a job submitted from the page to Completed.
 */
import { describe, expect, test } from 'bun:test'
import { mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput, makeRawImage } from '../helpers/inputs.ts'
import { consoleSuite, consoleUrl, submitPlan } from './browser.ts'

const MiB = 1024 * 1024
const USER = 'operator'
const PASSWORD = 'i17n-pw!'

describe('web console on the Node server (Basic guard on)', () => {
  const { t, srv, b } = consoleSuite(
    'i17n-',
    'i17n-ui-node-',
    { MIGRATOR_BASIC_AUTH: `${USER}:${PASSWORD}`, MIGRATOR_DOMAIN_TYPE: 'qemu' },
    { runtime: 'node', browser: { httpCredentials: { username: USER, password: PASSWORD } }, timeoutMs: 180_000 },
  )
  const data = path.join(t.dir, 'data')

  test('401 without credentials; with them the console lists, inspects, submits and follows a job', async () => {
    expect((await fetch(consoleUrl(srv.base))).status).toBe(401)
    const dir = path.join(data, 'imports', 'i17n-node')
    mkdirSync(dir, { recursive: true })
    buildInput('ova_archive', dir, 'i17n-node', [makeRawImage(path.join(t.dir, 'node.raw'), 4 * MiB, 5)])
    const { page } = b
    await page.goto(consoleUrl(srv.base, '#/new'))
    await page.locator('[data-connection=live]').waitFor({ timeout: 15_000 })
    await page.locator('[data-file="i17n-node"] a').click()
    await page.locator('[data-file="i17n-node/i17n-node.ova"] button').click()
    await page.getByTestId('manifest').waitFor()
    await submitPlan(page, page, 'i17n-node')
    await page.locator('[data-testid=job][data-state=Completed]').waitFor({ timeout: 60_000 })
    expect(await page.getByTestId('domain').textContent()).toBe('i17n-node')
    expect(b.errors).toEqual([])
  }, 120_000)
})
