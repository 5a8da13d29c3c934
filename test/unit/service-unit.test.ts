/**
 * The systemd unit that scripts/install-service.sh installs: rendered with this checkout's path,
 * it passes `systemd-analyze verify` (syntax, and ExecStart names an executable), and its
 * directives are the ones docs/operations.md relies on. systemd-analyze comes with the systemd
 * package, which libvirt-daemon-system (.ci/install) depends on.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'

const REPO = path.resolve(import.meta.dir, '../..')
const dir = mkdtempSync(path.join(tmpdir(), 'mig-unit-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

describe('scripts/install-service.sh', () => {
  const printed = spawnSync('bash', [path.join(REPO, 'scripts/install-service.sh'), '--print'], { encoding: 'utf8' })
  const unit = printed.stdout

  test('--print renders the unit with the checkout path and no placeholder left', () => {
    expect(printed.status).toBe(0)
    expect(unit).not.toContain('@CHECKOUT@')
    expect(unit).toContain(`ExecStart=${REPO}/node_modules/.bin/bun runtime/serve-bun.ts`)
    expect(unit).toContain(`WorkingDirectory=${REPO}`)
    expect(unit).toMatch(/^KillMode=mixed$/m)
    expect(unit).toMatch(/^EnvironmentFile=-\/etc\/default\/migrator$/m)
  })

  test('systemd-analyze verify accepts the unit without a warning', () => {
    const file = path.join(dir, 'migrator.service')
    writeFileSync(file, unit)
    const r = spawnSync('systemd-analyze', ['verify', file], { encoding: 'utf8' })
    expect({ status: r.status, stderr: r.stderr.trim() }).toEqual({ status: 0, stderr: '' })
  })
})
