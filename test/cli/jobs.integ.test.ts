/**
 * The `migrator` CLI, the real binary (`cli/migrator`, spawned as a child process from
 * a clean environment whose PATH has no `node_modules/.bin`), against the real server (Bun) on
 * real libvirt + qemu (TCG): `import` of a local OVA outside the import root (upload with
 * progress and SHA-256, inspect, submit, follow to Completed; also on a pty, with progress bars),
 * `import` of a host path in the import root with `--json`, `plan submit` + `watch` with its exit
 * codes (0 Completed, 1 Failed, 2 Cancelled), `cancel` of a running job, and `jobs --json`.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, existsSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeBootDisk, makePowerOffBootDisk } from '../helpers/bootdisk.ts'
import { MIGRATOR_BIN, ndjson, runCli, startCli, type CliOptions } from '../helpers/cli.ts'
import { buildInput, fileSha256, makeRawImage } from '../helpers/inputs.ts'
import { call, offlinePlan, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, tearDownJobs } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'migcli-'
const MARKER = 'MIGRATOR-CLI-BOOT-5093'
const MiB = 1024 * 1024
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

describe('migrator CLI: import, watch, cancel against a real server and libvirt', () => {
  const t = tempDir('mig-cli-jobs-')
  const importRoot = path.join(t.dir, 'data', 'imports')
  const outside = path.join(t.dir, 'outside')
  let srv: RunningServer
  let cli: (args: string[], opts?: CliOptions) => ReturnType<typeof runCli>
  let rootOva = ''
  let slowRel = ''
  let powerOffRel = ''
  const ids: string[] = []

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    mkdirSync(outside)
    const boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 16 * MiB).path
    // Random data at a few offsets: the OVA is about 2 MiB, so the upload shows intermediate progress.
    const data = makeRawImage(path.join(t.dir, 'data.raw'), 24 * MiB, 11)
    buildInput('ova_archive', outside, 'cli-local', [boot, data])
    rootOva = buildInput('ova_archive', importRoot, 'cli-root', [boot]).path
    // Boots but never prints the pattern: stays in Starting for MIGRATOR_BOOT_TIMEOUT_SECONDS.
    const quiet = makeBootDisk(path.join(t.dir, 'quiet.raw'), 'SOMETHING-ELSE', 16 * MiB).path
    slowRel = path.relative(importRoot, buildInput('qcow2', importRoot, 'cli-slow', [quiet]).path)
    const off = makePowerOffBootDisk(path.join(t.dir, 'off.raw'), 'POWERING-OFF', 16 * MiB).path
    powerOffRel = path.relative(importRoot, buildInput('qcow2', importRoot, 'cli-off', [off]).path)
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', path.join(t.dir, 'data'), {
      MIGRATOR_DOMAIN_TYPE: 'qemu',
      MIGRATOR_BOOT_GRACE_SECONDS: '1',
      MIGRATOR_BOOT_TIMEOUT_SECONDS: '60',
      MIGRATOR_BOOT_SERIAL_PATTERN: MARKER,
    })
    cli = (args, opts = {}) => runCli(args, { ...opts, env: { MIGRATOR_URL: srv.base, ...opts.env } })
  }, 60_000)

  afterAll(() => tearDownJobs(PREFIX, t, srv))

  test('import <local OVA outside the import root>: upload with progress and sha256, inspect, submit, follow to Completed', async () => {
    // Run as npm installs it (a symlink in a bin directory), from the OVA's directory, with a relative path.
    const binDir = path.join(t.dir, 'bin')
    mkdirSync(binDir)
    symlinkSync(MIGRATOR_BIN, path.join(binDir, 'migrator'))
    const ova = path.join(outside, 'cli-local.ova')
    const r = await cli(['import', 'cli-local.ova', '--name', `${PREFIX}local`], { cwd: outside, bin: path.join(binDir, 'migrator'), timeoutMs: 90_000 })
    expect(r.stderr).toBe('')
    expect(r.code).toBe(0)
    const lines = r.stdout.split('\n')
    // Upload progress: intermediate steps, then 100 %, then the upload with the sha256 of the file.
    const progress = lines.filter((l) => /^upload: .+ of .+ \(\d+%\)/.test(l)).map((l) => Number(/\((\d+)%\)/.exec(l)![1]))
    expect(progress.length).toBeGreaterThanOrEqual(2)
    expect(progress.some((p) => p > 0 && p < 100)).toBe(true)
    expect(progress.at(-1)).toBe(100)
    const sha = fileSha256(ova)
    const uploaded = lines.find((l) => l.startsWith('uploaded cli-local.ova as '))!
    expect(uploaded).toContain(`sha256 ${sha}`)
    const uploadId = / as ([0-9a-f-]{36}) /.exec(uploaded)![1]!
    const inspected = lines.indexOf('ova_archive: cli-local, 2 vCPU, 512.0 MiB, bios, guest linux')
    expect(inspected).toBeGreaterThan(lines.indexOf(uploaded))
    expect(lines.slice(inspected + 1, inspected + 3)).toEqual(['  disk Hard disk 1: 16.0 MiB vmdk', '  disk Hard disk 2: 24.0 MiB vmdk'])
    const id = /^migration ([0-9a-f-]{36}) submitted$/m.exec(r.stdout)![1]!
    ids.push(id)
    const states = lines.filter((l) => l.startsWith('state: ')).map((l) => l.slice(7))
    expect(states.at(-1)).toBe('Completed')
    expect(states).toContain('Starting')
    for (let i = 1; i < states.length; i++)
      expect(['Queued', 'CopyingFull', 'Starting', 'Completed'].indexOf(states[i]!)).toBeGreaterThan(
        ['Queued', 'CopyingFull', 'Starting', 'Completed'].indexOf(states[i - 1]!),
      )
    expect(lines).toContain(`migration ${id} Completed`)

    const job = (await call(srv.base, 'GET', `/migrations/${id}`)).body
    expect(job.state).toBe('Completed')
    expect(job.plan.source_ref).toEqual({ kind: 'upload', upload_id: uploadId })
    expect(job.plan.name).toBe(`${PREFIX}local`)
    expect(job.progress.disks).toHaveLength(2)
    const upload = (await call(srv.base, 'GET', `/uploads/${uploadId}`)).body
    expect(upload).toMatchObject({ filename: 'cli-local.ova', sha256: sha })
  }, 100_000)

  test('import on a terminal (a pty from script(1)): an upload progress bar, then the live migration bar', async () => {
    const ova = path.join(outside, 'cli-local.ova')
    const q = (a: string) => `'${a.replace(/'/g, `'\\''`)}'`
    const command = [MIGRATOR_BIN, 'import', ova, '--name', `${PREFIX}tty`].map(q).join(' ')
    const tty = await runCli(['-qfec', command, '/dev/null'], { bin: '/usr/bin/script', timeoutMs: 90_000, env: { MIGRATOR_URL: srv.base, TERM: 'xterm' } })
    expect(tty.code).toBe(0)
    const text = tty.stdout.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '')
    expect(text).toMatch(/upload \|[█░]+\| 100% 2\.0 MiB\/2\.0 MiB/)
    expect(text).toContain('uploaded cli-local.ova as ')
    // The migration bar ends full, labelled with the final state; the state lines are printed too.
    expect(text).toMatch(/Completed \|█+\| 100% 40\.0 MiB\/40\.0 MiB/)
    expect(text).toMatch(/state: Starting\r?\n[\s\S]*state: Completed\r?\n/)
    const id = /migration ([0-9a-f-]{36}) submitted/.exec(text)![1]!
    ids.push(id)
    expect(text).toContain(`migration ${id} Completed`)
    expect((await call(srv.base, 'GET', `/migrations/${id}`)).body.state).toBe('Completed')
  }, 100_000)

  test('import <host path in the import root> --json: inspected in place, no upload, NDJSON to Completed', async () => {
    const uploadsBefore = (await call(srv.base, 'GET', '/uploads')).body.items.length
    const r = await cli(['--json', 'import', rootOva, '--name', `${PREFIX}root`], { timeoutMs: 90_000 })
    expect(r.stderr).toBe('')
    expect(r.code).toBe(0)
    const events = ndjson(r.stdout)
    expect(events[0]).toMatchObject({ event: 'inspected', detected_kind: 'ova_archive', manifest: { name: 'cli-root' } })
    expect(events.some((e) => e.event === 'uploaded')).toBe(false)
    const submitted = events.find((e) => e.event === 'submitted')
    expect(submitted.id).toMatch(UUID)
    ids.push(submitted.id)
    expect(events.filter((e) => e.event === 'state').map((e) => e.state)).toContain('Completed')
    expect(events.at(-1)).toEqual({ event: 'end', id: submitted.id, state: 'Completed', last_error: null })
    const job = (await call(srv.base, 'GET', `/migrations/${submitted.id}`)).body
    expect(job.state).toBe('Completed')
    expect(job.plan.source_ref).toEqual({ kind: 'offline_host_path', path: rootOva })
    expect((await call(srv.base, 'GET', '/uploads')).body.items.length).toBe(uploadsBefore)
  }, 100_000)

  test('plan submit + watch <id>: live states until Completed, exit 0', async () => {
    const planFile = path.join(t.dir, 'plan-watch.json')
    writeFileSync(planFile, JSON.stringify({ plan: offlinePlan('ova_archive', path.relative(importRoot, rootOva), { name: `${PREFIX}watch` }) }))
    const s = await cli(['plan', 'submit', planFile])
    expect(s.code).toBe(0)
    const job = JSON.parse(s.stdout)
    expect(job).toMatchObject({ state: 'Queued', plan: { name: `${PREFIX}watch` } })
    ids.push(job.id)
    const w = await cli(['watch', job.id], { timeoutMs: 90_000 })
    expect(w.stderr).toBe('')
    expect(w.code).toBe(0)
    const states = w.stdout.split('\n').filter((l) => l.startsWith('state: '))
    expect(states.at(-1)).toBe('state: Completed')
    expect(w.stdout.trimEnd().split('\n').at(-1)).toBe(`migration ${job.id} Completed`)
    // Watching a job that already ended answers at once with the same exit code.
    const again = await cli(['watch', job.id])
    expect(again.code).toBe(0)
    expect(again.stdout).toBe(`state: Completed\nmigration ${job.id} Completed\n`)
  }, 100_000)

  test('watch of a job that fails: the E_MIG_* code is printed, exit 1', async () => {
    const planFile = path.join(t.dir, 'plan-off.json')
    writeFileSync(planFile, JSON.stringify(offlinePlan('qcow2', powerOffRel, { name: `${PREFIX}off` })))
    const job = JSON.parse((await cli(['plan', 'submit', planFile])).stdout)
    ids.push(job.id)
    const w = await cli(['watch', job.id], { timeoutMs: 90_000 })
    expect(w.code).toBe(1)
    expect(w.stdout).toContain('state: Failed')
    expect(w.stdout).toMatch(/^E_MIG_GUEST_BOOT_FAILED: /m)
    expect(w.stdout.trimEnd().split('\n').at(-1)).toBe(`migration ${job.id} Failed`)
    expect((await call(srv.base, 'GET', `/migrations/${job.id}`)).body.last_error.code).toBe('E_MIG_GUEST_BOOT_FAILED')
  }, 100_000)

  test('cancel <id> of a running job: it ends Cancelled, its volumes are removed, watch exits 2', async () => {
    const planFile = path.join(t.dir, 'plan-slow.json')
    writeFileSync(planFile, JSON.stringify({ plan: offlinePlan('qcow2', slowRel, { name: `${PREFIX}slow` }) }))
    const job = JSON.parse((await cli(['plan', 'submit', planFile])).stdout)
    ids.push(job.id)
    const watcher = startCli(['--json', 'watch', job.id], { env: { MIGRATOR_URL: srv.base }, timeoutMs: 90_000 })
    try {
      // The boot check waits for a serial pattern the guest never prints: the job sits in Starting.
      await waitJob(srv.base, job.id, (j) => j.state === 'Starting', 60_000)
      expect(existsSync(path.join(t.dir, 'data', 'volumes', 'migrations', job.id))).toBe(true)
      const c = await cli(['cancel', job.id])
      expect(c.stderr).toBe('')
      expect(c.code).toBe(0)
      expect(JSON.parse(c.stdout)).toMatchObject({ id: job.id })
      const w = await watcher.result
      expect(w.code).toBe(2)
      const events = ndjson(w.stdout)
      expect(events.filter((e) => e.event === 'state').map((e) => e.state)).toContain('Starting')
      expect(events.at(-1)).toMatchObject({ event: 'end', id: job.id, state: 'Cancelled', last_error: { code: 'E_MIG_CANCELLED' } })
    } finally {
      watcher.kill()
    }
    const ended = (await call(srv.base, 'GET', `/migrations/${job.id}`)).body
    expect(ended.state).toBe('Cancelled')
    expect(existsSync(path.join(t.dir, 'data', 'volumes', 'migrations', job.id))).toBe(false)
    // Cancelling it again: the job has ended (409 E_MIG_CONFLICT), exit 1.
    const again = await cli(['cancel', job.id])
    expect(again.code).toBe(1)
    expect(again.stderr).toMatch(/^E_MIG_CONFLICT: /)
  }, 100_000)

  test('jobs and jobs --json list every migration, newest first', async () => {
    const r = await cli(['--json', 'jobs'])
    expect(r.code).toBe(0)
    const items = JSON.parse(r.stdout)
    expect(items.map((j: any) => j.id)).toEqual([...ids].reverse())
    expect(items.map((j: any) => j.state)).toEqual(['Cancelled', 'Failed', 'Completed', 'Completed', 'Completed', 'Completed'])
    const table = await cli(['jobs'])
    expect(table.code).toBe(0)
    const rows = table.stdout.trimEnd().split('\n')
    expect(rows[0]).toMatch(/^ID\s+STATE\s+DONE\s+TOTAL\s+ERROR\s+CREATED$/)
    expect(rows).toHaveLength(ids.length + 1)
    expect(rows[2]).toMatch(new RegExp(`^${ids.at(-2)}\\s+Failed\\s+16\\.0 MiB\\s+16\\.0 MiB\\s+E_MIG_GUEST_BOOT_FAILED\\s+`))
  }, 30_000)
})
