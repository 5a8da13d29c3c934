/**
 * The front door from a fresh checkout: the repository is cloned (`git clone` of this
 * checkout's HEAD commit) into a fresh 0700 directory, as into root's home, and the demo's main
 * job runs from there on the defaults a root user gets: no `MIGRATOR_DATA_DIR`, so the data goes
 * to `/var/lib/<appliance>/` (here a unique appliance name, `i13-ci-<random>`, so nothing collides
 * with a real install), which qemu can reach whatever the checkout's directory. The installed
 * `node_modules` is reused by a symlink (the clone's `.ci/install` would otherwise reinstall).
 * Checks the boot the demo reports: exit 0, the job `Completed` (the server's boot check passed),
 * the domain running. Removes the domain (and its NVRAM), the data dir and the clone.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { execFileSync, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, mkdtempSync, rmSync, statSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { freePort } from '../helpers/server.ts'
import { REPO } from '../helpers/tmp.ts'

const tag = randomBytes(3).toString('hex')
const appliance = `i13-ci-${tag}`
const vmName = `i13-demo-${tag}`
const home = mkdtempSync(path.join(tmpdir(), 'i13-home-'))
const dataDir = `/var/lib/${appliance}`

afterAll(async () => {
  await cleanupDomains('i13-demo-')
  rmSync(dataDir, { recursive: true, force: true })
  // the server's socket directory (its default, /run/<appliance>)
  rmSync(`/run/${appliance}`, { recursive: true, force: true })
  rmSync(home, { recursive: true, force: true })
})

describe('a clone in a 0700 directory runs the main job to a booted guest', () => {
  test('git clone + the demo on the root defaults', async () => {
    expect(statSync(home).mode & 0o777).toBe(0o700)
    const head = execFileSync('git', ['-C', REPO, 'rev-parse', 'HEAD'], { encoding: 'utf8' }).trim()
    const clone = path.join(home, 'vm-migrator')
    execFileSync('git', ['clone', '--quiet', '--no-checkout', REPO, clone])
    execFileSync('git', ['-C', clone, 'checkout', '--quiet', '--detach', head])
    symlinkSync(path.join(REPO, 'node_modules'), path.join(clone, 'node_modules'))
    await ensureLibvirt()

    const env: Record<string, string> = {
      ...(process.env as Record<string, string>),
      MIGRATOR_APPLIANCE: appliance,
      MIGRATOR_LISTEN: `127.0.0.1:${await freePort()}`,
      MIGRATOR_DEMO_NAME: vmName,
    }
    for (const k of ['MIGRATOR_DATA_DIR', 'MIGRATOR_IMPORT_ROOT', 'MIGRATOR_BASE_PATH']) delete env[k]
    const child = spawn(path.join(clone, 'node_modules/.bin/bun'), ['demo/main-job.ts'], { cwd: clone, env, stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    child.stdout.on('data', (d) => (out += d))
    child.stderr.on('data', (d) => (out += d))
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve))
    if (code !== 0) console.error(out.slice(-4000))
    expect(code).toBe(0)
    expect(out).toContain(`migrator: data in ${dataDir}`)
    expect(out).toMatch(/state: Completed/)
    // The guest the demo reports is running on this host, its disks under /var/lib/<appliance>.
    const domain = execFileSync('virsh', ['-c', 'qemu:///system', 'list', '--name'], { encoding: 'utf8' })
      .split('\n')
      .map((s) => s.trim())
      .find((n) => n.startsWith(vmName))
    expect(domain).toBeDefined()
    expect(execFileSync('virsh', ['-c', 'qemu:///system', 'domstate', domain!], { encoding: 'utf8' }).trim()).toBe('running')
    expect(execFileSync('virsh', ['-c', 'qemu:///system', 'domblklist', domain!], { encoding: 'utf8' })).toContain(`${dataDir}/volumes/migrations/`)
    expect(existsSync(path.join(clone, 'var'))).toBe(false)
  }, 1_200_000)
})
