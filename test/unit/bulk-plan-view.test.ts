/**
 * lib/jobs/bulk.ts `bulkPlanView`: each VM of a bulk plan reports the state of its latest
 * test boot (docs/test-boot.md), so the shared cutover can be weighed against which VMs passed.
 */
import { expect, test } from 'bun:test'
import type { Job, TestBootRecord } from '../../lib/job.ts'
import { bulkPlanView } from '../../lib/jobs/bulk.ts'
import type { BulkPlanRow } from '../../lib/store/bulk-plans.ts'

const NOW = '2026-11-28T12:00:00.000Z'

/** The fields of a job that the plan view reads; a warm job waiting for a manual cutover. */
function job(key: string, testBoot: TestBootRecord['state'] | null): Job {
  return {
    id: `job-${key}`,
    bulk_key: key,
    plan: { name: key },
    state: 'DeltaSyncing',
    status: 'running',
    depends_on: [],
    blocked_by: [],
    cutover: { mode: 'manual', requested_at: null, started_at: null },
    test_boot: testBoot === null ? null : ({ state: testBoot } as TestBootRecord),
  } as unknown as Job
}

test('each VM carries its latest test boot state, null when none was asked for', () => {
  const row: BulkPlanRow = { id: 'p1', name: 'wave 1', max_per_source: null, cutover_requested_at: null, created_at: NOW, updated_at: NOW }
  const view = bulkPlanView(row, [job('db', 'passed'), job('app', 'failed'), job('web', 'running'), job('cache', null)])
  expect(view.vms.map((v) => [v.key, v.test_boot])).toEqual([
    ['db', 'passed'],
    ['app', 'failed'],
    ['web', 'running'],
    ['cache', null],
  ])
  expect(view.state).toBe('WaitingForCutover')
})
