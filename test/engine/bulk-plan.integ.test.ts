/**
 * Bulk plans (roadmap v0.5) end to end through the HTTP API: VMs of govmomi's vCenter simulator
 * (test/vcsim harness) and an offline qcow2 in one plan, with `depends_on` ordering, a per-source
 * limit of two (`max_per_source`, while MIGRATOR_MAX_JOBS is 4), a deliberately failing VM
 * (a warm VM whose guest keeps writing more than the converge threshold: E_MIG_DELTA_TOO_LARGE
 * after several seconds of passes) that blocks only its dependant, the aggregate plan state, and the
 * shared cutover of a plan's warm VMs. Bad bulk bodies are refused with field paths.
 */
import { beforeAll, describe, expect, test } from 'bun:test'
import { mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { runCli } from '../helpers/cli.ts'
import { buildInput, makeRawImage } from '../helpers/inputs.ts'
import { call, livePlan, offlinePlan, waitJob } from '../helpers/jobs.ts'
import { serverSuite } from '../helpers/server-suite.ts'
import { registerVcsim, startVcsim, type Vcsim, createTwoDiskVm } from '../helpers/vcsim.ts'

const MiB = 1024 * 1024

describe('bulk plans (vCenter simulator + offline input)', () => {
  let v: Vcsim
  // the copy is capped so that each live job runs a few seconds and the limit shows
  const { t, srv } = serverSuite({
    prefix: 'i16b-',
    tmpPrefix: 'mig-i16b-bulk-',
    traversable: true,
    dataSubdir: 'data',
    env: {
      MIGRATOR_MAX_JOBS: '4',
      MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(512 * 1024),
      MIGRATOR_DELTA_CONVERGE_BYTES: String(512 * 1024),
      MIGRATOR_DELTA_MAX_PASSES: '2',
    },
    stop: (s) => [s, v],
  })
  const dataDir = path.join(t.dir, 'data')
  let sourceId = ''

  async function makeVm(name: string): Promise<string> {
    const boot = makeBootDisk(path.join(t.dir, `${name}-boot.raw`), 'I16-BULK', 16 * MiB).path
    return (await createTwoDiskVm(v, t.dir, name, boot)).id
  }
  const live = (vmId: string, name: string, mode: 'Cold' | 'Warm' = 'Cold') => livePlan(sourceId, vmId, mode, { name, start: false })

  async function waitPlan(id: string, pred: (p: any) => boolean, timeoutMs = 150_000): Promise<any> {
    const deadline = Date.now() + timeoutMs
    let p: any = null
    while (Date.now() < deadline) {
      p = (await call(srv.base, 'GET', `/plans/${id}`)).body
      if (pred(p)) return p
      await new Promise((r) => setTimeout(r, 200))
    }
    throw new Error(`plan ${id} did not reach the expected state; last: ${JSON.stringify(p)}`)
  }

  beforeAll(async () => {
    mkdirSync(path.join(dataDir, 'imports'), { recursive: true })
    v = await startVcsim({ cbtPage: 4 * MiB })
    sourceId = await registerVcsim(srv.base, v)
  }, 300_000)

  test('five VMs: db -> app in order, at most two per source at once, a failing VM blocks only its dependant', async () => {
    const ids = { db: await makeVm('i16b-db'), app: await makeVm('i16b-app'), solo: await makeVm('i16b-solo'), bad: await makeVm('i16b-bad') }
    // the guest keeps writing 1 MiB (above the 512 KiB threshold) before every delta pass
    await v.scheduleWrites(ids.bad, [{ before_snapshot: 1, every: true, file: 'i16b-bad/i16b-bad.vmdk', offset: 4 * MiB, length: MiB, pattern: 0x70 }])
    const report = buildInput('qcow2', path.join(dataDir, 'imports'), 'i16b-report', [makeRawImage(path.join(t.dir, 'report.raw'), 4 * MiB, 3)])
    const body = {
      name: 'erp',
      max_per_source: 2,
      vms: [
        { key: 'app', plan: live(ids.app, 'i16b-app'), depends_on: ['db'] },
        { key: 'db', plan: live(ids.db, 'i16b-db') },
        { key: 'solo', plan: live(ids.solo, 'i16b-solo') },
        { key: 'bad', plan: live(ids.bad, 'i16b-bad', 'Warm') },
        {
          key: 'report',
          plan: offlinePlan('qcow2', path.relative(path.join(dataDir, 'imports'), report.path), { name: 'i16b-report', start: false }),
          depends_on: ['bad'],
        },
      ],
    }
    const created = await call(srv.base, 'POST', '/plans', body)
    expect(created.status).toBe(201)
    expect(created.body.vms.map((x: any) => x.key).sort()).toEqual(['app', 'bad', 'db', 'report', 'solo'])
    const planId = created.body.id
    // sample the plan while it runs: never more than two live jobs of the source running
    let maxLive = 0
    const liveKeys = ['db', 'app', 'solo', 'bad']
    const end = await waitPlan(planId, (p) => {
      maxLive = Math.max(maxLive, p.vms.filter((x: any) => liveKeys.includes(x.key) && x.status === 'running').length)
      return ['Blocked', 'Completed', 'Failed', 'Cancelled'].includes(p.state)
    })
    expect(maxLive).toBeLessThanOrEqual(2)
    expect(end.state).toBe('Blocked')
    const byKey = Object.fromEntries(end.vms.map((x: any) => [x.key, x]))
    for (const k of ['db', 'app', 'solo'])
      if (byKey[k].state !== 'Completed')
        console.log(`${k}: ${JSON.stringify((await call(srv.base, 'GET', `/migrations/${byKey[k].job_id}`)).body.last_error)}`)
    expect([byKey.db.state, byKey.app.state, byKey.solo.state, byKey.bad.state, byKey.report.state]).toEqual([
      'Completed',
      'Completed',
      'Completed',
      'Failed',
      'Queued',
    ])
    expect([byKey.report.blocked_by, byKey.app.blocked_by, byKey.report.depends_on]).toEqual([['bad'], [], ['bad']])
    expect(end.counts).toEqual({ queued: 0, running: 0, completed: 3, failed: 1, cancelled: 0, blocked: 1 })
    const job = async (k: string) => (await call(srv.base, 'GET', `/migrations/${byKey[k].job_id}`)).body
    const j = { db: await job('db'), app: await job('app'), solo: await job('solo'), bad: await job('bad'), report: await job('report') }
    expect(j.bad.last_error.code).toBe('E_MIG_DELTA_TOO_LARGE')
    // warm never shut the failing VM down; its snapshots are gone
    expect([(await v.vm(ids.bad)).power_state, (await v.vm(ids.bad)).snapshots]).toEqual(['poweredOn', []])
    // each job is an ordinary migration carrying its place in the plan
    expect([j.report.bulk_plan_id, j.report.bulk_key, j.report.depends_on, j.report.blocked_by]).toEqual([planId, 'report', [j.bad.id], [j.bad.id]])
    expect(j.report.started_at).toBeNull()
    // dependency order: app started after db completed
    expect(Date.parse(j.app.started_at)).toBeGreaterThanOrEqual(Date.parse(j.db.finished_at))
    // the per-source limit: of db, solo and bad (all runnable at once), the last to start waited for one of the first two to end
    const first3 = [j.db, j.solo, j.bad].sort((a, b) => Date.parse(a.started_at) - Date.parse(b.started_at))
    expect(Date.parse(first3[2].started_at)).toBeGreaterThanOrEqual(Math.min(Date.parse(first3[0].finished_at), Date.parse(first3[1].finished_at)))
    // never three live jobs between their start and end at the same instant
    const live4 = [j.db, j.app, j.solo, j.bad]
    for (const x of live4) {
      const at = Date.parse(x.started_at)
      expect(live4.filter((y) => Date.parse(y.started_at) <= at && at < Date.parse(y.finished_at)).length).toBeLessThanOrEqual(2)
    }
    // the CLI shows the plan and who blocks whom
    const shown = await runCli(['plans', 'show', planId], { env: { MIGRATOR_URL: srv.base } })
    expect(shown.code).toBe(0)
    expect(shown.stdout).toContain(`plan ${planId} (erp): Blocked`)
    expect(shown.stdout).toMatch(new RegExp(`report\\s+${j.report.id}\\s+Queued\\s+bad\\s+bad`))
    // the operator cancels the blocked VM: the plan ends Failed
    expect((await call(srv.base, 'POST', `/migrations/${j.report.id}/cancel`)).status).toBe(202)
    const after = (await call(srv.base, 'GET', `/plans/${planId}`)).body
    expect([after.state, after.counts.cancelled, after.counts.blocked]).toEqual(['Failed', 1, 0])
    const list = (await call(srv.base, 'GET', '/plans')).body.items
    expect(list.map((p: any) => p.id)).toContain(planId)
  }, 240_000)

  test("shared cutover: the plan's warm VMs wait together and cut over on one POST /plans/:id/cutover", async () => {
    const a = await makeVm('i16b-wa')
    const b = await makeVm('i16b-wb')
    const created = await call(srv.base, 'POST', '/plans', {
      cutover: { mode: 'manual' },
      precopy_interval_seconds: 1,
      vms: [
        { key: 'wa', plan: live(a, 'i16b-wa', 'Warm') },
        { key: 'wb', plan: live(b, 'i16b-wb', 'Warm') },
      ],
    })
    expect(created.status).toBe(201)
    const id = created.body.id
    const early = await call(srv.base, 'POST', `/plans/${id}/cutover`.replace(id, '00000000-0000-4000-8000-000000000000'))
    expect(early.status).toBe(404)
    await waitPlan(id, (p) => p.state === 'WaitingForCutover')
    expect([(await v.vm(a)).power_state, (await v.vm(b)).power_state]).toEqual(['poweredOn', 'poweredOn'])
    const cut = await call(srv.base, 'POST', `/plans/${id}/cutover`)
    expect(cut.status).toBe(202)
    expect(typeof cut.body.cutover_requested_at).toBe('string')
    const done = await waitPlan(id, (p) => ['Completed', 'Failed', 'Blocked', 'Cancelled'].includes(p.state))
    expect(done.state).toBe('Completed')
    for (const vm of done.vms) {
      const job = await waitJob(srv.base, vm.job_id)
      expect([job.state, job.cutover.mode, job.cutover.requested_at]).toEqual(['Completed', 'manual', cut.body.cutover_requested_at])
    }
    expect([(await v.vm(a)).power_state, (await v.vm(b)).power_state]).toEqual(['poweredOff', 'poweredOff'])
    // nothing left to cut over: 409
    expect((await call(srv.base, 'POST', `/plans/${id}/cutover`)).status).toBe(409)
  }, 180_000)

  test('bad bulk bodies: unknown and cyclic depends_on, duplicate keys, an invalid VM plan, each with its field path', async () => {
    const vmPlan = live('vm-1', 'x')
    const cases: Array<[unknown, string]> = [
      [{ vms: [{ key: 'a', plan: vmPlan, depends_on: ['zz'] }] }, 'vms.0.depends_on.0'],
      [
        {
          vms: [
            { key: 'a', plan: vmPlan, depends_on: ['b'] },
            { key: 'b', plan: vmPlan, depends_on: ['a'] },
          ],
        },
        'vms.0.depends_on',
      ],
      [
        {
          vms: [
            { key: 'a', plan: vmPlan },
            { key: 'a', plan: vmPlan },
          ],
        },
        'vms.1.key',
      ],
      [{ vms: [{ key: 'a', plan: { ...vmPlan, mode: 'Hot' } }] }, 'vms.0.plan.mode'],
      [{ vms: [] }, 'vms'],
    ]
    for (const [body, p] of cases) {
      const r = await call(srv.base, 'POST', '/plans', body)
      expect([r.status, r.body.error.code, r.body.error.details.issues.map((i: any) => i.path)]).toEqual([
        400,
        'E_MIG_INVALID_PLAN',
        expect.arrayContaining([p]),
      ])
    }
    expect((await call(srv.base, 'GET', '/plans')).body.items.every((p: any) => p.vms.length > 0)).toBe(true)
  })
})
