/**
 * Domain name reservation (JobsRepo.reserveDomain) on a real SQLite store: a
 * name is free when libvirt does not have it (`taken`) and no active job holds it (the unique
 * index `jobs_active_domain`); `replace` gives a job whose name libvirt took meanwhile another
 * one, never one that another active job holds.
 */
import { afterAll, expect, test } from 'bun:test'
import * as path from 'node:path'
import { openStore } from '../../lib/store/index.ts'
import { tempDir } from '../helpers/tmp.ts'

const t = tempDir('mig-reserve-')
afterAll(() => t.cleanup())

test('reserve, keep, replace: names held by active jobs or taken in libvirt are skipped', async () => {
  const store = await openStore(path.join(t.dir, 'db.sqlite'))
  const now = new Date().toISOString()
  const ids = [1, 2, 3].map((n) => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`)
  for (const id of ids) {
    await store.jobs.create({ id, plan: { source: { Offline: 'qcow2' } } as never, strategy: 'offline', effective_mode: 'Cold', now })
  }
  const none = new Set<string>()
  expect(await store.jobs.reserveDomain(ids[0]!, 'vm', none, now)).toBe('vm')
  expect(await store.jobs.reserveDomain(ids[1]!, 'vm', none, now)).toBe('vm-2')
  // A job that holds a name keeps it, whatever the list says.
  expect(await store.jobs.reserveDomain(ids[0]!, 'vm', new Set(['vm']), now)).toBe('vm')
  // libvirt has `vm` now (defined by a job that ended after the list was taken): job 1 gets the
  // first name neither libvirt has nor an active job holds (`vm-2` is job 2's).
  expect(await store.jobs.reserveDomain(ids[0]!, 'vm', new Set(['vm']), now, { replace: true })).toBe('vm-3')
  expect((await store.jobs.get(ids[0]!)).domain).toBe('vm-3')
  // Job 1's old name is free for others again (libvirt aside).
  expect(await store.jobs.reserveDomain(ids[2]!, 'vm', none, now)).toBe('vm')
  await store.close()
})
