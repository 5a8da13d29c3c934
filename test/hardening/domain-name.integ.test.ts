/**
 * Domain names: the domain name is reserved when a job starts (before its copy), atomically
 * against every other active job and the domains libvirt has. Twelve plans for the same disk
 * without `name`, four at a time: all complete, each with its own domain.
 */
import { beforeAll, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { submit, offlinePlan, waitJob } from '../helpers/jobs.ts'
import { domainsWithPrefix } from '../helpers/libvirt.ts'
import { serverSuite } from '../helpers/server-suite.ts'

const { t, srv: server } = serverSuite({
  prefix: 'i12-same',
  tmpPrefix: 'mig-i12-name-',
  dataSubdir: 'data',
  env: { MIGRATOR_MAX_JOBS: '4', MIGRATOR_DOMAIN_TYPE: 'qemu' },
})
// qemu (libvirt's user) must search the temp dir down to the volumes (mkdtemp makes it 0700; docs/operations.md: defaults).
chmodSync(t.dir, 0o711)
const dataDir = path.join(t.dir, 'data')

beforeAll(() => {
  mkdirSync(path.join(dataDir, 'imports'), { recursive: true })
  const raw = path.join(t.dir, 'disk.raw')
  makeBootDisk(raw, 'I12-SAME', 1 << 20)
  execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'qcow2', raw, path.join(dataDir, 'imports', 'i12-same.qcow2')])
}, 60_000)

test('twelve same-name jobs, four concurrent, all complete with distinct domains', async () => {
  const ids: string[] = []
  for (let i = 0; i < 12; i++) ids.push((await submit(server.base, offlinePlan('qcow2', 'i12-same.qcow2', { start: false }))).id)
  const jobs = await Promise.all(ids.map((id) => waitJob(server.base, id, undefined, 300_000)))
  expect(jobs.map((j) => [j.status, j.last_error?.message ?? null])).toEqual(jobs.map(() => ['completed', null]))
  const names = jobs.map((j) => j.domain as string)
  expect(new Set(names).size).toBe(12)
  expect(names).toContain('i12-same')
  const defined = await domainsWithPrefix('i12-same')
  for (const n of names) expect(defined).toContain(n)
}, 400_000)
