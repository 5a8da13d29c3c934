/**
 * The plan's checks in a test boot (docs/test-boot.md "Checks in a test boot"), through the HTTP
 * API, real libvirt + qemu (TCG), file sink: offline imports (VMX folder, one NIC) of a boot-sector
 * disk that prints a marker on the serial console (the server's MIGRATOR_BOOT_SERIAL_PATTERN makes
 * it the boot evidence) and has no network stack, with `start: false` and checks in the plan. The
 * clone boots with its NIC on the test boot's isolated network; nothing answers there, so:
 * - a failing check fails the test boot (the job stays `Completed`), its results in the record's
 *   `hardware.checks`, the error naming the check and where it ran from;
 * - a plan whose only check has `on_failure: notice` passes the test boot with that notice;
 * and in both, the clone's domain, the namespace, the libvirt network and its bridge are gone after.
 * The guest test (test/engine/real-guests-shapes.guest.integ.test.ts) has the checks pass.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { testBootNetworkNames } from '../../lib/domain/test-boot-network.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { buildInput } from '../helpers/inputs.ts'
import { bootCheckEnv, call, offlinePlan, submit, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt, tearDownJobs, virshText } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'i60t-'
const MARKER = 'MIGRATOR-I60T-TESTBOOT-7741'
const MiB = 1024 * 1024

function gone(jobId: string): { netns: boolean; bridge: boolean; network: boolean } {
  const n = testBootNetworkNames(jobId)
  const fails = (cmd: string, args: string[]) => {
    try {
      execFileSync(cmd, args, { stdio: 'ignore' })
      return false
    } catch {
      return true
    }
  }
  return {
    netns: !new RegExp(`^${n.netns}( |$)`, 'm').test(execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })),
    bridge: fails('ip', ['link', 'show', n.bridge]),
    network: fails('virsh', ['-c', 'qemu:///system', 'net-info', n.network]),
  }
}

describe('checks in a test boot: its isolated network, a failing check fails it, a notice does not', () => {
  const t = tempDir('mig-i60t-')
  const importRoot = path.join(t.dir, 'imports')
  let srv: RunningServer
  let rel = ''

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
    const boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 16 * MiB).path
    rel = path.relative(importRoot, buildInput('vmx_folder', importRoot, 'in-boot', [boot]).path)
    srv = await startServer('bun', t.dir, bootCheckEnv(MARKER))
  }, 120_000)

  afterAll(() => tearDownJobs(PREFIX, t, srv), 120_000)

  /** Submits a `start: false` job with `checks`, waits for it, test-boots it, returns the job when the test boot ended and the clone's XML. */
  async function testBooted(name: string, checks: unknown[]): Promise<{ job: any; cloneXml: string }> {
    const job = await submit(srv.base, offlinePlan('vmx_folder', rel, { name: `${PREFIX}${name}`, start: false, checks }))
    const done = await waitJob(srv.base, job.id, undefined, 10 * 60_000)
    expect([done.state, done.last_error]).toEqual(['Completed', null])
    expect((await call(srv.base, 'POST', `/migrations/${job.id}/test-boot`)).status).toBe(202)
    let cloneXml = ''
    for (let i = 0; i < 3000 && !cloneXml.includes('<domain'); i++) {
      await Bun.sleep(100)
      cloneXml = virshText('dumpxml', `${PREFIX}${name}-testboot`)
    }
    const end = await waitJob(srv.base, job.id, (j) => ['passed', 'failed', 'cancelled'].includes(j.test_boot?.state), 10 * 60_000)
    console.log(
      `${name}: ${JSON.stringify({ ...end.test_boot, serial_tail: end.test_boot.serial_tail.slice(-2), hardware: { checks: end.test_boot.hardware?.checks } })}`,
    )
    return { job: end, cloneXml }
  }

  test('a failing check fails the test boot: the results on the record, the job still Completed, the network removed', async () => {
    const { job, cloneXml } = await testBooted('fail', [
      { name: 'web', tcp: { port: 80 } },
      { name: 'extra', http: { port: 8080 }, on_failure: 'notice' },
    ])
    const names = testBootNetworkNames(job.id)
    expect(cloneXml).toContain(`<source bridge='${names.bridge}'/>`)
    const tb = job.test_boot
    expect([job.state, job.last_error, tb.state, tb.verified]).toEqual(['Completed', null, 'failed', true])
    expect(tb.error).toStartWith('E_MIG_GUEST_BOOT_FAILED: ')
    expect(tb.error).toContain('service check "web" failed')
    expect(tb.error).toContain(`network namespace ${names.netns} on the isolated bridge ${names.bridge}`)
    expect(tb.hardware.checks.map((c: any) => [c.name, c.ok, c.on_failure, c.result])).toEqual([
      ['web', false, 'fail', 'no address of the guest is known (no static address, DHCP lease or neighbour entry)'],
      ['extra', false, 'notice', 'no address of the guest is known (no static address, DHCP lease or neighbour entry)'],
    ])
    expect(virshText('domstate', `${PREFIX}fail-testboot`)).toBe('absent')
    expect(gone(job.id)).toEqual({ netns: true, bridge: true, network: true })
  }, 900_000)

  test('a check with on_failure notice only adds a notice: the test boot passes', async () => {
    const { job } = await testBooted('notice', [{ name: 'extra', tcp: { port: 22 }, on_failure: 'notice' }])
    const tb = job.test_boot
    expect([tb.state, tb.verified, tb.error]).toEqual(['passed', true, null])
    expect(tb.notice).toContain('service check "extra" failed')
    expect(tb.hardware.checks.map((c: any) => [c.name, c.ok])).toEqual([['extra', false]])
    expect(virshText('domstate', `${PREFIX}notice-testboot`)).toBe('absent')
    expect(gone(job.id)).toEqual({ netns: true, bridge: true, network: true })
  }, 900_000)
})
