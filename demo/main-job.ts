/**
 * The main job, end to end, on the embedded defaults (README "Two commands"):
 *
 *  1. makes sure `virtlogd` and `libvirtd` run (starts them as daemons when they do not: a fresh
 *     Debian container has no systemd);
 *  2. starts the migrator (Bun, `runtime/serve-bun.ts`) on its defaults: data in
 *     `/var/lib/migrator` (as root; `MIGRATOR_DATA_DIR` and the other variables apply), the API
 *     on the unix socket `/run/migrator/api.sock` (root only; with `MIGRATOR_LISTEN`, over TCP
 *     with the API token of the data directory instead), and prints the pre-flight checks that are not ok (`GET /doctor`);
 *  3. creates a sample export in the import root: a real Debian 12 guest (fixtures/guest-image.ts,
 *     built once with debootstrap and cached; minutes on the first run) whose initramfs was built
 *     host-only on VMware PVSCSI (no virtio drivers), exported as VMware would: a VMX folder
 *     `imports/demo/demo-vm/` with a PVSCSI controller, a monolithicSparse VMDK and a vmxnet3
 *     NIC. When the guest cannot be built (no root, no Debian mirror), it falls back to a 64 MiB
 *     disk whose hand-written boot sector prints a marker, as an OVA, and says so;
 *  4. submits the plan over HTTP and prints the live progress from the SSE stream;
 *  5. ends by showing the hardware the migrator chose (job `hardware`), the domain running
 *     (`virsh list`) and the end of its serial console: the guest's marker after local-fs.target
 *     and its login prompt.
 *
 * No MIGRATOR_BOOT_SERIAL_PATTERN: the boot check decides from evidence. The domain type is `qemu`
 * (TCG) unless `MIGRATOR_DOMAIN_TYPE` says otherwise (KVM needs a working /dev/kvm, which nested
 * VMs often lack). The domain (named `MIGRATOR_DEMO_NAME`, default `demo-vm`) is left running; the last lines say how to remove it.
 * Run as root: `npm run demo` (which first runs `.ci/install`).
 */
import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync } from 'node:fs'
import * as path from 'node:path'
import { Api } from '../cli/api.ts'
import { readToken } from '../lib/auth/api-token.ts'
import { dataPaths, loadConfig } from '../runtime/config.ts'
import { bytes } from '../cli/output.ts'
import { makeBootDisk } from '../fixtures/bootdisk.ts'
import { GUEST_MARKER, guestImages, guestImagesCached } from '../fixtures/guest-image.ts'
import { buildInput } from '../fixtures/inputs.ts'

const REPO = path.resolve(import.meta.dir, '..')
const MARKER = 'MIGRATOR-DEMO: hello from the migrated guest'
// The server's own defaults (runtime/config.ts): as root, /var/lib/<appliance>, reachable by qemu
// wherever the checkout is (a home directory is 0700).
const config = loadConfig()
const dataDir = config.dataDir
const importRoot = config.importRoot
// The socket by default; TCP only when MIGRATOR_LISTEN asks for it (then the token authenticates).
const listen = config.socket ? `the unix socket ${config.socket.path}` : `${config.listen!.host}:${config.listen!.port}`
const base = config.socket ? `http://localhost${config.basePath}` : `http://${config.listen!.host}:${config.listen!.port}${config.basePath}`
const vmName = process.env.MIGRATOR_DEMO_NAME || 'demo-vm'
const virsh = (...args: string[]) => spawnSync('virsh', ['-c', 'qemu:///system', ...args], { encoding: 'utf8' })
const say = (s: string) => console.log(`\n== ${s}`)

function alive(pidFile: string): boolean {
  try {
    process.kill(Number(readFileSync(pidFile, 'utf8').trim()), 0)
    return true
  } catch {
    return false
  }
}

async function ensureLibvirt(): Promise<void> {
  for (const [name, pidFile] of [
    ['virtlogd', '/run/virtlogd.pid'],
    ['libvirtd', '/run/libvirtd.pid'],
  ]) {
    if (alive(pidFile) || virsh('version').status === 0) continue
    console.log(`starting ${name}`)
    const r = spawnSync(`/usr/sbin/${name}`, ['--daemon'], { encoding: 'utf8' })
    if (r.status !== 0) throw new Error(`${name} --daemon failed: ${r.stderr}`)
  }
  for (let i = 0; i < 80; i++) {
    if (virsh('version').status === 0) return
    await Bun.sleep(250)
  }
  throw new Error('libvirt does not answer on qemu:///system')
}

if (process.getuid?.() !== 0) {
  console.error('the demo defines a libvirt domain on qemu:///system: run it as root')
  process.exit(1)
}

say('libvirt')
await ensureLibvirt()
console.log(virsh('version').stdout.trim())

say(`migrator: data in ${dataDir}, listening on ${listen}`)
const server = spawn(path.join(REPO, 'node_modules/.bin/bun'), ['runtime/serve-bun.ts'], {
  cwd: REPO,
  env: {
    ...process.env,
    MIGRATOR_DATA_DIR: dataDir,
    MIGRATOR_DOMAIN_TYPE: process.env.MIGRATOR_DOMAIN_TYPE || 'qemu',
    // A real guest under TCG on a busy 2-core host can take minutes to reach its login prompt.
    MIGRATOR_BOOT_TIMEOUT_SECONDS: process.env.MIGRATOR_BOOT_TIMEOUT_SECONDS || '900',
    // Errors only: the pre-flight warnings are printed below, readable.
    MIGRATOR_LOG_LEVEL: process.env.MIGRATOR_LOG_LEVEL || 'error',
  },
  stdio: ['ignore', 'inherit', 'inherit'],
})
let exitCode = 1
try {
  // over TCP the token file appears once the server started: read it on every try
  const connect = () =>
    config.socket
      ? new Api({ baseUrl: base, socketPath: config.socket.path })
      : new Api({ baseUrl: base, token: readToken(dataPaths(config).tokenFile) ?? undefined })
  let api = connect()
  for (let i = 0; ; i++) {
    api = connect()
    if (server.exitCode !== null) throw new Error(`the migrator exited with ${server.exitCode}`)
    if (
      await api.call('GET', '/migrations').then(
        () => true,
        () => false,
      )
    )
      break
    if (i > 150) throw new Error('the migrator did not answer in 30 s')
    await Bun.sleep(200)
  }

  say('pre-flight checks (GET /doctor; all of them: migrator doctor)')
  const report = await api.call('GET', '/doctor')
  for (const c of report.checks.filter((x: any) => x.status !== 'ok'))
    console.log(`  ${c.status.toUpperCase().padEnd(4)} ${c.id}: ${c.found}\n       fix: ${c.fix}`)
  console.log(`  ${report.checks.length} checks, overall ${report.status}`)

  const work = path.join(dataDir, 'demo-work')
  mkdirSync(work, { recursive: true })
  let kind = 'vmx_folder'
  let rel = 'demo/demo-vm'
  let marker = GUEST_MARKER
  say('sample export: a real Debian 12 guest, host-only initramfs built on VMware PVSCSI (no virtio), as a VMX folder (PVSCSI, monolithicSparse VMDK, vmxnet3)')
  try {
    if (!guestImagesCached()) console.log('building the guest images once (debootstrap from the Debian mirror; a few minutes; cached for later runs and tests)')
    const t0 = Date.now()
    const images = guestImages()
    console.log(`guest image ${images.pvscsi.path} ready in ${((Date.now() - t0) / 1000).toFixed(1)} s`)
    if (!existsSync(path.join(importRoot, rel)))
      buildInput('vmx_folder', path.join(importRoot, 'demo'), 'demo-vm', [images.pvscsi.path], {}, { controller: 'pvscsi' })
  } catch (e) {
    console.log(`the real guest could not be built (${(e as Error).message.split('\n')[0]}):`)
    console.log('FALLBACK: a 64 MiB disk whose boot sector prints a marker, as an OVA (streamOptimized VMDK); its boot cannot be verified')
    kind = 'ova_archive'
    rel = 'demo/demo-vm.ova'
    marker = MARKER
    const disk = makeBootDisk(path.join(work, 'demo-vm-disk.raw'), MARKER, 64 * 1024 * 1024)
    if (!existsSync(path.join(importRoot, rel))) {
      mkdirSync(path.join(importRoot, 'demo'), { recursive: true })
      buildInput('ova_archive', path.join(importRoot, 'demo'), 'demo-vm', [disk.path])
    }
  }
  console.log(`${path.join(importRoot, rel)}`)

  say('inspect')
  const manifest = await api.call('POST', '/host-files/inspect', { path: rel, kind })
  const m = manifest.manifest ?? manifest
  console.log(
    `${m.name}: ${m.disks.length} disk(s), ${bytes(m.disks[0].capacity_bytes)}, ${m.cpu.count} vCPU, ${bytes(m.memory_bytes)} memory, firmware ${m.firmware}, guest ${m.guest_os.family}`,
  )

  say('submit the plan, then live progress (SSE /migrations/stream)')
  const plan = { source: { Offline: kind }, source_ref: { kind: 'offline_host_path', path: rel }, mode: 'Cold', name: vmName }
  console.log(JSON.stringify(plan))
  let job: any = null
  let final: any = null
  // Subscribed first, submitted once the stream is open: no state change can be missed.
  await api.follow(
    null,
    (event, data) => {
      if (!job || data.id !== job.id) return
      const p = data.progress
      if (event === 'progress') {
        console.log(
          `  ${data.state.padEnd(12)} ${bytes(p.bytes_done).padStart(10)} / ${bytes(p.bytes_total)}  (${bytes(p.bytes_zero)} zero, skipped)  ${bytes(p.rate_bytes_per_s)}/s  eta ${p.eta_s ?? '-'} s`,
        )
      } else if (event === 'migration') {
        console.log(
          `  state: ${data.state.padEnd(12)} ${bytes(p.bytes_done)} / ${bytes(p.bytes_total)} copied${data.last_error ? `  ${data.last_error.code}: ${data.last_error.message}` : ''}`,
        )
        if (['completed', 'failed', 'cancelled'].includes(data.status)) {
          final = data
          return true
        }
      }
    },
    {
      onOpen: async () => {
        if (job) return
        job = await api.call('POST', '/migrations', { plan })
        console.log(`job ${job.id} submitted`)
      },
    },
  )
  if (final?.state !== 'Completed') throw new Error(`the job ended ${final?.state}`)

  say('hardware chosen from the inspection of the guest (job.hardware)')
  console.log(JSON.stringify(final.hardware, null, 2))
  if (final.last_error) console.log(`notice: ${final.last_error.code}: ${final.last_error.message}`)

  say('the domain on this host')
  console.log(virsh('list', '--all').stdout.trim())
  const domain =
    virsh('list', '--name')
      .stdout.split('\n')
      .map((s) => s.trim())
      .filter((n) => n.startsWith(vmName))
      .pop() ?? vmName
  say(`serial console of ${domain} (${path.join(dataDir, 'logs', `${job.id}.serial.log`)})`)
  const serial = readFileSync(path.join(dataDir, 'logs', `${job.id}.serial.log`), 'utf8')
    .replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '')
    .trim()
    .split(/\r?\n/)
  console.log(`... (${serial.length} lines; the last 6, and the marker)`)
  console.log(serial.slice(-6).join('\n'))
  console.log(serial.find((l) => l.includes(marker)) ?? `(marker ${marker} not found)`)
  console.log(`\nDone. Remove the demo domain with: virsh destroy ${domain} && virsh undefine ${domain}`)
  exitCode = 0
} catch (e) {
  console.error(`demo failed: ${(e as Error).message}`)
} finally {
  server.kill('SIGTERM')
  await new Promise((r) => server.once('exit', r))
  process.exit(exitCode)
}
