/**
 * The `migrator` CLI, the real binary (`cli/migrator`) spawned from a clean environment,
 * for everything but running jobs: `migrator serve` itself (with `MIGRATOR_BASIC_AUTH`), the base
 * URL and Basic credentials from flags and from the environment (a clear 401 message and exit 1
 * without them), `sources add|list|test|vms` (an unreachable endpoint: exit 1 and
 * `E_MIG_SOURCE_UNREACHABLE`), `uploads list|rm`, `host-files ls`, `plan submit` of an invalid
 * plan, and `backup run|restore-points` against HostBackupApiTestDouble (test/helpers/backup-double.ts:
 * the host backup API over HTTPS with a self-signed certificate generated for the test, because
 * the real host daemon cannot run here). Every listing is also read back with `--json`.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { HostBackupApiTestDouble } from '../helpers/backup-double.ts'
import { ndjson, runCli, startCli, type CliOptions, type RunningCli } from '../helpers/cli.ts'
import { freePort } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const BACKUP_JOB = '0c9e7d3a-8b1f-4c2e-9d5a-00000000a001'
const BACKUP_FAILING = '0c9e7d3a-8b1f-4c2e-9d5a-00000000f002'

describe('migrator CLI: serve, credentials, sources, uploads, host files, backup', () => {
  const t = tempDir('mig-cli-admin-')
  const dataDir = path.join(t.dir, 'data')
  const importRoot = path.join(dataDir, 'imports')
  let server: RunningCli
  let base = ''
  let double: HostBackupApiTestDouble
  const auth = { MIGRATOR_USER: 'operator', MIGRATOR_PASSWORD: 'Op3rator!pw' }
  const authHeader = { authorization: 'Basic ' + Buffer.from('operator:Op3rator!pw').toString('base64') }
  /** The CLI with the server's URL and credentials in its environment. */
  const cli = (args: string[], opts: CliOptions = {}) => runCli(args, { ...opts, env: { MIGRATOR_URL: base, ...auth, ...opts.env } })

  beforeAll(async () => {
    mkdirSync(path.join(importRoot, 'exports', 'vm1'), { recursive: true })
    writeFileSync(path.join(importRoot, 'exports', 'vm1', 'disk.qcow2'), Buffer.alloc(3000, 1))
    writeFileSync(path.join(importRoot, 'exports', 'notes.txt'), 'hello\n')
    mkdirSync(path.join(t.dir, 'tls'))
    double = await HostBackupApiTestDouble.start({ dir: path.join(t.dir, 'tls'), user: 'hostadmin', password: 'B4ckup!pw', delayMs: 200 })
    double.setJob(BACKUP_JOB, 'ok')
    double.setJob(BACKUP_FAILING, 'fail')
    // `migrator serve`, run from an unrelated directory, configured by the environment only.
    const port = await freePort()
    base = `http://127.0.0.1:${port}/api/v1/migrator`
    server = startCli(['serve'], {
      cwd: t.dir,
      timeoutMs: 120_000,
      env: {
        MIGRATOR_DATA_DIR: dataDir,
        MIGRATOR_SOCKET: path.join(dataDir, 'api.sock'),
        MIGRATOR_LISTEN: `127.0.0.1:${port}`,
        MIGRATOR_BASIC_AUTH: 'operator:Op3rator!pw',
        MIGRATOR_LOG_LEVEL: 'warn',
      },
    })
    const deadline = Date.now() + 30_000
    for (;;) {
      if (server.child.exitCode !== null) throw new Error(`migrator serve exited ${server.child.exitCode}: ${server.stderr()}`)
      try {
        if ((await fetch(`${base}/migrations`, { headers: authHeader })).status === 200) break
      } catch {}
      if (Date.now() > deadline) throw new Error(`migrator serve not ready: ${server.stderr()}`)
      await new Promise((r) => setTimeout(r, 100))
    }
  }, 60_000)

  afterAll(async () => {
    if (server && server.child.exitCode === null) {
      server.child.kill('SIGTERM')
      const t0 = setTimeout(() => server.kill(), 10_000)
      await server.result
      clearTimeout(t0)
    }
    await double?.stop()
    t.cleanup()
  })

  test('serve: the server answers only with credentials (401 E_MIG_AUTH_FAILED without)', async () => {
    expect((await fetch(`${base}/migrations`)).status).toBe(401)
    expect((await fetch(`${base}/migrations`, { headers: authHeader })).status).toBe(200)
  })

  test('base URL and credentials: from the environment, from flags, missing, wrong, unreachable', async () => {
    const fromEnv = await cli(['jobs'])
    expect(fromEnv.stderr).toBe('')
    expect(fromEnv.code).toBe(0)
    expect(fromEnv.stdout.trim()).toMatch(/^ID\s+STATE\s+DONE\s+TOTAL\s+ERROR\s+CREATED$/)

    const fromFlags = await runCli(['--url', base, '--user', 'operator', '--password', 'Op3rator!pw', '--json', 'jobs'])
    expect(fromFlags.code).toBe(0)
    expect(JSON.parse(fromFlags.stdout)).toEqual([])

    // Flags win over the environment.
    const flagsOverEnv = await runCli(['--url', base, '--user', 'operator', '--password', 'Op3rator!pw', 'jobs'], {
      env: { MIGRATOR_URL: 'http://127.0.0.1:1/api/v1/migrator', MIGRATOR_USER: 'x', MIGRATOR_PASSWORD: 'y' },
    })
    expect(flagsOverEnv.code).toBe(0)

    const none = await runCli(['jobs'], { env: { MIGRATOR_URL: base } })
    expect(none.code).toBe(1)
    expect(none.stdout).toBe('')
    expect(none.stderr).toBe('E_MIG_AUTH_FAILED: authentication required (HTTP 401: give --user and --password, or MIGRATOR_USER and MIGRATOR_PASSWORD)\n')

    const wrong = await runCli(['--url', base, '--user', 'operator', '--password', 'nope', 'jobs'])
    expect(wrong.code).toBe(1)
    expect(wrong.stderr).toContain('E_MIG_AUTH_FAILED: authentication required')
    expect(wrong.stderr).toContain('the credentials of operator were rejected')

    const unreachable = await runCli(['--url', 'http://127.0.0.1:1/api/v1/migrator', 'jobs'])
    expect(unreachable.code).toBe(1)
    expect(unreachable.stderr).toStartWith('error: cannot reach the migrator at http://127.0.0.1:1/api/v1/migrator')
  }, 30_000)

  test('sources add|list|test|vms: registered (password never shown), listed; test and vms fail with E_MIG_SOURCE_UNREACHABLE', async () => {
    const add = await cli(['sources', 'add', 'vc-lab', 'vim_api', 'https://127.0.0.1:1/sdk', '--username', 'administrator@vsphere.local', '--insecure'], {
      env: { MIGRATOR_SOURCE_PASSWORD: 'S0urce!pw' },
    })
    expect(add.stderr).toBe('')
    expect(add.code).toBe(0)
    const source = JSON.parse(add.stdout)
    expect(source).toMatchObject({
      name: 'vc-lab',
      kind: 'vim_api',
      endpoint: 'https://127.0.0.1:1/sdk',
      username: 'administrator@vsphere.local',
      tls: { insecure: true },
    })
    expect(add.stdout).not.toContain('S0urce!pw')

    const dup = await cli(['sources', 'add', 'vc-lab', 'vim_api', 'https://127.0.0.1:1/sdk', '--username', 'a'], { env: { MIGRATOR_SOURCE_PASSWORD: 'x' } })
    expect(dup.code).toBe(1)
    expect(dup.stderr).toStartWith('E_MIG_CONFLICT: ')

    const list = await cli(['--json', 'sources', 'list'])
    expect(list.code).toBe(0)
    expect(JSON.parse(list.stdout)).toEqual([source])
    const table = await cli(['sources', 'list'])
    expect(table.stdout.split('\n')[1]).toMatch(
      new RegExp(`^${source.id}\\s+vc-lab\\s+vim_api\\s+https://127\\.0\\.0\\.1:1/sdk\\s+administrator@vsphere\\.local$`),
    )

    for (const sub of ['test', 'vms']) {
      const r = await cli(['sources', sub, source.id])
      expect(r.code).not.toBe(0)
      expect(r.stdout).toBe('')
      expect(r.stderr).toStartWith('E_MIG_SOURCE_UNREACHABLE: ')
    }
    const unknown = await cli(['sources', 'test', '00000000-0000-4000-8000-000000000000'])
    expect(unknown.code).toBe(1)
    expect(unknown.stderr).toStartWith('E_MIG_NOT_FOUND: ')
  }, 30_000)

  test('uploads list|rm with --json', async () => {
    const form = new FormData()
    form.append('file', new Blob([Buffer.alloc(4096, 7)]), 'small.img')
    const res = await fetch(`${base}/uploads`, { method: 'POST', headers: authHeader, body: form })
    expect(res.status).toBe(201)
    const upload = (await res.json()) as any

    const list = await cli(['--json', 'uploads', 'list'])
    expect(list.code).toBe(0)
    const items = JSON.parse(list.stdout)
    expect(items).toHaveLength(1)
    expect(items[0]).toMatchObject({ id: upload.id, filename: 'small.img', size_bytes: 4096, sha256: upload.sha256 })
    const table = await cli(['uploads', 'list'])
    expect(table.stdout).toMatch(new RegExp(`^${upload.id}\\s+small\\.img\\s+4\\.0 KiB\\s+${upload.sha256}\\s+`, 'm'))

    const rm = await cli(['uploads', 'rm', upload.id])
    expect(rm.code).toBe(0)
    expect(rm.stdout).toBe(`removed ${upload.id}\n`)
    expect(JSON.parse((await cli(['--json', 'uploads', 'list'])).stdout)).toEqual([])
    const again = await cli(['uploads', 'rm', upload.id])
    expect(again.code).toBe(1)
    expect(again.stderr).toStartWith('E_MIG_UPLOAD_NOT_FOUND: ')
  }, 30_000)

  test('host-files ls [path] with --json; a path escaping the import root: E_MIG_HOST_PATH_REJECTED; import of root-relative paths', async () => {
    const root = await cli(['--json', 'host-files', 'ls'])
    expect(root.code).toBe(0)
    const r = JSON.parse(root.stdout)
    expect(r.truncated).toBe(false)
    expect(r.items.map((e: any) => [e.path, e.type])).toContainEqual(['exports', 'directory'])

    const sub = await cli(['--json', 'host-files', 'ls', 'exports/vm1'])
    expect(sub.code).toBe(0)
    const s = JSON.parse(sub.stdout)
    expect(s.items).toHaveLength(1)
    expect(s.items[0]).toMatchObject({ name: 'disk.qcow2', path: 'exports/vm1/disk.qcow2', type: 'file', size_bytes: 3000 })

    const table = await cli(['host-files', 'ls', 'exports'])
    expect(table.code).toBe(0)
    const rows = table.stdout.trimEnd().split('\n')
    expect(rows[0]).toMatch(/^TYPE\s+SIZE\s+MODIFIED\s+PATH$/)
    expect(
      rows
        .slice(1)
        .map((l) => l.split(/\s+/)[0] + ' ' + l.split(/\s+/).at(-1))
        .sort(),
    ).toEqual(['directory exports/vm1', 'file exports/notes.txt'])

    // import of a path relative to the import root (not a local file here): inspected in place on the server.
    const inRoot = await cli(['import', 'exports/vm1/disk.qcow2'])
    expect(inRoot.code).toBe(1)
    expect(inRoot.stderr).toStartWith('E_MIG_UNSUPPORTED_FORMAT: ')
    // Messages name paths relative to the import root.
    expect(inRoot.stderr).toContain('exports/vm1/disk.qcow2: unsupported input')
    expect(inRoot.stderr).not.toContain('imports/exports')
    const missing = await cli(['import', 'exports/absent.ova'])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toStartWith('E_MIG_NOT_FOUND: ')

    const escaped = await cli(['host-files', 'ls', '../..'])
    expect(escaped.code).toBe(1)
    expect(escaped.stderr).toStartWith('E_MIG_HOST_PATH_REJECTED: ')
  }, 30_000)

  test('plan submit of an invalid plan: E_MIG_INVALID_PLAN with the failing fields; watch of an unknown job: E_MIG_NOT_FOUND', async () => {
    const planFile = path.join(t.dir, 'bad-plan.json')
    writeFileSync(
      planFile,
      JSON.stringify({ plan: { source: { Offline: 'ova_archive' }, source_ref: { kind: 'offline_host_path', path: 'x.ova' }, mode: 'Lukewarm' } }),
    )
    const r = await cli(['plan', 'submit', planFile])
    expect(r.code).toBe(1)
    expect(r.stderr).toStartWith('E_MIG_INVALID_PLAN: ')
    expect(r.stderr).toContain('plan.mode')
    const w = await cli(['watch', '00000000-0000-4000-8000-000000000000'])
    expect(w.code).toBe(1)
    expect(w.stderr).toStartWith('E_MIG_NOT_FOUND: ')
  }, 30_000)

  test('backup run --wait and backup restore-points (--json) against the backup API test double, options from flags and environment', async () => {
    const flags = ['--backup-url', double.url, '--backup-user', 'hostadmin', '--backup-password', 'B4ckup!pw', '--backup-ca', double.certFile]
    const run = await runCli(['backup', ...flags, 'run', BACKUP_JOB, '--wait', '--timeout', '10'])
    expect(run.stderr).toBe('')
    expect(run.code).toBe(0)
    expect(run.stdout).toMatch(/^run run-\d+, restore point rp-\d+ \(quiesced\)\n$/)
    expect(double.runs.map((r) => r.job_id)).toEqual([BACKUP_JOB])

    // Environment only, trusting the self-signed certificate by its pinned fingerprint.
    const env = {
      MIGRATOR_BACKUP_URL: double.url,
      MIGRATOR_BACKUP_USER: 'hostadmin',
      MIGRATOR_BACKUP_PASSWORD: 'B4ckup!pw',
      MIGRATOR_BACKUP_FINGERPRINT: double.fingerprint256,
    }
    const runJson = await runCli(['--json', 'backup', 'run', BACKUP_JOB, '--wait', '--timeout', '10'], { env })
    expect(runJson.code).toBe(0)
    const out = ndjson(runJson.stdout)
    expect(out).toHaveLength(1)
    expect(out[0]).toMatchObject({ run_id: 'run-2', restore_point: { id: 'rp-2', run_id: 'run-2', job_id: BACKUP_JOB, quiesced: true } })

    const points = await runCli(['--json', 'backup', 'restore-points'], { env: { ...env, MIGRATOR_BACKUP_FINGERPRINT: '', MIGRATOR_BACKUP_INSECURE: '1' } })
    expect(points.code).toBe(0)
    expect(JSON.parse(points.stdout)).toEqual(
      double.points.map((p) => ({ id: p.id, run_id: p.run_id, job_id: p.job_id, created_at: p.created_at, quiesced: true })),
    )
    const table = await runCli(['backup', ...flags, 'restore-points'])
    expect(table.stdout.trimEnd().split('\n')).toEqual([
      expect.stringMatching(/^ID\s+RUN\s+JOB\s+QUIESCED\s+CREATED$/),
      expect.stringMatching(new RegExp(`^rp-1\\s+run-1\\s+${BACKUP_JOB}\\s+yes\\s+\\S+$`)),
      expect.stringMatching(new RegExp(`^rp-2\\s+run-2\\s+${BACKUP_JOB}\\s+yes\\s+\\S+$`)),
    ])
  }, 30_000)

  test('backup errors: failed run E_MIG_SNAPSHOT_FAILED, wrong credentials E_MIG_AUTH_FAILED, untrusted certificate E_MIG_SOURCE_UNREACHABLE, no URL', async () => {
    const base = ['--backup-url', double.url, '--backup-user', 'hostadmin', '--backup-ca', double.certFile]
    const failed = await runCli(['backup', ...base, '--backup-password', 'B4ckup!pw', 'run', BACKUP_FAILING])
    expect(failed.code).toBe(1)
    expect(failed.stderr).toStartWith('E_MIG_SNAPSHOT_FAILED: ')
    expect(failed.stderr).toContain('storage offline')

    const creds = await runCli(['backup', ...base, '--backup-password', 'wrong', 'restore-points'])
    expect(creds.code).toBe(1)
    expect(creds.stderr).toStartWith('E_MIG_AUTH_FAILED: ')

    // The global --user/--password are the backup API's credentials when no --backup-user is given.
    const globalCreds = await runCli([
      '--user',
      'hostadmin',
      '--password',
      'B4ckup!pw',
      '--json',
      'backup',
      '--backup-url',
      double.url,
      '--backup-insecure',
      'restore-points',
    ])
    expect(globalCreds.code).toBe(0)
    expect(JSON.parse(globalCreds.stdout)).toHaveLength(double.points.length)

    const untrusted = await runCli(['backup', '--backup-url', double.url, '--backup-user', 'hostadmin', '--backup-password', 'B4ckup!pw', 'restore-points'])
    expect(untrusted.code).toBe(1)
    expect(untrusted.stderr).toStartWith('E_MIG_SOURCE_UNREACHABLE: ')
    expect(untrusted.stderr).toMatch(/self[- ]signed|certificate/i)

    const badId = await runCli(['backup', ...base, 'run', 'not-a-uuid'])
    expect(badId.code).toBe(1)
    expect(badId.stderr).toStartWith('E_MIG_BAD_REQUEST: ')

    const noUrl = await runCli(['backup', 'restore-points'])
    expect(noUrl.code).toBe(1)
    expect(noUrl.stderr).toBe('error: no backup API: give --backup-url or MIGRATOR_BACKUP_URL\n')
  }, 30_000)
})
