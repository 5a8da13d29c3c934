/**
 * Live import against a normal import of the same real Debian guest (fixtures/guest-image.ts,
 * variant `noconsole`: BIOS, the boot verified from its screen, packed as a VMX folder) with the same copy cap
 * (`MIGRATOR_COPY_MAX_BYTES_PER_SECOND`), by the real server and worker, file sink, libvirt + qemu
 * under TCG, interleaved (normal, live, normal, live ...), each run starting with the other
 * side's domain and volumes removed:
 *
 *   side   | run | verified boot s | Completed s
 *
 * "verified boot" is submission to the job carrying a verified boot verdict (`hardware.boot`), as
 * the client sees it; "Completed" is submission to the `Completed` state. Best and median per side
 * at the end.
 *
 *   ./node_modules/.bin/bun bench/live-import.ts [--reps N] [--cap BYTES_PER_S]
 *   defaults: --reps 3 --cap 8388608
 * Needs root, libvirt (started when not running), qemu, libguestfs; builds the guest images on
 * first use (minutes).
 */
import { execFileSync } from 'node:child_process'
import { chmodSync, mkdirSync, rmSync } from 'node:fs'
import * as path from 'node:path'
import { guestImages } from '../fixtures/guest-image.ts'
import { buildInput } from '../fixtures/inputs.ts'
import { call, offlinePlan, submit } from '../test/helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../test/helpers/libvirt.ts'
import { startServer } from '../test/helpers/server.ts'
import { cliArg, median, onInterrupt } from './source.ts'

const reps = Math.max(1, Number(cliArg('reps', '3')))
const cap = Math.max(1, Number(cliArg('cap', String(8 * 1024 * 1024))))
const PREFIX = 'libench-'

const dir = execFileSync('mktemp', ['-d', '/var/tmp/mig-bench-live-XXXXXX'], { encoding: 'utf8' }).trim()
chmodSync(dir, 0o755)
const dataDir = path.join(dir, 'data')
// the server's import root is `<data dir>/imports`
const importRoot = path.join(dataDir, 'imports')
mkdirSync(importRoot, { recursive: true })
await ensureLibvirt()
await cleanupDomains(PREFIX)
const srv = await startServer('bun', dataDir, {
  MIGRATOR_DOMAIN_TYPE: 'qemu',
  MIGRATOR_BOOT_GRACE_SECONDS: '1',
  MIGRATOR_BOOT_TIMEOUT_SECONDS: '1200',
  MIGRATOR_COPY_MAX_BYTES_PER_SECOND: String(cap),
})
onInterrupt(async () => {
  await srv.stop()
  await cleanupDomains(PREFIX)
  rmSync(dir, { recursive: true, force: true })
})

const image = guestImages().noconsole
const input = buildInput('vmx_folder', importRoot, 'libench', [image.path])
const rel = path.relative(importRoot, input.path)
const results: Record<'normal' | 'live', Array<{ boot: number; completed: number }>> = { normal: [], live: [] }

console.log(`guest ${image.variant} (${(image.sizeBytes / 2 ** 30).toFixed(0)} GiB virtual), cap ${cap} B/s, ${reps} runs per side\n`)
console.log('side   | run | verified boot s | Completed s')
try {
  for (let r = 1; r <= reps; r++) {
    for (const side of ['normal', 'live'] as const) {
      await cleanupDomains(PREFIX)
      const name = `${PREFIX}${side}-${r}`
      const t0 = Date.now()
      const job = await submit(srv.base, offlinePlan('vmx_folder', rel, { name, ...(side === 'live' ? { live_import: true } : {}) }))
      let boot = Number.NaN
      let last: any = null
      for (;;) {
        last = (await call(srv.base, 'GET', `/migrations/${job.id}`)).body
        if (Number.isNaN(boot) && last.hardware?.boot?.verified) boot = (Date.now() - t0) / 1000
        if (['completed', 'failed', 'cancelled'].includes(last.status)) break
        await new Promise((res) => setTimeout(res, 250))
      }
      const completed = (Date.now() - t0) / 1000
      if (last.state !== 'Completed') throw new Error(`${side} run ${r}: ${last.state} ${JSON.stringify(last.last_error)}`)
      results[side].push({ boot, completed })
      console.log(`${side.padEnd(6)} | ${String(r).padStart(3)} | ${boot.toFixed(1).padStart(15)} | ${completed.toFixed(1).padStart(11)}`)
      // the other side's next run starts without this one's domain and volumes
      await cleanupDomains(PREFIX)
      rmSync(path.join(dataDir, 'volumes', 'migrations', job.id), { recursive: true, force: true })
    }
  }
} catch (e) {
  await srv.stop()
  await cleanupDomains(PREFIX)
  rmSync(dir, { recursive: true, force: true })
  throw e
}
console.log('')
for (const side of ['normal', 'live'] as const) {
  const b = results[side].map((x) => x.boot)
  const c = results[side].map((x) => x.completed)
  console.log(
    `${side}: verified boot best ${Math.min(...b).toFixed(1)} s, median ${median(b).toFixed(1)} s; Completed best ${Math.min(...c).toFixed(1)} s, median ${median(c).toFixed(1)} s`,
  )
}
await srv.stop()
await cleanupDomains(PREFIX)
rmSync(dir, { recursive: true, force: true })
