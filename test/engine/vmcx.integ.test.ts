/**
 * The VMCX passthrough through the HTTP API (spec 1.1 `run_full_import`): a Hyper-V
 * export (the corpus `test.vmcx` in `Virtual Machines/`, a VHDX in `Virtual Hard Disks/`) is
 * imported whole by virt-v2v into the destination volume, then started.
 *
 * - With the REAL virt-v2v: the disk holds a boot sector, no operating system, so virt-v2v's
 *   inspection refuses it: the job ends E_MIG_V2V_FAILED with virt-v2v's reason, no domain.
 * - With `virt-v2v-test-double` (a TEST DOUBLE of virt-v2v, a shell script: converting a real
 *   guest needs an OS image this machine cannot have): it writes each source disk, converted with
 *   qemu-img, to the output path virt-v2v would use (a link to the volume) and prints virt-v2v's
 *   status lines; the job goes CopyingFull -> Starting -> Completed and the domain boots the
 *   disk, whose marker appears on the serial console. No V2vProcessing: virt-v2v converted it.
 */
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { buildVmcxExport, fileSha256 } from '../helpers/inputs.ts'
import { bootCheckEnv, offlinePlan, openStream, streamSaw, submit, volumePath, waitJob } from '../helpers/jobs.ts'
import { cleanupDomains, domainsWithPrefix, ensureLibvirt, tearDownJobs } from '../helpers/libvirt.ts'
import { startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const PREFIX = 'migvmcx-'
const MARKER = 'MIGRATOR-VMCX-BOOT-2718'
const MiB = 1024 * 1024

describe('vmcx_export passthrough (virt-v2v) through the HTTP API', () => {
  const t = tempDir('mig-vmcx-job-')
  const importRoot = path.join(t.dir, 'imports')
  const double = path.join(t.dir, 'virt-v2v-test-double')
  /** The source paths the double was given, one a line (it appends them). */
  const sourcesLog = path.join(t.dir, 'double-sources.txt')
  let boot = ''

  beforeAll(async () => {
    chmodSync(t.dir, 0o755)
    mkdirSync(importRoot, { recursive: true })
    boot = makeBootDisk(path.join(t.dir, 'boot.raw'), MARKER, 16 * MiB).path
    buildVmcxExport(importRoot, 'hv', boot)
    writeFileSync(
      double,
      `#!/bin/bash
# TEST DOUBLE of virt-v2v 2.2 (not the real tool): writes each source disk of the -i libvirtxml
# input, converted to raw with qemu-img, to <-os>/<-on>-sd<a..> as virt-v2v -o local does.
set -eu
os='' name='' xml=''
while [ $# -gt 0 ]; do
  case "$1" in -os) os="$2"; shift 2;; -on) name="$2"; shift 2;; -i|-o|-of|-oa|--root) shift 2;; --*) shift;; *) xml="$1"; shift;; esac
done
echo '{ "message": "Inspecting the source", "type": "message" }'
mapfile -t srcs < <(grep -o '<source file="[^"]*"' "$xml" | sed 's/^<source file="//; s/"$//')
mapfile -t fmts < <(grep -o '<driver name="qemu" type="[^"]*"' "$xml" | sed 's/.*type="//; s/"$//')
printf '%s\n' "\${srcs[@]}" >> '${sourcesLog}'
letters=(a b c d e f g h)
for i in "\${!srcs[@]}"; do
  echo "{ \\"message\\": \\"Copying disk $((i + 1))/\${#srcs[@]}\\", \\"type\\": \\"message\\" }"
  qemu-img convert -f "\${fmts[$i]}" -O raw "\${srcs[$i]}" "$os/$name-sd\${letters[$i]}"
  echo "(100.00/100%)"
done
`,
      { mode: 0o755 },
    )
    await ensureLibvirt()
    await cleanupDomains(PREFIX)
  }, 60_000)

  afterEach(async () => {
    await cleanupDomains(PREFIX)
  })

  afterAll(() => tearDownJobs(PREFIX, t))

  async function server(dir: string, env: Record<string, string>): Promise<RunningServer> {
    mkdirSync(dir, { recursive: true })
    chmodSync(dir, 0o755)
    return startServer('bun', dir, {
      MIGRATOR_IMPORT_ROOT: importRoot,
      ...bootCheckEnv(MARKER),
      ...env,
    })
  }

  test('virt-v2v-test-double: CopyingFull -> Starting -> Completed, the volume holds the VHDX bit-exact, the domain boots it', async () => {
    const dir = path.join(t.dir, 'ok')
    const srv = await server(dir, { MIGRATOR_V2V_FULL_IMPORT_BINARY: double })
    try {
      const stream = openStream(srv.base)
      await stream.ready
      const job = await submit(srv.base, offlinePlan('vmcx_export', 'hv', { name: `${PREFIX}ok`, guest_os: 'windows' }))
      expect(job.strategy).toBe('passthrough')
      const done = await waitJob(srv.base, job.id)
      await streamSaw(stream, job.id, 'Completed')
      stream.close()
      expect([done.state, done.last_error, done.domain]).toEqual(['Completed', null, `${PREFIX}ok`])
      const states = stream.events.filter((e) => e.event === 'migration' && e.data.id === job.id).map((e) => e.data.state)
      expect(states).toEqual(['Queued', 'CopyingFull', 'Starting', 'Completed'])
      expect(done.progress.bytes_done).toBe(done.progress.bytes_total)
      expect(fileSha256(volumePath(dir, job.id, done.progress.disks[0].label))).toBe(fileSha256(boot))
      expect(readFileSync(path.join(dir, 'logs', `${job.id}.serial.log`), 'utf8')).toContain(MARKER)
      // Open once: virt-v2v got the worker's pinned descriptor, never the file's name.
      const given = readFileSync(sourcesLog, 'utf8').trim().split('\n')
      expect(given.length).toBe(1)
      expect(given[0]).toMatch(/^\/proc\/\d+\/fd\/\d+$/)
    } finally {
      await srv.stop()
      rmSync(dir, { recursive: true, force: true })
    }
  }, 120_000)

  test('the real virt-v2v refuses a disk without an operating system: E_MIG_V2V_FAILED with its reason, no domain', async () => {
    const dir = path.join(t.dir, 'real')
    const srv = await server(dir, {})
    try {
      const job = await submit(srv.base, offlinePlan('vmcx_export', 'hv', { name: `${PREFIX}real` }))
      const done = await waitJob(srv.base, job.id, undefined, 110_000)
      expect([done.state, done.last_error.code]).toEqual(['Failed', 'E_MIG_V2V_FAILED'])
      expect(done.last_error.message).toMatch(/inspection could not detect the source guest|no root device found/i)
      expect(await domainsWithPrefix(PREFIX)).toEqual([])
    } finally {
      await srv.stop()
      rmSync(dir, { recursive: true, force: true })
    }
  }, 120_000)
})
