/**
 * The console's new-migration page with a URL (docs/remote-sources.md) in a real browser
 * (Debian's Chromium through playwright-core) against the real server (Bun), its workers and a
 * real nginx on 127.0.0.1 (test/helpers/nginx.ts): type an http URL, pick a registered credential,
 * inspect, see the manifest, submit; the job reads the OVA from nginx and completes bit-exact,
 * its plan's source_ref an `offline_url`. The page never receives the credential's secret.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput, fileSha256, makeRawImage, rawSha256 } from '../helpers/inputs.ts'
import { call, volumePath } from '../helpers/jobs.ts'
import { NGINX_USER, startNginx, type RunningNginx } from '../helpers/nginx.ts'
import { consoleSuite, consoleUrl, submitPlan } from './browser.ts'

const MiB = 1024 * 1024

describe('web console: a new migration from a URL (Bun server, nginx, Chromium)', () => {
  let web: RunningNginx
  const { t, srv, b } = consoleSuite('i17r-', 'i17r-url-', { MIGRATOR_DOMAIN_TYPE: 'qemu' }, { also: () => [web] })
  const www = path.join(t.dir, 'www')
  const data = path.join(t.dir, 'data')
  let ova = ''
  const bodies: string[] = []

  beforeAll(async () => {
    mkdirSync(www)
    ova = buildInput('ova_archive', www, 'i17r-url', [makeRawImage(path.join(t.dir, 'u.raw'), 8 * MiB, 5)]).path
    web = await startNginx(www, path.join(t.dir, 'nginx'))
    // every credentials answer the page received; one discarded by a reload has no body to read
    b.page.on('response', (r) => {
      if (r.url().includes('/remote-credentials'))
        void r.text().then(
          (x) => bodies.push(x),
          () => undefined,
        )
    })
  }, 120_000)

  test('type a URL, pick a credential, inspect, submit: the job reads the OVA from nginx and completes bit-exact', async () => {
    const cred = await call(srv.base, 'POST', '/remote-credentials', { name: 'web', kind: 'http_basic', ...NGINX_USER })
    const url = `${web.base}/private/${path.basename(ova)}`
    const { page } = b
    await page.goto(consoleUrl(srv.base, '#/new'))
    await page.reload()
    await page.getByTestId('remote-url-input').fill(url)
    await page.locator('[data-testid=remote-credential] option', { hasText: 'web (http_basic)' }).waitFor({ state: 'attached' })
    await page.getByTestId('remote-credential').selectOption(cred.body.id)
    await page.getByTestId('remote-inspect').click()
    await page.getByTestId('manifest').waitFor()
    expect(await page.getByTestId('disks').textContent()).toContain('8.0 MiB')
    const id = await submitPlan(page, page, 'i17r-url')
    await page.locator('[data-testid=job][data-state=Completed]').waitFor({ timeout: 60_000 })
    const job = (await call(srv.base, 'GET', `/migrations/${id}`)).body
    expect([job.state, job.plan.source, job.plan.source_ref]).toEqual([
      'Completed',
      { Offline: 'ova_archive' },
      { kind: 'offline_url', url, credential_id: cred.body.id },
    ])
    const x = path.join(t.dir, 'x')
    mkdirSync(x)
    execFileSync('tar', ['-xf', ova, '-C', x])
    expect(fileSha256(volumePath(data, id, job.progress.disks[0].label))).toBe(rawSha256(path.join(x, 'i17r-url-disk1.vmdk'), 'vmdk', t.dir))
    // the page listed the credential by name; no secret ever reached it
    expect(bodies.length).toBeGreaterThan(0)
    for (const body of bodies) expect(body).not.toContain(NGINX_USER.password)
  }, 120_000)
})
