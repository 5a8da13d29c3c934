/**
 * The whole test suite (`npm test`), in two lanes side by side, then a serial phase:
 * - the guest lane: the `*.guest.integ.test.ts` files (real Debian guests and libguestfs under
 *   TCG, each file using one or two cores) one after another, their output shown as it comes;
 * - the other lane: every other file one after another, its output shown when the lane ends;
 * - then the `*.serial.integ.test.ts` files, alone (they restart what every file shares, such as
 *   libvirtd).
 * Two guest files never run at once: two TCG guests per core slow every boot past what the boot
 * checks allow. What the lanes share is set up once around the run: libvirtd and virtlogd started
 * when not running (and stopped after, only those started here), and the Node build of the
 * server in dist/ compiled once.
 *
 * Arguments go on to `bun test` (path filters, `--bail`, ...); a path filter picks from every
 * lane. The last lines are the whole run's counts, as `bun test` prints them (` N pass`,
 * ` N fail`). Exits non-zero when any lane failed.
 */
import { spawn } from 'node:child_process'
import * as path from 'node:path'
import { ensureLibvirt, stopLibvirt } from '../test/helpers/libvirt.ts'
import { ensureNodeBuild, NODE_BUILD_DONE } from '../test/helpers/server.ts'

const REPO = path.resolve(import.meta.dir, '..')
const GUEST = '.guest.integ.test.ts'
const SERIAL = '.serial.integ.test.ts'

const args = process.argv.slice(2)
const options = args.filter((a) => a.startsWith('-'))
// bun test's positional arguments are path filters: a file runs when its path contains one.
const filters = args.filter((a) => !a.startsWith('-'))
const picked = [...new Bun.Glob('test/**/*.test.ts').scanSync({ cwd: REPO })].filter((f) => filters.length === 0 || filters.some((x) => f.includes(x))).sort()
const guest = picked.filter((f) => f.endsWith(GUEST))
const serial = picked.filter((f) => f.endsWith(SERIAL))
const other = picked.filter((f) => !f.endsWith(GUEST) && !f.endsWith(SERIAL))

const totals = { pass: 0, fail: 0 }
const running = new Set<ReturnType<typeof spawn>>()

/**
 * Runs `bun test` over `files`, its ` N pass` / ` N fail` lines added up. `live`: its output is
 * passed through as it comes; otherwise it is kept and written when the run ends.
 */
function bunTest(files: string[], live: boolean): Promise<number> {
  if (files.length === 0) return Promise.resolve(0)
  const child = spawn(process.execPath, ['test', '--timeout', '120000', ...options, ...files], {
    cwd: REPO,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, [NODE_BUILD_DONE]: '1' },
  })
  running.add(child)
  const kept: Array<[NodeJS.WriteStream, Buffer]> = []
  for (const [from, to] of [
    [child.stdout!, process.stdout],
    [child.stderr!, process.stderr],
  ] as const) {
    let rest = ''
    from.on('data', (b: Buffer) => {
      if (live) to.write(b)
      else kept.push([to, b])
      const lines = (rest + b.toString('utf8')).split('\n')
      rest = lines.pop()!
      for (const l of lines) {
        const m = /^\s*(\d+) (pass|fail)$/.exec(l)
        if (m) totals[m[2] as 'pass' | 'fail'] += Number(m[1])
      }
    })
  }
  return new Promise((resolve) =>
    child.once('close', (code, signal) => {
      running.delete(child)
      for (const [to, b] of kept) to.write(b)
      resolve(code ?? (signal ? 128 : 1))
    }),
  )
}

// A stop of the run (Ctrl-C, a CI timeout) reaches every bun test, which ends its files; the daemons are stopped after.
for (const sig of ['SIGINT', 'SIGTERM'] as const)
  process.on(sig, () => {
    for (const c of running) c.kill(sig)
  })

const t0 = Date.now()
await ensureLibvirt()
await ensureNodeBuild()
const lanes = await Promise.all([bunTest(guest, true), bunTest(other, false)])
const serialStatus = await bunTest(serial, true)
await stopLibvirt()
const status = [...lanes, serialStatus].find((s) => s !== 0) ?? 0
console.error(
  `\nwhole run in ${((Date.now() - t0) / 60_000).toFixed(1)} min (${guest.length} guest files beside ${other.length} others, then ${serial.length} alone):\n ${totals.pass} pass\n ${totals.fail} fail`,
)
process.exit(status)
