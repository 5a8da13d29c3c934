/**
 * `migrator doctor` (the real launcher, clean environment) against a real server, and
 * `--url http://host:port` without a path reaching the API. The server is configured with a
 * default bridge that does not exist, so one check fails for sure: the start-up log names it,
 * `GET /doctor` and the CLI report it with its fix, and the CLI exits 1. `--local` runs the same
 * checks without a server; on a fit configuration it exits 0. libvirt is asked through its
 * `test:///default` driver (a real libvirt connection that answers at once; the shared
 * qemu:///system is exercised by test/host/doctor.integ.test.ts).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync } from 'node:fs'
import * as path from 'node:path'
import { apiBaseUrl } from '../../cli/commands/common.ts'
import { runCli } from '../helpers/cli.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

describe('migrator doctor and --url', () => {
  const t = tempDir('i13-cli-doctor-')
  const env = { MIGRATOR_LIBVIRT_URI: 'test:///default', MIGRATOR_DOMAIN_TYPE: 'qemu' }
  let srv: RunningServer
  let hostPort = ''

  beforeAll(async () => {
    chmodSync(t.dir, 0o711)
    srv = await startServer('bun', path.join(t.dir, 'data'), { ...env, MIGRATOR_DEFAULT_BRIDGE: 'i13-nobr9' })
    hostPort = new URL(srv.base).origin
  }, 60_000)

  afterAll(async () => {
    await srv?.stop()
    t.cleanup()
  })

  test('--url with no path gets the API base path; with a path it is used as given', () => {
    expect(apiBaseUrl('http://10.0.0.5:8080')).toBe('http://10.0.0.5:8080/api/v1/migrator')
    expect(apiBaseUrl('http://10.0.0.5:8080/')).toBe('http://10.0.0.5:8080/api/v1/migrator')
    expect(apiBaseUrl('https://host/hostd/api/v1/migrator/')).toBe('https://host/hostd/api/v1/migrator')
    expect(() => apiBaseUrl('10.0.0.5:8080')).toThrow('not a URL')
  })

  test('the server logs the failing check at start-up, with its fix', async () => {
    const deadline = Date.now() + 60_000
    while (!srv.stdout().includes('pre-flight check default-bridge failed') && Date.now() < deadline) await Bun.sleep(200)
    const lines = srv
      .stdout()
      .split('\n')
      .filter((l) => l.includes('pre-flight check default-bridge failed'))
    expect(lines.length).toBe(1)
    expect(JSON.parse(lines[0])).toMatchObject({ level: 50, check: 'default-bridge', fix: expect.stringContaining('ip link add i13-nobr9 type bridge') })
  }, 70_000)

  test('migrator --url http://host:port doctor: the report, the fix, exit 1 on a failing check', async () => {
    const r = await runCli(['--url', hostPort, 'doctor'], { env: {} })
    expect(r.code).toBe(1)
    expect(r.stdout).toMatch(/^FAIL {2}default-bridge +MIGRATOR_DEFAULT_BRIDGE=i13-nobr9: no such interface$/m)
    expect(r.stdout).toMatch(/^OK {4}libvirt +test:\/\/\/default: libvirt /m)
    expect(r.stdout).toContain('  default-bridge: create the bridge (ip link add i13-nobr9 type bridge)')
    const json = await runCli(['--url', `${hostPort}/`, '--json', 'doctor'], { env: {} })
    expect(json.code).toBe(1)
    const report = JSON.parse(json.stdout)
    expect(report.status).toBe('fail')
    for (const c of report.checks) {
      expect(['ok', 'warn', 'fail']).toContain(c.status)
      expect(typeof c.found).toBe('string')
      if (c.status !== 'ok') expect(c.fix).toBeTruthy()
    }
    // GET /doctor is the same report.
    expect((await (await fetch(`${srv.base}/doctor`)).json()).checks.map((c: any) => c.id)).toEqual(report.checks.map((c: any) => c.id))
  }, 60_000)

  test('migrator doctor --local: no server needed; exit 0 when nothing fails', async () => {
    const r = await runCli(['doctor', '--local'], { env: { ...env, MIGRATOR_DATA_DIR: path.join(t.dir, 'data') } })
    expect(r.stderr).toBe('')
    expect(r.stdout).not.toMatch(/^FAIL/m)
    expect(r.code).toBe(0)
    const bad = await runCli(['doctor', '--local'], { env: { ...env, MIGRATOR_DATA_DIR: path.join(t.dir, 'data'), MIGRATOR_DEFAULT_BRIDGE: 'i13-nobr9' } })
    expect(bad.code).toBe(1)
  }, 60_000)
})
