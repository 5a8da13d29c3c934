/**
 * The faults the remote-input suites inflict the same way over every transport: a worker killed
 * half-way through a copy, and a source replaced while it is read.
 */
import { expect } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { renameSync } from 'node:fs'
import { openStream, submit, waitJob, workerPid } from './jobs.ts'

/**
 * Submits `plan` to the server at `base` (data directory `dataDir`), waits until half of its
 * bytes are copied, checks that a durable watermark and the job's worker exist, kills the worker
 * with SIGKILL and reads `servedNow()` (what the source has served so far) right after; then waits
 * for the job's end. Returns the job, its end state, the watermark at the kill (bytes) and that
 * reading.
 */
export async function killWorkerHalfway(
  base: string,
  dataDir: string,
  plan: Record<string, unknown>,
  servedNow: () => number,
): Promise<{ job: any; done: any; durable: number; servedAtKill: number }> {
  const stream = openStream(base)
  await stream.ready
  const job = await submit(base, plan)
  const half = await waitJob(base, job.id, (j) => j.progress.bytes_total > 0 && j.progress.bytes_done >= j.progress.bytes_total / 2, 60_000)
  const durable = half.progress.disks[0].watermark
  expect(durable).toBeGreaterThan(0)
  const pid = workerPid(dataDir, job.id)
  expect(pid).not.toBeNull()
  process.kill(pid!, 'SIGKILL')
  const servedAtKill = servedNow()
  const done = await waitJob(base, job.id)
  stream.close()
  return { job, done, durable, servedAtKill }
}

/**
 * Copies the qcow2 image `image` to `file` and writes its other version, `<file>.new`, converted
 * from the raw image `raw`. The other version is made before the copy starts: the swap mid-copy
 * is then one rename, not a conversion that a fast copy could outrun.
 */
export function stageReplacement(file: string, image: string, raw: string): void {
  execFileSync('cp', [image, file])
  execFileSync('qemu-img', ['convert', '-O', 'qcow2', raw, `${file}.new`])
}

/**
 * Renames `<file>.new` (see stageReplacement) over `file` as soon as job `jobId` has copied its
 * first bytes, then waits for the job's end and returns it. The swap comes that early because the
 * read-ahead runs windows ahead of the writes: a swap after a later mark could come after the last
 * read of a fast copy.
 */
export async function replaceMidCopy(base: string, jobId: string, file: string): Promise<any> {
  await waitJob(base, jobId, (j) => j.progress.bytes_done > 0, 60_000)
  renameSync(`${file}.new`, file)
  return waitJob(base, jobId)
}

/**
 * Checks that a job whose worker was killed (killWorkerHalfway) resumed from its watermark: on its
 * only disk the restarted worker read at most the `data` bytes above the watermark `durable` plus
 * one `flush` interval, the source served at most that plus `slack` (the image's tables, the
 * transport's headers) after the kill (`servedAfter`), and that bound is below a copy from zero.
 * All in bytes.
 */
export function expectResumedFromWatermark(done: any, durable: number, servedAfter: number, b: { data: number; flush: number; slack: number }): void {
  expect(done.progress.disks[0].bytes_read).toBeLessThanOrEqual(b.data - durable + b.flush)
  expect(servedAfter).toBeLessThanOrEqual(b.data - durable + b.flush + b.slack)
  expect(b.data - durable + b.flush + b.slack).toBeLessThan(b.data)
}
