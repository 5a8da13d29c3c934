/**
 * Jobs refused before the copy (lib/host/precopy.ts, called by the worker before any
 * destination volume exists), and workers running on the configuration object the app was
 * created with (not on the environment). In-process apps (`createApp(config)`) with real
 * workers; inputs are real OVAs; the small destination is a real 48 MiB tmpfs mounted as the
 * data dir's volumes/.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, readdirSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { checkPlanBridges } from '../../lib/jobs/submit.ts'
import { parseSubmitBody } from '../../lib/plan.ts'
import { createApp, type App } from '../../runtime/app.ts'
import type { Config } from '../../runtime/config.ts'
import { testConfig, req } from '../helpers/env.ts'
import { buildInput, makeRawImage } from '../helpers/inputs.ts'
import { ensureLibvirt } from '../helpers/libvirt.ts'
import { tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const t = tempDir('i13-preflight-')
const importRoot = path.join(t.dir, 'imports')
const mounts: string[] = []
const apps: App[] = []

async function appOn(config: Config): Promise<App> {
  const app = await createApp(config, { supervisor: { pollMs: 200 } })
  apps.push(app)
  return app
}

async function submitAndWait(app: App, plan: Record<string, unknown>): Promise<any> {
  const res = await app.fetch(req('POST', '/migrations', { plan }))
  const job = await res.json()
  if (res.status !== 201) throw new Error(`submit: ${res.status} ${JSON.stringify(job)}`)
  for (let i = 0; i < 600; i++) {
    const j = await (await app.fetch(req('GET', `/migrations/${job.id}`))).json()
    if (['completed', 'failed', 'cancelled'].includes(j.status)) return j
    await Bun.sleep(100)
  }
  throw new Error('the job did not end in 60 s')
}

const plan = { source: { Offline: 'ova_archive' }, source_ref: { kind: 'offline_host_path', path: 'i13-pf.ova' }, mode: 'Cold', name: 'i13-pf' }

beforeAll(async () => {
  await ensureLibvirt()
  chmodSync(t.dir, 0o755)
  mkdirSync(importRoot, { mode: 0o750 })
  // A 64 MiB disk with little data, as an OVA with one NIC on "VM Network".
  buildInput('ova_archive', importRoot, 'i13-pf', [makeRawImage(path.join(t.dir, 'disk.raw'), 64 * MiB)])
})

afterAll(async () => {
  for (const a of apps) await a.close()
  for (const m of mounts.reverse()) execFileSync('umount', [m])
  t.cleanup()
})

describe('checks before the copy', () => {
  test('a destination without room for the disks refuses the job before any volume exists', async () => {
    // The data dir's volumes/ is a 48 MiB file system; the disk's capacity is 64 MiB.
    const small = path.join(t.dir, 'small')
    mkdirSync(path.join(small, 'volumes'), { recursive: true })
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=48m,mode=0711', 'tmpfs', path.join(small, 'volumes')])
    mounts.push(path.join(small, 'volumes'))
    const app = await appOn({ ...testConfig(small), importRoot })
    const job = await submitAndWait(app, plan)
    expect(job.state).toBe('Failed')
    expect(job.last_error.code).toBe('E_MIG_DISK_WRITE_FAILED')
    // Paths in messages are relative to the data dir (no absolute server paths).
    expect(job.last_error.message).toContain('not enough space for the disks under <data dir>/volumes')
    expect(job.last_error.message).toContain('0.06 GiB needed')
    expect(job.last_error.message).toContain('set MIGRATOR_DATA_DIR to a larger one')
    expect(existsSync(path.join(small, 'volumes', 'migrations', job.id))).toBe(false)
    expect(job.progress.bytes_done).toBe(0)
  }, 90_000)

  test('a data dir under a 0700 parent: refused up front, naming the directory and the fix', async () => {
    const parent = path.join(t.dir, 'home')
    mkdirSync(parent, { mode: 0o700 })
    chmodSync(parent, 0o700)
    const dataDir = path.join(parent, 'var')
    const app = await appOn({ ...testConfig(dataDir), importRoot })
    const job = await submitAndWait(app, plan)
    expect(job.state).toBe('Failed')
    expect(job.last_error.code).toBe('E_MIG_DOMAIN_DEFINE_FAILED')
    expect(job.last_error.message).toContain(`cannot search ${parent},`)
    expect(job.last_error.message).toContain(`chmod o+x ${parent}`)
    expect(existsSync(path.join(dataDir, 'volumes', 'migrations', job.id))).toBe(false)
    // The doctor says the same at start-up and on GET /doctor.
    const report = await (await app.fetch(req('GET', '/doctor'))).json()
    expect(report.checks.find((c: any) => c.id === 'qemu-access:volumes')).toMatchObject({
      status: 'fail',
      fix: expect.stringContaining(`chmod o+x ${parent}`),
    })
  }, 150_000)

  test('a data dir that is itself 0700 (mktemp -d) is made reachable: search bits only', async () => {
    const own = path.join(t.dir, 'own')
    mkdirSync(own, { mode: 0o700 })
    chmodSync(own, 0o700)
    await appOn({ ...testConfig(own), importRoot })
    expect(statSync(own).mode & 0o777).toBe(0o711)
  })

  test('a missing bridge: refused at submission (plan.networks), and before the copy (MIGRATOR_DEFAULT_BRIDGE)', async () => {
    const withNet = parseSubmitBody({ plan: { ...plan, networks: [{ source: 'VM Network', bridge: 'i13-nobr0' }] } })
    expect(() => checkPlanBridges(withNet)).toThrow('plan.networks.0.bridge: no bridge i13-nobr0 on this host')
    expect(() => checkPlanBridges(parseSubmitBody({ plan: { ...plan, networks: [{ source: 'VM Network', bridge: 'lo' }] } }))).not.toThrow()
  })
})

describe('workers run on the configuration object of createApp, not on the environment', () => {
  test('another data dir and another default bridge than the environment', async () => {
    const mine = path.join(t.dir, 'mine')
    const envDir = path.join(t.dir, 'env-data')
    mkdirSync(envDir)
    const saved = { dir: process.env.MIGRATOR_DATA_DIR, bridge: process.env.MIGRATOR_DEFAULT_BRIDGE }
    // The environment names another data dir and no bridge; only the config object has i13-nobr1.
    process.env.MIGRATOR_DATA_DIR = envDir
    delete process.env.MIGRATOR_DEFAULT_BRIDGE
    try {
      const cfg = testConfig(mine)
      const app = await appOn({ ...cfg, importRoot, domain: { ...cfg.domain, defaultBridge: 'i13-nobr1' } })
      const job = await submitAndWait(app, plan)
      // The worker found the job in the config's store and checked the config's bridge.
      expect(job.last_error).toMatchObject({ code: 'E_MIG_DOMAIN_DEFINE_FAILED', message: expect.stringContaining('i13-nobr1 (MIGRATOR_DEFAULT_BRIDGE)') })
      expect(readdirSync(envDir)).toEqual([])
    } finally {
      if (saved.dir === undefined) delete process.env.MIGRATOR_DATA_DIR
      else process.env.MIGRATOR_DATA_DIR = saved.dir
      if (saved.bridge !== undefined) process.env.MIGRATOR_DEFAULT_BRIDGE = saved.bridge
    }
  }, 90_000)
})
