/**
 * The Ansible collection `migrator.kvm` (ansible/) with Debian's ansible-core against two real
 * migrator servers on 127.0.0.1, driven by the example playbook ansible/examples/waves.yml:
 * a two-host wave of real qcow2 imports (`start: false`: the domains are defined, not booted),
 * one host's failing job not stopping the other host, an idempotent second run (no second job,
 * `changed=0`), check mode changing nothing, the source password never in the output (`no_log`,
 * loop labels), and `ansible-doc` printing every module's documentation. Domains of this file
 * are named `a63-*` and removed at the end.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync, spawn } from 'node:child_process'
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, symlinkSync, writeFileSync, writeSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import * as path from 'node:path'
import { call } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { REPO, tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const SECRET = 'Vault-Secret-a63-Qm4t'
const HOSTS = ['a63-kvm-a', 'a63-kvm-b'] as const

/** An 8 MiB disk with 1 MiB of random data, as qcow2 under `importRoot/name/`; its path relative to the root. */
function smallDisk(importRoot: string, name: string): string {
  const dir = path.join(importRoot, name)
  mkdirSync(dir, { recursive: true })
  const raw = path.join(dir, `${name}.raw`)
  const fd = openSync(raw, 'w')
  writeSync(fd, randomBytes(MiB), 0, undefined, 2 * MiB)
  closeSync(fd)
  execFileSync('truncate', ['-s', String(8 * MiB), raw])
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, path.join(dir, `${name}.qcow2`)])
  return `${name}/${name}.qcow2`
}

/** A cold offline plan of the inventory. */
function plan(kind: string, rel: string): Record<string, unknown> {
  return { source: { Offline: kind }, source_ref: { kind: 'offline_host_path', path: rel }, mode: 'Cold', start: false }
}

interface Run {
  code: number | null
  out: string
  /** Per host, the PLAY RECAP counters. */
  recap: Record<string, Record<string, number>>
}

describe('Ansible collection migrator.kvm over two migrator servers', () => {
  const t = tempDir('mig-ansible-a63-')
  const servers: RunningServer[] = []
  const env: Record<string, string> = {}

  /** Runs `cmd args` with the collection on ANSIBLE_COLLECTIONS_PATH (at most 5 min). */
  function ansible(cmd: string, args: string[]): Promise<Run> {
    return new Promise((resolve) => {
      const child = spawn(cmd, args, { cwd: t.dir, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
      let out = ''
      child.stdout.on('data', (d) => (out += d))
      child.stderr.on('data', (d) => (out += d))
      const timer = setTimeout(() => child.kill('SIGKILL'), 300_000)
      child.on('close', (code) => {
        clearTimeout(timer)
        const recap: Run['recap'] = {}
        for (const m of out.matchAll(/^(\S+)\s+:\s+(ok=.*)$/gm)) {
          recap[m[1]!] = Object.fromEntries([...m[2]!.matchAll(/(\w+)=(\d+)/g)].map((x) => [x[1]!, Number(x[2])]))
        }
        resolve({ code, out, recap })
      })
    })
  }

  let runs = 0
  const playbook = async (extra: string[]) => {
    const r = await ansible('ansible-playbook', ['-v', '-i', path.join(t.dir, 'inventory.yml'), path.join(REPO, 'ansible/examples/waves.yml'), ...extra])
    // the whole output beside the inventory, for whoever stops the test to read it
    writeFileSync(path.join(t.dir, `ansible-run${++runs}.log`), r.out)
    return r
  }

  const jobsOf = async (i: number) => (await call(servers[i]!.base, 'GET', '/migrations')).body.items as any[]

  beforeAll(async () => {
    await ensureLibvirt()
    // qemu (libvirt-qemu) must reach the volumes under the data dirs to define the domains
    chmodSync(t.dir, 0o711)
    const collections = path.join(t.dir, 'collections', 'ansible_collections', 'migrator')
    mkdirSync(collections, { recursive: true })
    symlinkSync(path.join(REPO, 'ansible'), path.join(collections, 'kvm'))
    Object.assign(env, {
      ANSIBLE_COLLECTIONS_PATH: path.join(t.dir, 'collections'),
      ANSIBLE_HOME: path.join(t.dir, 'ansible-home'),
      ANSIBLE_LOCAL_TEMP: path.join(t.dir, 'ansible-tmp'),
      ANSIBLE_RETRY_FILES_ENABLED: '0',
      ANSIBLE_NOCOLOR: '1',
      ANSIBLE_PYTHON_INTERPRETER: '/usr/bin/python3',
      HOME: t.dir,
    })
    const hostVars: Record<string, unknown> = {}
    for (const [i, host] of HOSTS.entries()) {
      const data = path.join(t.dir, host)
      const imports = path.join(data, 'imports')
      mkdirSync(imports, { recursive: true })
      const side = host.slice(-1)
      const vms: unknown[] = [
        { name: `a63-${side}-web`, wave: 1, plan: plan('qcow2', smallDisk(imports, `a63-${side}-web`)) },
        { name: `a63-${side}-later`, wave: 2, plan: plan('qcow2', smallDisk(imports, `a63-${side}-later`)) },
      ]
      if (side === 'a') vms.push({ name: 'a63-a-db', wave: 1, plan: plan('qcow2', smallDisk(imports, 'a63-a-db')) })
      else {
        // not a tar archive: the job fails with E_MIG_MALFORMED_ARCHIVE
        mkdirSync(path.join(imports, 'bad'))
        writeFileSync(path.join(imports, 'bad', 'bad.ova'), 'x')
        vms.push({ name: 'a63-b-bad', wave: 1, plan: plan('ova_archive', 'bad/bad.ova') })
      }
      servers[i] = await startServer('bun', data, { MIGRATOR_LIBVIRT_URI: 'qemu:///system' })
      hostVars[host] = {
        migrator_url: servers[i]!.base,
        migrator_token: servers[i]!.token,
        vms,
      }
    }
    // JSON is YAML: the inventory as waves.yml expects it (docs: ansible/examples/inventory.yml)
    const inventory = {
      all: {
        children: {
          kvm_hosts: {
            vars: {
              ansible_connection: 'local',
              doctor_fail_on: 'never',
              wave_wait_timeout: 120,
              migrator_sources: [{ name: 'a63-vc', kind: 'vim_api', endpoint: 'https://127.0.0.1:1/sdk', username: 'u', password: SECRET }],
            },
            hosts: hostVars,
          },
        },
      },
    }
    writeFileSync(path.join(t.dir, 'inventory.yml'), JSON.stringify(inventory, null, 2))
  }, 120_000)

  afterAll(async () => {
    for (const s of servers) await s?.stop()
    await cleanupDomains('a63-')
    t.cleanup()
  })

  test('a two-host wave: every import runs, the failing host does not stop the other, the report names all, no secret printed', async () => {
    const report = path.join(t.dir, 'wave-1.txt')
    const r = await playbook(['-e', 'wave=1', '-e', `report_file=${report}`])
    // 2: a host failed (the one with the bad archive)
    expect({ code: r.code, a: r.recap[HOSTS[0]]?.failed, b: r.recap[HOSTS[1]]?.failed }).toEqual({ code: 2, a: 0, b: 1 })
    expect(r.recap[HOSTS[0]]!.changed).toBeGreaterThanOrEqual(3)
    const a = await jobsOf(0)
    const b = await jobsOf(1)
    expect(a.map((j) => [j.plan.name, j.state]).sort()).toEqual([
      ['a63-a-db', 'Completed'],
      ['a63-a-web', 'Completed'],
    ])
    expect(b.map((j) => [j.plan.name, j.state, j.last_error?.code ?? null]).sort()).toEqual([
      ['a63-b-bad', 'Failed', 'E_MIG_MALFORMED_ARCHIVE'],
      ['a63-b-web', 'Completed', null],
    ])
    const lines = readFileSync(report, 'utf8').trim().split('\n')
    expect(lines.map((l) => l.split(' ').slice(0, 4).join(' '))).toEqual([
      'a63-kvm-a a63-a-web Completed -',
      'a63-kvm-a a63-a-db Completed -',
      'a63-kvm-b a63-b-web Completed -',
      'a63-kvm-b a63-b-bad Failed E_MIG_MALFORMED_ARCHIVE:',
    ])
    expect(r.out).toContain('E_MIG_MALFORMED_ARCHIVE')
    for (const i of [0, 1]) expect((await call(servers[i]!.base, 'GET', '/sources')).body.items.map((s: any) => s.name)).toEqual(['a63-vc'])
    expect(r.out).not.toContain(SECRET)
  }, 300_000)

  test('a second run is idempotent: no second job, no second source, changed=0', async () => {
    const before = [(await jobsOf(0)).length, (await jobsOf(1)).length]
    // the same report file: the report is the same, so writing it changes nothing either
    const r = await playbook(['-e', 'wave=1', '-e', `report_file=${path.join(t.dir, 'wave-1.txt')}`])
    expect({ code: r.code, a: r.recap[HOSTS[0]], b: r.recap[HOSTS[1]]?.changed }).toEqual({
      code: 2,
      a: expect.objectContaining({ changed: 0, failed: 0 }),
      b: 0,
    })
    expect([(await jobsOf(0)).length, (await jobsOf(1)).length]).toEqual(before)
    expect(before).toEqual([2, 2])
    expect(r.out).not.toContain(SECRET)
  }, 300_000)

  test('check mode reports the changes of wave 2 and changes nothing', async () => {
    const report = path.join(t.dir, 'wave-2.txt')
    const r = await playbook(['--check', '-e', 'wave=2', '-e', `report_file=${report}`])
    expect({ code: r.code, a: r.recap[HOSTS[0]]?.failed, b: r.recap[HOSTS[1]]?.failed }).toEqual({ code: 0, a: 0, b: 0 })
    expect(r.recap[HOSTS[0]]!.changed).toBeGreaterThanOrEqual(1)
    expect(r.out).toMatch(/changed: \[a63-kvm-a\] => \(item=a63-a-later\)/)
    expect([(await jobsOf(0)).length, (await jobsOf(1)).length]).toEqual([2, 2])
    expect(existsSync(report)).toBe(false)
    expect(r.out).not.toContain(SECRET)
  }, 300_000)

  test('bulk plans, state absent and a remote credential through ad-hoc module calls', async () => {
    const base = servers[0]!.base
    const module = (name: string, args: Record<string, unknown>, check = false) =>
      ansible('ansible', [
        'localhost',
        '-v',
        '-i',
        'localhost,',
        '-c',
        'local',
        ...(check ? ['--check'] : []),
        '-m',
        `migrator.kvm.${name}`,
        '-a',
        JSON.stringify({ url: base, token: servers[0]!.token, ...args }),
      ])
    const imports = path.join(t.dir, HOSTS[0], 'imports')
    const bulk = { vms: [{ key: 'one', plan: plan('qcow2', smallDisk(imports, 'a63-a-bulk')) }] }
    const first = await module('migration', { name: 'a63-bulk', bulk: true, plan: bulk, wait: 'Completed', wait_timeout: 120 })
    expect(first.code).toBe(0)
    expect(first.out).toMatch(/localhost \| CHANGED/)
    expect(first.out).toContain('"state": "Completed"')
    const again = await module('migration', { name: 'a63-bulk', bulk: true, plan: bulk })
    expect([again.code, /localhost \| SUCCESS/.test(again.out)]).toEqual([0, true])
    const plans = (await call(base, 'GET', '/plans')).body.items
    expect(plans.map((p: any) => [p.name, p.state])).toEqual([['a63-bulk', 'Completed']])
    const one = await module('migration', { name: 'a63-a-one', plan: plan('qcow2', smallDisk(imports, 'a63-a-one')), wait: 'Completed', wait_timeout: 120 })
    expect([one.code, /localhost \| CHANGED/.test(one.out)]).toEqual([0, true])
    // an ended job: absent has nothing to cancel
    expect((await module('migration', { name: 'a63-a-one', state: 'absent' })).out).toMatch(/localhost \| SUCCESS/)
    const info = await module('migration_info', { name: 'a63-a-one' })
    expect(info.out).toContain('"state": "Completed"')
    const missing = await module('migration', { name: 'a63-none', wait: 'Completed' })
    expect([missing.code, missing.out]).toEqual([2, expect.stringContaining('no job is named a63-none')])
    const cred = { name: 'a63-web', type: 'remote_credential', kind: 'http_bearer', bearer_token: SECRET }
    expect((await module('source', cred, true)).out).toMatch(/localhost \| CHANGED/)
    expect((await call(base, 'GET', '/remote-credentials')).body.items).toEqual([])
    const made = await module('source', cred)
    expect(made.out).toMatch(/localhost \| CHANGED/)
    expect(made.out).not.toContain(SECRET)
    expect((await module('source', cred)).out).toMatch(/localhost \| SUCCESS/)
    expect((await call(base, 'GET', '/remote-credentials')).body.items.map((c: any) => c.name)).toEqual(['a63-web'])
    expect((await module('source', { name: 'a63-web', type: 'remote_credential', state: 'absent' })).out).toMatch(/localhost \| CHANGED/)
    expect((await module('source', { name: 'a63-web', type: 'remote_credential', state: 'absent' })).out).toMatch(/localhost \| SUCCESS/)
    expect((await call(base, 'GET', '/remote-credentials')).body.items).toEqual([])
    // an API error fails the task with its E_MIG_* code
    const bad = await module('migration', { name: 'a63-invalid', plan: { mode: 'Cold' } })
    expect([bad.code, bad.out]).toEqual([2, expect.stringContaining('"code": "E_MIG_INVALID_PLAN"')])
  }, 300_000)

  test('ansible-doc prints the documentation of every module', async () => {
    const doc = await ansible('ansible-doc', ['migrator.kvm.migration'])
    expect(doc.code).toBe(0)
    expect(doc.out).toContain('MIGRATOR.KVM.MIGRATION')
    for (const word of ['wait_timeout', 'test_boot', 'cutover', 'bulk', 'E_MIG_', 'EXAMPLES', 'RETURN VALUES']) expect(doc.out).toContain(word)
    for (const m of ['source', 'migration_info', 'doctor']) {
      const d = await ansible('ansible-doc', [`migrator.kvm.${m}`])
      expect({ m, code: d.code, title: d.out.includes(`MIGRATOR.KVM.${m.toUpperCase()}`) }).toEqual({ m, code: 0, title: true })
    }
  }, 120_000)
})
