/**
 * A hostile page in a real browser (Debian's Chromium through playwright-core) against the real
 * server (Bun): the operator has the console open (Basic credentials given to the browser), then
 * visits a page served by a second local HTTP server (127.0.0.1, another port: same site, other
 * origin). That page tries what a cross-site page can do without CORS — `no-cors` fetches with
 * text/plain, FormData and no body, with credentials; text/plain, urlencoded and multipart form
 * POSTs; a CORS DELETE — against the routes that create a source, cancel the running and the
 * queued job, test a source (an outbound connection), delete an upload and start a bulk plan, and
 * frames the console. Nothing changes on the server (the API's listing before and after), the
 * server connects nowhere, its log shows the requests arrived and were refused, and the frame
 * shows no console. The console itself keeps working under its CSP (no violation) and cannot be
 * framed even by its own origin.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import * as path from 'node:path'
import type { Frame } from 'playwright-core'
import { consoleDir } from '../../lib/ui/assets.ts'
import { offlinePlan } from '../helpers/jobs.ts'
import { tempDir } from '../helpers/tmp.ts'
import { sourceBody, startVictim, VICTIM_AUTH, VICTIM_PREFIX, type Victim } from '../helpers/victim.ts'
import { consoleUrl, openBrowser, type Browser } from './browser.ts'

/** The attacker's page: every attempt runs on load; `window.done` holds what the page saw. */
function attackPage(v: Victim): string {
  const b = v.base
  const source = JSON.stringify(sourceBody(`${VICTIM_PREFIX}evil-fetch`, 1))
  const bulk = JSON.stringify({ vms: [{ key: 'e', plan: offlinePlan('qcow2', 'big/big.qcow2', { name: `${VICTIM_PREFIX}evil-bulk`, start: false }) }] })
  // text/plain form trick: name + "=" + value is a JSON object
  const formName = JSON.stringify({ ...sourceBody(`${VICTIM_PREFIX}evil-form`, 1), pad: '' }).slice(0, -2)
  return `<!doctype html><html><body>
<iframe name="console-frame" src="${b}/ui/" width="800" height="400"></iframe>
<iframe name="sink1"></iframe><iframe name="sink2"></iframe><iframe name="sink3"></iframe><iframe name="sink4"></iframe>
<form id="f-plain" method="POST" enctype="text/plain" action="${b}/sources" target="sink1"><input name='${formName}' value='"}'></form>
<form id="f-url" method="POST" action="${b}/migrations/${v.ids.queued}/cancel" target="sink2"><input name="x" value="1"></form>
<form id="f-multi" method="POST" enctype="multipart/form-data" action="${b}/uploads" target="sink3"><input type="file" name="file" id="file"></form>
<form id="f-multi-src" method="POST" enctype="multipart/form-data" action="${b}/sources" target="sink4"><input name="name" value="${VICTIM_PREFIX}evil-multi"><input name="kind" value="vim_api"></form>
<script>
window.done = null
const results = []
const attempt = async (what, fn) => { try { const r = await fn(); results.push(what + ': ' + r.type + ' ' + r.status) } catch (e) { results.push(what + ': ' + e.name) } }
const opts = (method, body, type) => ({ method, mode: 'no-cors', credentials: 'include', body, headers: type ? { 'content-type': type } : {} })
;(async () => {
  await attempt('source text/plain', () => fetch('${b}/sources', opts('POST', ${JSON.stringify(source)}, 'text/plain')))
  await attempt('source blob', () => fetch('${b}/sources', opts('POST', new Blob([${JSON.stringify(source)}]))))
  await attempt('cancel running', () => fetch('${b}/migrations/${v.ids.running}/cancel', opts('POST')))
  await attempt('cancel queued', () => fetch('${b}/migrations/${v.ids.queued}/cancel', opts('POST', '{}', 'text/plain')))
  await attempt('test source', () => fetch('${b}/sources/${v.ids.source}/test', opts('POST')))
  await attempt('bulk plan', () => fetch('${b}/plans', opts('POST', ${JSON.stringify(bulk)}, 'text/plain')))
  const fd = new FormData(); fd.append('file', new Blob(['x'.repeat(100)]), 'evil.img')
  await attempt('upload FormData', () => fetch('${b}/uploads', opts('POST', fd)))
  await attempt('delete upload no-cors', () => fetch('${b}/uploads/${v.ids.upload}', opts('DELETE')))
  await attempt('delete upload cors', () => fetch('${b}/uploads/${v.ids.upload}', { method: 'DELETE', mode: 'cors', credentials: 'include' }))
  await attempt('delete source cors json', () => fetch('${b}/sources/${v.ids.source}', { method: 'DELETE', mode: 'cors', credentials: 'include', headers: { 'content-type': 'application/json' } }))
  const dt = new DataTransfer(); dt.items.add(new File(['y'.repeat(100)], 'evil2.img')); document.getElementById('file').files = dt.files
  for (const id of ['f-plain', 'f-url', 'f-multi', 'f-multi-src']) document.getElementById(id).submit()
  window.done = results
})()
</script></body></html>`
}

/** The frame named `name` of the page, once its navigation settled. */
async function frameNamed(b: Browser, name: string): Promise<Frame> {
  for (let i = 0; i < 100; i++) {
    const f = b.page.frames().find((x) => x.name() === name)
    if (f) return f
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`no frame ${name}`)
}

describe('a cross-site page against the migrator (Chromium, Bun server, Basic auth on)', () => {
  let v: Victim
  let b: Browser
  let attacker: Server
  let attackerUrl = ''
  const consoleMessages: string[] = []
  const t = tempDir('i46-page-')
  const [user, pass] = VICTIM_AUTH.split(':') as [string, string]

  beforeAll(async () => {
    v = await startVictim('bun')
    attacker = createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(attackPage(v)))
    await new Promise<void>((r) => attacker.listen(0, '127.0.0.1', r))
    attackerUrl = `http://127.0.0.1:${(attacker.address() as { port: number }).port}/`
    b = await openBrowser({ httpCredentials: { username: user, password: pass } })
    b.page.on('console', (m) => consoleMessages.push(m.text()))
    // every CSP violation of a page is recorded (the init script runs outside the page's CSP)
    await b.context.addInitScript(() => {
      ;(window as any).__csp = []
      document.addEventListener('securitypolicyviolation', (e) => (window as any).__csp.push(`${e.violatedDirective} ${e.blockedURI}`))
    })
  }, 180_000)
  afterAll(async () => {
    await b?.close()
    await new Promise((r) => attacker?.close(r))
    await v?.close()
    t.cleanup()
  }, 60_000)

  test('the console build has no inline script, event handler or style attribute for the CSP to refuse', () => {
    const html = readFileSync(path.join(consoleDir(), 'index.html'), 'utf8')
    const scripts = [...html.matchAll(/<script\b[^>]*>([\s\S]*?)<\/script>/gi)]
    expect(scripts.length).toBeGreaterThan(0)
    for (const s of scripts) {
      expect(s[0]).toMatch(/\ssrc=/)
      expect(s[1]!.trim()).toBe('')
    }
    expect(html).not.toMatch(/\son[a-z]+\s*=/i)
    expect(html).not.toMatch(/\sstyle\s*=/i)
  })

  test('the console works under its CSP: pages, the live stream and the host-file browser raise no violation', async () => {
    await b.page.goto(consoleUrl(v.base))
    await b.page.getByText(`${VICTIM_PREFIX}bun-run`).first().waitFor({ timeout: 30_000 })
    await b.page.goto(consoleUrl(v.base, '#/new'))
    await b.page.getByText('big/').first().click()
    await b.page.getByText('..').first().click()
    // an upload from the page: SHA-256 in the browser (hash-wasm: WebAssembly), then XMLHttpRequest
    const uploadsBefore = ((await v.call('GET', '/uploads')).body as { items: unknown[] }).items.length
    // a real (small) qcow2, so the inspect that follows the upload answers with its manifest
    const image = path.join(t.dir, 'page.qcow2')
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', image, '1M'])
    await b.page.getByTestId('upload-input').setInputFiles(image)
    await b.page.getByText('sha256 ').first().waitFor({ timeout: 30_000 })
    await b.page.getByText('Uploaded').first().waitFor({ timeout: 30_000 })
    expect(((await v.call('GET', '/uploads')).body as { items: unknown[] }).items.length).toBe(uploadsBefore + 1)
    await b.page.getByTestId('manifest').waitFor({ timeout: 30_000 })
    await b.page.goto(consoleUrl(v.base, '#/sources'))
    await b.page.getByText(`${VICTIM_PREFIX}vc`).first().waitFor({ timeout: 30_000 })
    expect(await b.page.evaluate(() => (window as any).__csp)).toEqual([])
    expect(b.errors).toEqual([])
  }, 60_000)

  test('the console cannot be framed, not even by its own origin', async () => {
    await b.page.goto(consoleUrl(v.base))
    await b.page.evaluate(() => {
      const f = document.createElement('iframe')
      f.name = 'self-frame'
      f.src = location.href
      document.body.append(f)
    })
    const f = await frameNamed(b, 'self-frame')
    await new Promise((r) => setTimeout(r, 1500))
    expect(f.url()).not.toContain('/ui/')
    expect(await f.locator('#app').count()).toBe(0)
    expect(consoleMessages.some((m) => m.includes("frame-ancestors 'none'"))).toBe(true)
  }, 60_000)

  test('no-cors fetches, form posts and a frame from another local origin change nothing and connect nowhere', async () => {
    const before = await v.snapshot()
    const refusedBefore = (v.srv.stdout() + v.srv.stderr()).split('request refused').length
    consoleMessages.length = 0
    await b.page.goto(attackerUrl)
    await b.page.waitForFunction(() => (window as any).done !== null, undefined, { timeout: 30_000 })
    const seen = (await b.page.evaluate(() => (window as any).done)) as string[]
    // the page learnt nothing: opaque answers, or the browser refused (DELETE without CORS)
    expect(seen.length).toBe(10)
    for (const s of seen) expect(s).toMatch(/: (opaque 0|TypeError)$/)
    await new Promise((r) => setTimeout(r, 2500))
    // the frame of the console shows no console
    const frame = await frameNamed(b, 'console-frame')
    expect(frame.url()).not.toContain('/ui/')
    expect(await frame.locator('#app').count()).toBe(0)
    expect(await v.snapshot()).toBe(before)
    expect(v.outbound()).toBe(0)
    // the requests reached the server and were refused there: 7 no-cors POSTs, 2 CORS preflights, 4 forms, the frame
    const refused = (v.srv.stdout() + v.srv.stderr()).split('request refused').length - refusedBefore
    expect(refused).toBeGreaterThanOrEqual(12)
    // what the page tried would have worked from the operator's own console (the check can fail)
    const own = await v.call('POST', `/migrations/${v.ids.queued}/cancel`)
    expect(own.status).toBe(202)
    expect(await v.snapshot()).not.toBe(before)
  }, 90_000)
})
