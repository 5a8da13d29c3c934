/**
 * The whole test suite (`npm test`): `bun test` over every file, two files at a time
 * (`--parallel=2`, slowest first by `test/timings.json`), with what files running side by side
 * must share set up once around the run: libvirtd and virtlogd started when not running (and
 * stopped after, only those started here), and the Node build of the server in dist/ compiled
 * once. Arguments are passed on to `bun test` (a path filter, `--bail`, ...). Exits with its status.
 */
import { spawn } from 'node:child_process'
import * as path from 'node:path'
import { ensureLibvirt, stopLibvirt } from '../test/helpers/libvirt.ts'
import { ensureNodeBuild, NODE_BUILD_DONE } from '../test/helpers/server.ts'

const REPO = path.resolve(import.meta.dir, '..')

await ensureLibvirt()
await ensureNodeBuild()
const child = spawn(
  process.execPath,
  ['test', '--timeout', '120000', '--parallel=2', `--timings=${path.join(REPO, 'test/timings.json')}`, ...process.argv.slice(2)],
  { cwd: REPO, stdio: 'inherit', env: { ...process.env, [NODE_BUILD_DONE]: '1' } },
)
// A stop of the run (Ctrl-C, a CI timeout) reaches bun test, which ends its files; the daemons are stopped after.
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => child.kill(sig))
const status = await new Promise<number>((resolve) => child.once('exit', (code, signal) => resolve(code ?? (signal ? 128 : 1))))
await stopLibvirt()
process.exit(status)
