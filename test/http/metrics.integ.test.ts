/**
 * `GET {base}/metrics` on the real server under each runtime: a real qcow2 import and a failing
 * one, then the exposition is checked by Prometheus' own `promtool check metrics`, its figures
 * against the disk the test wrote (the bytes copied are the disk's data bytes, the rest zero), and
 * again after a restart of the server on the same data directory (the store-derived figures
 * survive it). The alert rules of docs/operations.md pass `promtool check rules`. The completed
 * import defines its domain (not started); domains of this file are named `m63-*` and removed.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync, spawnSync } from 'node:child_process'
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync, writeSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import * as path from 'node:path'
import { call, offlinePlan, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../helpers/libvirt.ts'
import { ensureNodeBuild, RUNTIMES, startServer, type RunningServer } from '../helpers/server.ts'
import { REPO, tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024

/** The value of the sample `name{labels}` (labels as Prometheus writes them), or null. */
function sample(text: string, series: string): number | null {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `))
  return line === undefined ? null : Number(line.slice(series.length + 1))
}

/** `promtool check metrics` over `text`: its exit status and what it printed. */
function promtoolMetrics(text: string): { status: number | null; out: string } {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' })
  return { status: r.status, out: `${r.stdout}${r.stderr}` }
}

/**
 * A 16 MiB raw disk with 3 MiB of random data (2 MiB at 4 MiB, 1 MiB at 10 MiB) and zeros
 * elsewhere, converted to qcow2 under `root/name/`; returns the path relative to the import root.
 */
function dataDisk(importRoot: string, name: string): string {
  const dir = path.join(importRoot, name)
  mkdirSync(dir, { recursive: true })
  const raw = path.join(dir, `${name}.raw`)
  const fd = openSync(raw, 'w')
  writeSync(fd, randomBytes(2 * MiB), 0, undefined, 4 * MiB)
  writeSync(fd, randomBytes(MiB), 0, undefined, 10 * MiB)
  closeSync(fd)
  execFileSync('truncate', ['-s', String(16 * MiB), raw])
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, path.join(dir, `${name}.qcow2`)])
  return `${name}/${name}.qcow2`
}

describe('docs/operations.md alert rules', () => {
  test('the rules block is valid for promtool check rules, and a broken copy is not', () => {
    const doc = readFileSync(path.join(REPO, 'docs/operations.md'), 'utf8')
    const block = /<!-- alert-rules -->\s*```yaml\n([\s\S]*?)```/.exec(doc)?.[1]
    expect(block).toContain('MigratorJobFailed')
    const t = tempDir('mig-metrics-rules-')
    try {
      const file = path.join(t.dir, 'rules.yml')
      writeFileSync(file, block!)
      const ok = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' })
      expect({ status: ok.status, out: ok.stdout + ok.stderr }).toEqual({ status: 0, out: expect.stringContaining('SUCCESS: 3 rules found') })
      // an unbalanced parenthesis in the first expression
      writeFileSync(file, block!.replace('increase(', 'increase(('))
      expect(spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' }).status).not.toBe(0)
    } finally {
      t.cleanup()
    }
  })
})

for (const runtime of RUNTIMES) {
  describe(`GET /metrics under ${runtime}`, () => {
    const t = tempDir(`mig-metrics-${runtime}-`)
    let srv: RunningServer | undefined
    beforeAll(async () => {
      await ensureLibvirt()
      // the Node build (tsc) outside the test's own time: minutes on a busy machine
      if (runtime === 'node') await ensureNodeBuild()
    }, 600_000)
    afterAll(async () => {
      await srv?.stop()
      await cleanupDomains(`m63-${runtime}-`)
      t.cleanup()
    })

    test('promtool accepts the exposition; bytes copied are the data bytes of a real import; figures survive a restart', async () => {
      const importRoot = path.join(t.dir, 'imports')
      const rel = dataDisk(importRoot, `m63-${runtime}-data`)
      mkdirSync(path.join(importRoot, 'bad'), { recursive: true })
      writeFileSync(path.join(importRoot, 'bad', 'bad.ova'), 'x')
      srv = await startServer(runtime, t.dir)

      const empty = await fetch(`${srv.base}/metrics`)
      expect(empty.status).toBe(200)
      expect(empty.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8')
      const emptyText = await empty.text()
      expect(promtoolMetrics(emptyText)).toEqual({ status: 0, out: '' })
      expect(sample(emptyText, 'migrator_worker_restarts_total')).toBe(0)

      const good = await submit(srv.base, offlinePlan('qcow2', rel, { name: `m63-${runtime}-data`, start: false }))
      const bad = await submit(srv.base, offlinePlan('ova_archive', 'bad/bad.ova', { name: `m63-${runtime}-bad` }))
      const done = await waitJob(srv.base, good.id)
      expect([done.state, done.last_error]).toEqual(['Completed', null])
      expect((await waitJob(srv.base, bad.id)).last_error.code).toBe('E_MIG_MALFORMED_ARCHIVE')

      const check = (text: string) => {
        expect(promtoolMetrics(text)).toEqual({ status: 0, out: '' })
        expect(sample(text, 'migrator_copied_bytes_total{source_kind="qcow2"}')).toBe(3 * MiB)
        expect(sample(text, 'migrator_zero_skipped_bytes_total{source_kind="qcow2"}')).toBe(13 * MiB)
        expect(sample(text, 'migrator_jobs{state="Completed",source_kind="qcow2"}')).toBe(1)
        expect(sample(text, 'migrator_jobs{state="Failed",source_kind="ova_archive"}')).toBe(1)
        expect(sample(text, 'migrator_job_failures_total{code="E_MIG_MALFORMED_ARCHIVE"}')).toBe(1)
        expect(sample(text, 'migrator_jobs_waiting_for_space')).toBe(0)
        expect(sample(text, 'migrator_copy_rate_bytes_per_second')).toBe(0)
        expect(text).toContain('# TYPE migrator_delta_pass_duration_seconds histogram')
        // each job had one worker
        expect(sample(text, 'migrator_worker_restarts_total')).toBe(0)
      }
      check(await (await fetch(`${srv.base}/metrics`)).text())

      await srv.stop()
      srv = await startServer(runtime, t.dir)
      check(await (await fetch(`${srv.base}/metrics`)).text())
      expect((await call(srv.base, 'GET', '/migrations')).body.items.length).toBe(2)
    }, 180_000)
  })
}
