/**
 * What the real-guest files (`*.guest.integ.test.ts`) share: a server under Bun that boots real
 * Debian guests under TCG (fixtures/guest-image.ts) and decides their boots on the guests' own
 * evidence (no serial pattern), the SSE stream read from its start, the export of a guest image as
 * another hypervisor would write it, and the end of a job as the stream and the server's files
 * saw it.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { GUEST_TEST_BOOT_TIMEOUT_S, GUEST_TEST_VCPUS } from '../../fixtures/guest-image.ts'
import { buildInput, type ExportHardware } from '../../fixtures/inputs.ts'
import { offlinePlan, openStream, submit, waitJob } from './jobs.ts'
import { cleanupDomains, ensureLibvirt } from './libvirt.ts'
import { startServer, type RunningServer } from './server.ts'

/** How long a real-guest job may take from its submission to its end, ms: it may wait behind other TCG boots on a loaded host. */
export const GUEST_JOB_WAIT_MS = 90 * 60_000

/**
 * Server environment for real guests under TCG: a 1 s grace period, the boot check's limit
 * `timeoutS` (default GUEST_TEST_BOOT_TIMEOUT_S), and with `maxJobs` that many jobs at a time.
 */
export function guestServerEnv(o: { timeoutS?: number; maxJobs?: number } = {}): Record<string, string> {
  return {
    MIGRATOR_DOMAIN_TYPE: 'qemu',
    MIGRATOR_BOOT_GRACE_SECONDS: '1',
    MIGRATOR_BOOT_TIMEOUT_SECONDS: String(o.timeoutS ?? GUEST_TEST_BOOT_TIMEOUT_S),
    ...(o.maxJobs ? { MIGRATOR_MAX_JOBS: String(o.maxJobs) } : {}),
  }
}

/** A job's end as the real-guest tests read it. */
export interface GuestJobEnd {
  /** The job as `GET /migrations/:id` gave it at its end. */
  job: any
  /** The job's states in the order the SSE stream carried them. */
  states: string[]
  /** `updated_at` (ISO) of the job's `Starting` event, null when the stream had none. */
  startingAt: string | null
  /** Seconds from `Starting` to the job's end (NaN without a `Starting` event). */
  startingToEnd: number
  /** The serial log of the job's domain as it is now ('' when there is none). */
  serial(): string
}

/** A server for real guests with its data dir, import root and SSE stream. */
export interface GuestLane {
  /** The server's data dir (mode 0755: qemu reads the volumes under it). */
  dir: string
  /** `<dir>/imports`: the exports the jobs read. */
  importRoot: string
  srv: RunningServer
  stream: ReturnType<typeof openStream>
  /**
   * Writes `disks` as a `kind` export named `in-<id>` (fixtures/inputs.ts, one vCPU and `hw`)
   * and submits an offline plan for it with `plan` (name, networks, start...). Returns the job
   * and the export's path.
   */
  importExport(id: string, kind: string, disks: string[], hw: ExportHardware | undefined, plan: Record<string, unknown>): Promise<{ job: any; input: string }>
  /** Waits (GUEST_JOB_WAIT_MS from now) for the end of `job` and for the stream's event of its final state. */
  ended(job: { id: string }): Promise<GuestJobEnd>
  /** Stops the stream and the server, removes the domains named `prefixes`. */
  stop(): Promise<void>
}

/**
 * Starts a server for real guests on `dir` (made 0755, with `imports/`) after libvirt is up and
 * the domains named with `prefixes` are gone, with `env` over guestServerEnv(); opens its SSE
 * stream.
 */
export async function startGuestLane(dir: string, prefixes: string[], env: Record<string, string> = guestServerEnv()): Promise<GuestLane> {
  chmodSync(dir, 0o755)
  const importRoot = path.join(dir, 'imports')
  mkdirSync(importRoot, { recursive: true })
  await ensureLibvirt()
  for (const p of prefixes) await cleanupDomains(p)
  const srv = await startServer('bun', dir, env)
  const stream = openStream(srv.base)
  await stream.ready
  const ofJob = (id: string) => stream.events.filter((e) => e.event === 'migration' && e.data.id === id)
  return {
    dir,
    importRoot,
    srv,
    stream,
    async importExport(id, kind, disks, hw, plan) {
      const input = buildInput(kind, importRoot, `in-${id}`, disks, {}, { ...hw, vcpus: GUEST_TEST_VCPUS })
      return { job: await submit(srv.base, offlinePlan(kind, path.relative(importRoot, input.path), plan)), input: input.path }
    },
    async ended(job) {
      const done = await waitJob(srv.base, job.id, undefined, GUEST_JOB_WAIT_MS)
      // The SSE event of the final state may arrive just after the job reads as ended.
      for (let i = 0; i < 100 && !ofJob(job.id).some((e) => e.data.state === done.state); i++) await Bun.sleep(50)
      const startingAt: string | null = ofJob(job.id).find((e) => e.data.state === 'Starting')?.data.updated_at ?? null
      const log = path.join(dir, 'logs', `${job.id}.serial.log`)
      return {
        job: done,
        states: ofJob(job.id).map((e) => e.data.state),
        startingAt,
        startingToEnd: startingAt ? (Date.parse(done.finished_at) - Date.parse(startingAt)) / 1000 : Number.NaN,
        serial: () => (existsSync(log) ? readFileSync(log, 'latin1') : ''),
      }
    },
    async stop() {
      stream.close()
      await srv.stop()
      for (const p of prefixes) await cleanupDomains(p)
    },
  }
}
