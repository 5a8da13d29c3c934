/**
 * The `.mf` digest of a packed disk file too large to hash at inspect (a 96 MiB streamOptimized
 * VMDK of random bytes in an OVF folder; inspect hashes files up to 64 MiB) is checked while the
 * disk copies, through the real server (file sink, `start: false`, real libvirt for the domain
 * definition): a wrong digest fails the job `E_MIG_MALFORMED_ARCHIVE` naming the file before the
 * disk counts as copied (no domain is defined, the disk's watermark never reaches its capacity);
 * the right one completes.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput } from '../helpers/inputs.ts'
import { offlinePlan, openStream, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, tearDownJobs } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'migdigest-'

describe('packed-disk .mf digest checked alongside the copy', () => {
  const t = tempDir('mig-digest-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let stream: ReturnType<typeof openStream>
  let raw = ''

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    raw = path.join(t.dir, 'disk.raw')
    // Random bytes over the whole disk: the streamOptimized file stays above the 64 MiB inspect limit.
    execFileSync('dd', ['if=/dev/urandom', `of=${raw}`, 'bs=1M', 'count=96', 'conv=notrunc', 'status=none'])
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    srv = await startServer('bun', t.dir)
    stream = openStream(srv.base)
    await stream.ready
  }, 120_000)

  afterAll(() => tearDownJobs(PREFIX, t, stream, srv))

  /** An OVF folder `name` around the disk; `corrupt` replaces the VMDK's digest in the .mf. */
  function input(name: string, corrupt: boolean): string {
    const built = buildInput('ovf_folder', importRoot, name, [raw])
    const mf = path.join(built.path, `${name}.mf`)
    if (corrupt)
      writeFileSync(
        mf,
        readFileSync(mf, 'utf8').replace(/^(SHA1\([^)]*\.vmdk\)= )([0-9a-f]{40})$/m, (_, a) => `${a}${'0'.repeat(40)}`),
      )
    return path.relative(importRoot, built.path)
  }

  test('a wrong digest: E_MIG_MALFORMED_ARCHIVE naming the file, after CopyingFull, never Starting; the right one: Completed', async () => {
    const bad = await submit(srv.base, offlinePlan('ovf_folder', input('bad', true), { name: `${PREFIX}bad`, start: false }))
    const failed = await waitJob(srv.base, bad.id, undefined, 300_000)
    expect(failed.state).toBe('Failed')
    expect(failed.last_error.code).toBe('E_MIG_MALFORMED_ARCHIVE')
    expect(failed.last_error.message).toMatch(/bad-disk1\.vmdk: SHA1 digest mismatch with the manifest \(\.mf\): expected 0{40}, the file has [0-9a-f]{40}/)
    const states = stream.events.filter((e) => e.event === 'migration' && e.data.id === bad.id).map((e) => e.data.state)
    expect(states).toContain('CopyingFull')
    expect(states).not.toContain('Starting')
    expect(failed.domain ?? null).toBeNull()

    const good = await submit(srv.base, offlinePlan('ovf_folder', input('good', false), { name: `${PREFIX}good`, start: false }))
    const done = await waitJob(srv.base, good.id, undefined, 300_000)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
  }, 600_000)
})
