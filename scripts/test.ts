/**
 * The whole test suite (`npm test`): `bun test` over every file, two files at a time
 * (`--parallel=2`, slowest first by `test/timings.json`), then the `*.serial.integ.test.ts` files
 * one after another with nothing beside them (they stop or restart what every file shares, such
 * as libvirtd). What files running side by side share is set up once around the run: libvirtd and
 * virtlogd started when not running (and stopped after, only those started here), and the Node
 * build of the server in dist/ compiled once.
 *
 * Arguments go on to `bun test` (path filters, `--bail`, ...); a path filter picks from both
 * phases. The last lines are the whole run's counts, as `bun test` prints them (` N pass`,
 * ` N fail`). Exits with the first failing phase's status.
 */
import { spawn } from 'node:child_process'
import * as path from 'node:path'
import { ensureLibvirt, stopLibvirt } from '../test/helpers/libvirt.ts'
import { ensureNodeBuild, NODE_BUILD_DONE } from '../test/helpers/server.ts'

const REPO = path.resolve(import.meta.dir, '..')
const SERIAL = '.serial.integ.test.ts'

const args = process.argv.slice(2)
// bun test's positional arguments are path filters: a file runs when its path contains one.
const filters = args.filter((a) => !a.startsWith('-'))
const files = [...new Bun.Glob('test/**/*.test.ts').scanSync({ cwd: REPO })]
const picked = files.filter((f) => filters.length === 0 || filters.some((x) => f.includes(x)))
const serial = picked.filter((f) => f.endsWith(SERIAL)).sort()
const parallel = picked.filter((f) => !f.endsWith(SERIAL))

const totals = { pass: 0, fail: 0 }
let current: ReturnType<typeof spawn> | null = null

/** Runs `bun test argv`, its output passed through and its ` N pass` / ` N fail` lines added up. */
function bunTest(argv: string[]): Promise<number> {
  const child = spawn(process.execPath, ['test', '--timeout', '120000', ...argv], {
    cwd: REPO,
    stdio: ['inherit', 'pipe', 'pipe'],
    env: { ...process.env, [NODE_BUILD_DONE]: '1' },
  })
  current = child
  for (const [from, to] of [
    [child.stdout!, process.stdout],
    [child.stderr!, process.stderr],
  ] as const) {
    let rest = ''
    from.on('data', (b: Buffer) => {
      to.write(b)
      const lines = (rest + b.toString('utf8')).split('\n')
      rest = lines.pop()!
      for (const l of lines) {
        const m = /^\s*(\d+) (pass|fail)$/.exec(l)
        if (m) totals[m[2] as 'pass' | 'fail'] += Number(m[1])
      }
    })
  }
  return new Promise((resolve) => child.once('close', (code, signal) => resolve(code ?? (signal ? 128 : 1))))
}

// A stop of the run (Ctrl-C, a CI timeout) reaches bun test, which ends its files; the daemons are stopped after.
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => current?.kill(sig))

await ensureLibvirt()
await ensureNodeBuild()
let status = 0
if (parallel.length > 0) {
  status = await bunTest(['--parallel=2', `--timings=${path.join(REPO, 'test/timings.json')}`, `--path-ignore-patterns=**/*${SERIAL}`, ...args])
}
if (serial.length > 0) {
  const opts = args.filter((a) => a.startsWith('-'))
  const s = await bunTest([...opts, ...serial])
  if (status === 0) status = s
}
await stopLibvirt()
console.error(`\nwhole run (${parallel.length} files side by side, ${serial.length} alone):\n ${totals.pass} pass\n ${totals.fail} fail`)
process.exit(status)
