/**
 * The console's Sources page with a KVM host: this machine's libvirtd reached as a remote host
 * over a real sshd the test starts (test/helpers/sshd.ts), and the real server (Bun). The form
 * registers a `libvirt_remote` source with a private key and the host's pinned key line (the key
 * goes only to the API, never back), tests it, lists and inspects a domain (`lvui-src`, the
 * boot-sector test disk on qcow2) and starts a cold migration of it, which completes bit-exact.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import * as path from 'node:path'
import { call, volumePath } from '../helpers/jobs.ts'
import { defineSource, makeQcow2, rawOf, removeTestDomains } from '../helpers/libvirt-source.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { startSshd, type RunningSshd } from '../helpers/sshd.ts'
import { tempDir } from '../helpers/tmp.ts'
import { consoleUrl, openBrowser, prepareHost, submitPlan, teardown, type Browser } from './browser.ts'

const PREFIX = 'lvui-'
const MiB = 1024 * 1024

describe('web console: a KVM host (libvirt_remote over SSH)', () => {
  const t = tempDir('mig-lvui-')
  let sshd: RunningSshd
  let srv: RunningServer
  let b: Browser

  beforeAll(async () => {
    await prepareHost(t.dir, PREFIX)
    removeTestDomains(PREFIX)
    sshd = await startSshd(path.join(t.dir, 'sshd'))
    srv = await startServer('bun', path.join(t.dir, 'data'), { MIGRATOR_DOMAIN_TYPE: 'qemu' })
    b = await openBrowser()
  }, 180_000)

  afterAll(async () => {
    removeTestDomains(PREFIX)
    await teardown(b, srv, t, PREFIX)
    await sshd?.stop()
  }, 60_000)

  test('register with a key and a pinned host key, test, list, inspect, migrate cold: completed bit-exact', async () => {
    const q = makeQcow2(path.join(t.dir, 'src.qcow2'), 'MIGRATOR-LVUI-BOOT', 8 * MiB)
    const uuid = defineSource(`${PREFIX}src`, [{ file: q, format: 'qcow2' }], '52:54:00:4c:55:01')
    const { page } = b
    await page.goto(consoleUrl(srv.base, '#/sources'))
    const form = page.getByTestId('add-source')
    await form.locator('select[name=kind]').selectOption('libvirt_remote')
    // the vSphere fields give way to the SSH ones
    expect(await form.locator('input[name=password]').count()).toBe(0)
    await form.locator('input[name=name]').fill('kvm1')
    await form.locator('input[name=endpoint]').fill(`qemu+ssh://root@127.0.0.1:${sshd.port}/system`)
    await form.locator('input[name=username]').fill('root')
    await form.locator('textarea[name=private_key]').fill(sshd.privateKey)
    await form.locator('textarea[name=known_hosts]').fill(sshd.knownHosts)
    await form.locator('button[type=submit]').click()
    const card = page.getByTestId('source-kvm1')
    await card.waitFor()
    expect(await card.textContent()).toContain('host key pinned')
    // the API has the source with its pinned key line, never the private key
    const sources = (await call(srv.base, 'GET', '/sources')).body.items
    expect(sources.map((s: any) => [s.name, s.kind, s.known_hosts])).toEqual([['kvm1', 'libvirt_remote', sshd.knownHosts]])
    expect(JSON.stringify(sources)).not.toContain('PRIVATE KEY')
    await card.getByRole('button', { name: 'Test' }).click()
    expect(await card.getByTestId('source-test').textContent()).toMatch(/Connected: libvirt /)
    await card.getByTestId('list-vms').click()
    await card.locator(`[data-vm=${PREFIX}src]`).waitFor()
    await card.getByTestId(`inspect-vm-${PREFIX}src`).click()
    await card.getByTestId('manifest').waitFor()
    expect(await card.getByTestId('manifest').textContent()).toContain('libvirt_remote')
    expect(await card.getByTestId('nics').textContent()).toContain('52:54:00:4c:55:01')
    await card.locator('input[name=mode][value=Cold]').check()
    const id = await submitPlan(page, card, `${PREFIX}dst`)
    await page.locator('[data-testid=job][data-state=Completed]').waitFor({ timeout: 150_000 })
    await b.screenshot('libvirt-source-cold')
    const job = (await call(srv.base, 'GET', `/migrations/${id}`)).body
    expect([job.plan.source.Live, job.plan.source_ref.vm_id, job.effective_mode, job.status, job.last_error]).toEqual([
      'libvirt_remote',
      uuid,
      'Cold',
      'completed',
      null,
    ])
    expect(readFileSync(volumePath(path.join(t.dir, 'data'), id, 'vda')).equals(rawOf(q, t.dir))).toBe(true)
    expect(b.errors).toEqual([])
  }, 240_000)
})
