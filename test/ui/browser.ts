/**
 * The web console tests' browser: Debian's Chromium (`/usr/bin/chromium`, installed by
 * `.ci/install`) driven by playwright-core, headless, without sandbox, GPU, QUIC or background
 * networking, in a fresh profile directory removed on close. Screenshots go to
 * `test/ui/screenshots/` (gitignored).
 */
import { chmodSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { chromium, type BrowserContext, type Locator, type Page } from 'playwright-core'
import { cleanupDomains, ensureLibvirt, type Stoppable } from '../helpers/libvirt.ts'
import { lateBound, type ServerSuite, serverSuite } from '../helpers/server-suite.ts'
import type { RunningServer } from '../helpers/server.ts'
import { sessionCookies } from '../helpers/test-auth.ts'

/** Where the tests' screenshots are written. */
export const SCREENSHOTS = path.join(import.meta.dir, 'screenshots')

/** An open browser with one page; `close()` ends Chromium and removes its profile. */
export interface Browser {
  context: BrowserContext
  page: Page
  /** Console errors and uncaught page errors seen so far (a test can assert there were none). */
  errors: string[]
  screenshot(name: string): Promise<string>
  close(): Promise<void>
}

/**
 * Launches Chromium; `httpCredentials` answers the migrator's Basic guard. Before each
 * `page.goto`, the browser gets a console session cookie for every test server started so far
 * (test/helpers/test-auth.ts), as the printed login link would set it.
 */
export async function openBrowser(opts: { httpCredentials?: { username: string; password: string } } = {}): Promise<Browser> {
  const profile = mkdtempSync(path.join(tmpdir(), 'i17-chromium-'))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.MIGRATOR_CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    viewport: { width: 1280, height: 900 },
    httpCredentials: opts.httpCredentials,
  })
  const page = context.pages()[0] ?? (await context.newPage())
  const goto = page.goto.bind(page)
  page.goto = async (url, options) => {
    const cookies = sessionCookies()
    if (cookies.length) await context.addCookies(cookies)
    return goto(url, options)
  }
  const errors: string[] = []
  page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`))
  page.on('console', (m) => m.type() === 'error' && errors.push(`console: ${m.text()}`))
  return {
    context,
    page,
    errors,
    async screenshot(name) {
      mkdirSync(SCREENSHOTS, { recursive: true })
      const file = path.join(SCREENSHOTS, `${name}.png`)
      await page.screenshot({ path: file, fullPage: true })
      return file
    },
    async close() {
      await context.close().catch(() => {})
      rmSync(profile, { recursive: true, force: true })
    },
  }
}

/**
 * A console suite on the enclosing `describe` (test/helpers/server-suite.ts): its temporary dir
 * made traversable, no domain named `prefix*` left, the server (environment `env`, data dir
 * `<dir>/data`) and then Chromium (`opts.browser`: openBrowser's options) opened before the file's
 * own `beforeAll`; at the end the browser closed, the server and `opts.also()` stopped, the
 * domains and the dir removed. `b` forwards to the browser (see lateBound).
 */
export function consoleSuite(
  prefix: string,
  tmpPrefix: string,
  env: Record<string, string>,
  opts: { runtime?: 'bun' | 'node'; browser?: Parameters<typeof openBrowser>[0]; also?: () => Array<Stoppable | undefined>; timeoutMs?: number } = {},
): ServerSuite & { b: Browser } {
  const browser = lateBound<Browser>(`the ${prefix} console suite's browser`)
  const suite = serverSuite({
    prefix,
    tmpPrefix,
    runtime: opts.runtime,
    traversable: true,
    dataSubdir: 'data',
    env,
    ready: async () => {
      browser.set(await openBrowser(opts.browser))
    },
    stop: (srv) => [browser.current, srv, ...(opts.also?.() ?? [])],
    timeoutMs: opts.timeoutMs ?? 120_000,
  })
  return { ...suite, b: browser.handle }
}

/** The console's URL for a server whose API base is `base`. */
export function consoleUrl(base: string, hash = '#/'): string {
  return `${base}/ui/${hash}`
}

/**
 * Before a console suite: the test's temporary dir made traversable (qemu reaches the file-sink
 * volumes under it), libvirt up, no domain left from an earlier run. `prefix` names the suite's
 * domains; each file has its own, none the start of another's, since files run in parallel.
 */
export async function prepareHost(dir: string, prefix: string): Promise<void> {
  chmodSync(dir, 0o755)
  await ensureLibvirt()
  await cleanupDomains(prefix)
}

/** After a console suite: closes the browser, stops the server, removes the suite's domains (`prefix`) and temporary dir. */
export async function teardown(b: Browser | undefined, srv: RunningServer | undefined, t: { cleanup(): void }, prefix: string): Promise<void> {
  await b?.close()
  await srv?.stop()
  await cleanupDomains(prefix)
  t.cleanup()
}

/**
 * In the plan form inside `scope` (the page, or the card holding the form): names the domain,
 * turns the start off (a boot is not the point), submits, waits for the job page. Returns the job id.
 */
export async function submitPlan(page: Page, scope: Page | Locator, name: string): Promise<string> {
  await scope.locator('input[name=name]').fill(name)
  await scope.locator('input[name=start]').uncheck()
  await scope.getByTestId('submit-plan').click()
  await page.waitForURL(/#\/migrations\/[0-9a-f-]{36}$/)
  return page.url().split('/').pop()!
}
