/**
 * Pre-flight checks of the host (`GET /doctor`, `migrator doctor`, and the server's start-up
 * log): is this machine fit to run migrations with these settings? Each check answers what it
 * found and, when not ok, the operator's fix. Nothing here changes the host.
 *
 * Checks (ids): the host dependencies of spec 1.5 (`binary:<name>`, `virtio-win-iso`,
 * `zfs-pool` for the zvol sink), `libvirt` (reachable), `domain-type` (KVM usable or TCG only,
 * against the configured type), `qemu-access:volumes|nvram|logs` (the qemu user's access),
 * `dynamic-ownership`, `key-file` (size and mode), `import-root` (mode and owner),
 * `free-space` (at the destination), `default-bridge` (when set), `go-shim` (spec 1.5's
 * `<APPLIANCE>_MIGRATOR_SKIP_GO_SHIM`: accepted and reported; there is no shim), `api-socket` and
 * `api-tcp` (how the API is reachable and by whom: the socket's owner, group and mode; the TCP
 * listener and its credential).
 */
import { execFileSync } from 'node:child_process'
import { accessSync, constants as C, existsSync, lstatSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { exec } from '../exec.ts'
import { freeBytesOn } from './fs-space.ts'
import { qemuCanReach, reachFix, readQemuUser } from './qemu-access.ts'

/** One check's result. `fix` is null when there is nothing to do. */
export interface Check {
  id: string
  status: 'ok' | 'warn' | 'fail'
  found: string
  fix: string | null
}

/** The report: every check, and the worst status among them. */
export interface DoctorReport {
  status: Check['status']
  checks: Check[]
}

/** What the checks look at (the server's configuration and data paths). Paths absolute. */
export interface DoctorSettings {
  sink: 'file' | 'zvol'
  zfsPool: string
  volumesDir: string
  logsDir: string
  /** libvirt's NVRAM directory for UEFI guests (default `/var/lib/libvirt/qemu/nvram`). */
  nvramDir?: string
  keyFile: string
  importRoot: string
  libvirtUri: string
  domainType: 'kvm' | 'qemu'
  defaultBridge: string | null
  v2vBinary: string
  fullImportBinary: string
  virtioWinIso: string
  qemuConf: string
  skipGoShim: { variable: string; value: string | null }
  /** The API's unix socket (`MIGRATOR_SOCKET`; null: none; absent: not reported). */
  apiSocket?: { path: string; group: string } | null
  /** The TCP listener (`MIGRATOR_LISTEN`; null: none), its token file and whether Basic credentials are configured. */
  apiTcp?: { listen: { host: string; port: number } | null; tokenFile: string; basicAuth: boolean }
  /** The `PATH` binaries are looked up in (default `process.env.PATH`). */
  searchPath?: string
  /** `zfs` binary (default `zfs` from the search path; tests pass a test double). */
  zfsBinary?: string
  /** Where network interfaces are listed (default `/sys/class/net`). */
  netDir?: string
  /** How long `virsh version` may take before libvirt counts as not answering, ms (default 15 000). */
  libvirtTimeoutMs?: number
  /** qemu binary of the KVM probe (default `qemu-system-x86_64`; tests pass a test double). */
  qemuBinary?: string
  /** The KVM device the probe looks for first (default `/dev/kvm`; tests pass a stand-in path). */
  kvmDevice?: string
}

const GiB = 1024 ** 3

/** Free space below this at the destination fails the check; below {@link WARN_FREE} warns (bytes). */
export const FAIL_FREE = 1 * GiB
export const WARN_FREE = 10 * GiB

/** The executable `name` resolves to in `searchPath` (a name with a `/` is taken as a path), or null. */
export function findBinary(name: string, searchPath = process.env.PATH ?? ''): string | null {
  const candidates = name.includes('/')
    ? [name]
    : searchPath
        .split(':')
        .filter(Boolean)
        .map((d) => path.join(d, name))
  for (const c of candidates) {
    try {
      if (statSync(c).isFile()) {
        accessSync(c, C.X_OK)
        return c
      }
    } catch {}
  }
  return null
}

/** Bytes of stdout and stderr {@link run} keeps, the last ones. */
const OUTPUT_TAIL = 16384

/**
 * Runs `cmd args` (no shell, through `lib/exec.ts`) with `input` on stdin; resolves with its exit
 * code (a signal's name when killed, -1 when it cannot start) and the last 16 KiB of stdout and
 * stderr. Killed (SIGKILL) after `timeoutMs` (default 15 s).
 */
export async function run(
  cmd: string,
  args: string[],
  opts: { input?: string; timeoutMs?: number } = {},
): Promise<{ code: number | string; stdout: string; stderr: string }> {
  const r = await exec(cmd, args, { input: opts.input ?? '', timeoutMs: opts.timeoutMs ?? 15_000, stderrTail: OUTPUT_TAIL })
  const stdout = r.stdout.slice(-OUTPUT_TAIL)
  if (r.spawnError) return { code: -1, stdout, stderr: r.stderr }
  return { code: r.code ?? r.signal ?? -1, stdout, stderr: r.stderr }
}

const gib = (n: number) => `${(n / GiB).toFixed(1)} GiB`
const octal = (m: number) => `0${(m & 0o777).toString(8)}`
const lastLine = (s: string) => s.trim().split('\n').filter(Boolean).pop()?.slice(0, 300) ?? ''

/** `binary:<name>`: each host binary of spec 1.5 (and qemu-nbd) on the search path. */
export function binaryChecks(s: DoctorSettings): Check[] {
  const zvol = s.sink === 'zvol'
  const list: Array<[string, string, 'fail' | 'warn', string]> = [
    ['zfs', s.zfsBinary ?? 'zfs', zvol ? 'fail' : 'warn', zvol ? 'the zvol sink creates volumes with it' : 'needed only by the zvol sink (MIGRATOR_SINK=zvol)'],
    ['blkdiscard', 'blkdiscard', zvol ? 'fail' : 'warn', zvol ? 'the zvol sink discards zero runs with it' : 'needed only by the zvol sink'],
    ['qemu-img', 'qemu-img', 'fail', 'inspects and reads disk images'],
    ['qemu-nbd', 'qemu-nbd', 'fail', 'serves qcow2, VHDX, VHD, VDI and sparse VMDK disks to the copy'],
    ['virt-v2v-in-place', s.v2vBinary, 'warn', 'injects virtio drivers into Windows guests, converts Linux guests that no emulated controller can boot'],
    ['virt-v2v', s.fullImportBinary, 'warn', 'imports Hyper-V (vmcx_export) VMs'],
  ]
  const pkg: Record<string, string> = {
    zfs: 'zfsutils-linux',
    blkdiscard: 'util-linux',
    'qemu-img': 'qemu-utils',
    'qemu-nbd': 'qemu-utils',
    'virt-v2v-in-place': 'virt-v2v',
    'virt-v2v': 'virt-v2v',
  }
  return list.map(([id, bin, severity, why]) => {
    const at = findBinary(bin, s.searchPath)
    return at
      ? { id: `binary:${id}`, status: 'ok', found: `${at} (${why})`, fix: null }
      : {
          id: `binary:${id}`,
          status: severity,
          found: `${bin} not found on PATH (${why})`,
          fix: `apt-get install ${pkg[id]}${bin !== id ? `, or point the variable at it (now ${bin})` : ''}`,
        }
  })
}

/** `virtio-win-iso`: the driver ISO of Windows V2V. */
export function isoCheck(s: DoctorSettings): Check {
  if (existsSync(s.virtioWinIso)) return { id: 'virtio-win-iso', status: 'ok', found: `${s.virtioWinIso} (${gib(statSync(s.virtioWinIso).size)})`, fix: null }
  return {
    id: 'virtio-win-iso',
    status: 'warn',
    found: `${s.virtioWinIso} is missing: Windows guests would get no virtio drivers (Linux guests are not affected)`,
    fix: 'install the virtio-win ISO (https://fedorapeople.org/groups/virt/virtio-win/direct-downloads/) at that path, or set MIGRATOR_VIRTIO_WIN_ISO',
  }
}

/** `zfs-pool` (zvol sink only; null otherwise): the pool exists and its available space. */
export async function zfsPoolCheck(s: DoctorSettings): Promise<Check | null> {
  if (s.sink !== 'zvol') return null
  const r = await run(s.zfsBinary ?? 'zfs', ['list', '-H', '-p', '-o', 'name,avail', s.zfsPool])
  const [name, avail] = r.stdout.trim().split('\t')
  if (r.code === 0 && name === s.zfsPool && /^\d+$/.test(avail ?? '')) {
    const free = Number(avail)
    const status = free < FAIL_FREE ? 'fail' : free < WARN_FREE ? 'warn' : 'ok'
    return {
      id: 'zfs-pool',
      status,
      found: `pool ${s.zfsPool}: ${gib(free)} available`,
      fix: status === 'ok' ? null : `free space in ${s.zfsPool} or choose another pool (MIGRATOR_ZFS_POOL, plan destination.pool)`,
    }
  }
  return {
    id: 'zfs-pool',
    status: 'fail',
    found: `pool ${s.zfsPool} is not usable: ${lastLine(r.stderr) || `zfs exited ${r.code}`}`,
    fix: `create or import the pool (zpool import ${s.zfsPool}), or set MIGRATOR_ZFS_POOL to an existing pool`,
  }
}

/** `libvirt`: `virsh version` answers on the configured URI. */
export async function libvirtCheck(s: DoctorSettings): Promise<Check> {
  const r = await run('virsh', ['-c', s.libvirtUri, 'version'], { timeoutMs: s.libvirtTimeoutMs ?? 15_000 })
  if (r.code === 0) {
    const lib = /Using library: libvirt (\S+)/.exec(r.stdout)?.[1]
    const hv = /Running hypervisor: (.+)/.exec(r.stdout)?.[1]
    return { id: 'libvirt', status: 'ok', found: `${s.libvirtUri}: libvirt ${lib ?? '?'}, ${hv ?? 'hypervisor ?'}`, fix: null }
  }
  return {
    id: 'libvirt',
    status: 'fail',
    found: `${s.libvirtUri} does not answer: ${lastLine(r.stderr) || `virsh exited ${r.code}`}`,
    fix: 'start libvirtd and virtlogd (systemctl start libvirtd virtlogd), or set MIGRATOR_LIBVIRT_URI',
  }
}

/**
 * Whether KVM can run a guest CPU like the domains' (`host` model): qemu is started with KVM,
 * paused (`-S`), and told to quit over QMP. Creating the vCPU is where nested hosts fail (qemu
 * aborts setting MSRs), so a clean exit means KVM works; `kvmDevice` (default `/dev/kvm`)
 * existing is not enough, but its absence answers without starting qemu.
 */
export async function probeKvm(qemuBinary = 'qemu-system-x86_64', kvmDevice = '/dev/kvm'): Promise<{ usable: boolean; why: string }> {
  if (!existsSync(kvmDevice)) return { usable: false, why: `${kvmDevice} does not exist` }
  const r = await run(qemuBinary, ['-accel', 'kvm', '-cpu', 'host', '-machine', 'q35', '-m', '16', '-nodefaults', '-display', 'none', '-S', '-qmp', 'stdio'], {
    input: '{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n',
    timeoutMs: 20_000,
  })
  if (r.code === 0) return { usable: true, why: 'qemu started a paused KVM guest with the host CPU model and quit cleanly' }
  return { usable: false, why: `qemu with KVM failed (${typeof r.code === 'number' ? `exit ${r.code}` : r.code}): ${lastLine(r.stderr)}` }
}

/** `domain-type`: the KVM probe against `MIGRATOR_DOMAIN_TYPE`. */
export async function domainTypeCheck(s: DoctorSettings): Promise<Check> {
  const kvm = await probeKvm(s.qemuBinary, s.kvmDevice)
  if (s.domainType === 'kvm') {
    return kvm.usable
      ? { id: 'domain-type', status: 'ok', found: `KVM usable: ${kvm.why}; domains run with type kvm`, fix: null }
      : {
          id: 'domain-type',
          status: 'fail',
          found: `MIGRATOR_DOMAIN_TYPE is kvm but KVM is not usable here: ${kvm.why}; only TCG works`,
          fix: 'set MIGRATOR_DOMAIN_TYPE=qemu (TCG, slow), or enable (nested) virtualization for this host',
        }
  }
  return kvm.usable
    ? {
        id: 'domain-type',
        status: 'warn',
        found: `domains run under TCG (MIGRATOR_DOMAIN_TYPE=qemu) although KVM is usable: ${kvm.why}`,
        fix: 'set MIGRATOR_DOMAIN_TYPE=kvm (or leave it unset) for guests at native speed',
      }
    : { id: 'domain-type', status: 'ok', found: `TCG only (${kvm.why}); domains run with type qemu`, fix: null }
}

/** `qemu-access:volumes|nvram|logs` and `dynamic-ownership` for the qemu user read from `s.qemuConf`. */
export async function accessChecks(s: DoctorSettings): Promise<Check[]> {
  const qemu = await readQemuUser(s.qemuConf)
  const who = `${qemu.user}:${qemu.group}${qemu.source ? ` (${qemu.source})` : ' (defaults; no qemu.conf)'}`
  const out: Check[] = []
  if (qemu.uid === null || qemu.gid === null) {
    out.push({
      id: 'qemu-access:volumes',
      status: 'fail',
      found: `qemu runs as ${who}, which does not resolve on this host`,
      fix: `create the user and group, or fix user/group in ${s.qemuConf}`,
    })
    return out
  }
  const dirs: Array<[string, string, 'fail' | 'warn', string]> = [
    ['volumes', s.sink === 'zvol' ? '' : s.volumesDir, 'fail', 'qemu opens the file sink images there'],
    ['nvram', s.nvramDir ?? '/var/lib/libvirt/qemu/nvram', 'warn', 'qemu opens UEFI guests NVRAM files there'],
    ['logs', s.logsDir, 'warn', 'serial logs: libvirt opens them and passes qemu the descriptor, so this matters only to a libvirt that lets qemu open them'],
  ]
  for (const [id, dir, severity, why] of dirs) {
    if (!dir) {
      out.push({ id: `qemu-access:${id}`, status: 'ok', found: 'the zvol sink: volumes are /dev/zvol block devices libvirt labels for qemu', fix: null })
      continue
    }
    const r = await qemuCanReach(dir, qemu)
    const how =
      r.method === 'as-user'
        ? `checked as ${qemu.user} with setpriv`
        : r.method === 'root'
          ? 'qemu runs as root'
          : 'judged from modes and owners (not root: ACLs not read)'
    out.push(
      r.ok
        ? {
            id: `qemu-access:${id}`,
            status: r.method === 'modes' ? 'warn' : 'ok',
            found: `${qemu.user} can reach ${dir} (${how}; ${why})`,
            fix: r.method === 'modes' ? 'run the doctor as root to check as the qemu user' : null,
          }
        : {
            id: `qemu-access:${id}`,
            status: severity,
            found: `${qemu.user} cannot search ${r.blockedAt}, so it cannot reach ${dir} (${how}; ${why})`,
            fix: reachFix(r.blockedAt!, qemu),
          },
    )
  }
  if (s.sink === 'file') {
    out.push(
      qemu.dynamicOwnership || qemu.uid === 0
        ? { id: 'dynamic-ownership', status: 'ok', found: `libvirt hands each image to ${qemu.user} (dynamic_ownership)`, fix: null }
        : {
            id: 'dynamic-ownership',
            status: 'fail',
            found: `dynamic_ownership = 0 in ${s.qemuConf}: images stay root-owned 0640 and ${qemu.user} cannot open them`,
            fix: `set dynamic_ownership = 1 in ${s.qemuConf} and restart libvirtd`,
          },
    )
  }
  return out
}

/** `key-file`: 32 bytes, no group/other permission. */
export function keyFileCheck(s: DoctorSettings): Check {
  const id = 'key-file'
  if (!existsSync(s.keyFile))
    return { id, status: 'warn', found: `${s.keyFile} does not exist yet`, fix: 'start the server once: it creates a 32-byte key, mode 0600' }
  const st = statSync(s.keyFile)
  const problems: string[] = []
  if (!st.isFile()) problems.push('not a regular file')
  if (st.size !== 32) problems.push(`${st.size} bytes instead of 32`)
  if (st.mode & 0o077) problems.push(`mode ${octal(st.mode)} gives group/other access`)
  if (problems.length === 0) return { id, status: 'ok', found: `${s.keyFile}: 32 bytes, mode ${octal(st.mode)}`, fix: null }
  return {
    id,
    status: 'fail',
    found: `${s.keyFile}: ${problems.join(', ')} (the server refuses to start)`,
    fix: st.size !== 32 ? `restore the original key from a backup (a new key cannot open the sealed source passwords)` : `chmod 0600 ${s.keyFile}`,
  }
}

/** `import-root`: mode 0750, owned by the daemon user (spec 1.5). */
export function importRootCheck(s: DoctorSettings): Check {
  const id = 'import-root'
  if (!existsSync(s.importRoot))
    return { id, status: 'warn', found: `${s.importRoot} does not exist yet`, fix: 'start the server once: it creates it, mode 0750' }
  const st = statSync(s.importRoot)
  if (!st.isDirectory()) return { id, status: 'fail', found: `${s.importRoot} is not a directory`, fix: `move it away, or set MIGRATOR_IMPORT_ROOT` }
  const uid = process.getuid?.() ?? st.uid
  const mode = st.mode & 0o777
  if (mode & 0o002)
    return { id, status: 'fail', found: `${s.importRoot}: mode ${octal(mode)} is world-writable: anyone may place exports`, fix: `chmod 0750 ${s.importRoot}` }
  const problems: string[] = []
  if (mode !== 0o750) problems.push(`mode ${octal(mode)} (spec 1.5: 0750)`)
  if (st.uid !== uid) problems.push(`owner uid ${st.uid}, not the daemon's (${uid})`)
  if (problems.length === 0) return { id, status: 'ok', found: `${s.importRoot}: mode 0750, owned by uid ${uid}`, fix: null }
  return { id, status: 'warn', found: `${s.importRoot}: ${problems.join(', ')}`, fix: `chown ${uid} ${s.importRoot} && chmod 0750 ${s.importRoot}` }
}

/** `free-space` (file sink; null for zvol, see `zfs-pool`): free bytes where the volumes go. */
export function freeSpaceCheck(s: DoctorSettings): Check | null {
  if (s.sink === 'zvol') return null // zfs-pool reports the pool's space
  const free = freeBytesOn(s.volumesDir)
  const status = free < FAIL_FREE ? 'fail' : free < WARN_FREE ? 'warn' : 'ok'
  return {
    id: 'free-space',
    status,
    found: `${gib(free)} free for ${s.volumesDir} (a job needs its disks' capacity free)`,
    fix: status === 'ok' ? null : `free space on that file system, or set MIGRATOR_DATA_DIR to a larger one`,
  }
}

/** `default-bridge` (when `MIGRATOR_DEFAULT_BRIDGE` is set): the interface exists. */
export function bridgeCheck(s: DoctorSettings): Check | null {
  if (!s.defaultBridge) return null
  const ok = existsSync(path.join(s.netDir ?? '/sys/class/net', s.defaultBridge))
  return ok
    ? { id: 'default-bridge', status: 'ok', found: `${s.defaultBridge} exists`, fix: null }
    : {
        id: 'default-bridge',
        status: 'fail',
        found: `MIGRATOR_DEFAULT_BRIDGE=${s.defaultBridge}: no such interface`,
        fix: `create the bridge (ip link add ${s.defaultBridge} type bridge), or unset MIGRATOR_DEFAULT_BRIDGE for user-mode networking`,
      }
}

/** `go-shim`: spec 1.5's variable, accepted and reported (always ok: there is no shim). */
export function goShimCheck(s: DoctorSettings): Check {
  const v = s.skipGoShim
  return {
    id: 'go-shim',
    status: 'ok',
    found: `${v.variable}${v.value === null ? ' is unset' : `=${JSON.stringify(v.value)} is accepted`}: there is no Go shim to build or probe (vim_api speaks the vSphere API natively)`,
    fix: null,
  }
}

function groupName(gid: number): string {
  try {
    return execFileSync('getent', ['group', String(gid)], { encoding: 'utf8' }).split(':')[0] || String(gid)
  } catch {
    return String(gid)
  }
}

/** `api-socket`: who can connect to the unix socket (its owner, group and mode, and its directory's). */
export function apiSocketCheck(s: DoctorSettings): Check | null {
  if (s.apiSocket === undefined) return null
  const id = 'api-socket'
  if (s.apiSocket === null) return { id, status: 'ok', found: 'no unix socket (MIGRATOR_SOCKET=none): the API is reached over TCP only', fix: null }
  const p = s.apiSocket.path
  let st: ReturnType<typeof lstatSync>
  try {
    st = lstatSync(p)
  } catch {
    return { id, status: 'ok', found: `${p} is not there: the server creates it at start (owner root, group ${s.apiSocket.group}, mode 0660)`, fix: null }
  }
  if (!st.isSocket())
    return { id, status: 'fail', found: `${p} is not a socket: the server cannot start on it`, fix: `remove ${p}, or set MIGRATOR_SOCKET to another path` }
  const mode = st.mode & 0o777
  const dir = path.dirname(p)
  const dirMode = statSync(dir).mode & 0o7777
  const who = `${p}: owner uid ${st.uid}, group ${groupName(st.gid)}, mode ${octal(mode)}`
  if ((mode & 0o006) !== 0)
    return { id, status: 'fail', found: `${who}: every local user can reach the API`, fix: `chmod 0660 ${p} (the server makes it so at start)` }
  if ((dirMode & 0o002) !== 0 && (dirMode & 0o1000) === 0) {
    return { id, status: 'fail', found: `${who}, in ${dir} of mode ${octal(dirMode)}: anyone may replace the socket`, fix: `chmod 0750 ${dir}` }
  }
  return { id, status: 'ok', found: `${who}: root and the members of ${groupName(st.gid)} reach the API; other users get permission denied`, fix: null }
}

/** `api-tcp`: the TCP listener, when there is one, and the credential it requires. */
export function apiTcpCheck(s: DoctorSettings): Check | null {
  if (s.apiTcp === undefined) return null
  const id = 'api-tcp'
  const { listen, tokenFile, basicAuth } = s.apiTcp
  if (listen === null) return { id, status: 'ok', found: 'no TCP listener (MIGRATOR_LISTEN unset): only the unix socket', fix: null }
  const at = `${listen.host.includes(':') ? `[${listen.host}]` : listen.host}:${listen.port}`
  const basic = basicAuth ? ' or the MIGRATOR_BASIC_AUTH credentials' : ''
  if (!existsSync(tokenFile))
    return { id, status: 'ok', found: `${at}: every request needs a credential${basic}; the API token ${tokenFile} is made at the first start`, fix: null }
  const mode = statSync(tokenFile).mode & 0o777
  if ((mode & 0o077) !== 0) return { id, status: 'fail', found: `${at}: the API token ${tokenFile} has mode ${octal(mode)}`, fix: `chmod 600 ${tokenFile}` }
  return {
    id,
    status: 'ok',
    found: `${at}: every request needs the token of ${tokenFile} (mode ${octal(mode)}, root only)${basic} or a console session; others get 401`,
    fix: null,
  }
}

/** Runs every check (the slow ones, libvirt and the KVM probe, concurrently). Never throws. */
export async function runDoctor(s: DoctorSettings): Promise<DoctorReport> {
  const guard = (id: string, f: () => Check | null): Check | null => {
    try {
      return f()
    } catch (e) {
      return { id, status: 'fail', found: `the check failed: ${(e as Error).message}`, fix: 'see the server log' }
    }
  }
  const [pool, libvirt, domainType, access] = await Promise.all([zfsPoolCheck(s), libvirtCheck(s), domainTypeCheck(s), accessChecks(s)])
  const checks = [
    ...binaryChecks(s),
    guard('virtio-win-iso', () => isoCheck(s)),
    pool,
    libvirt,
    domainType,
    ...access,
    guard('key-file', () => keyFileCheck(s)),
    guard('import-root', () => importRootCheck(s)),
    guard('free-space', () => freeSpaceCheck(s)),
    guard('default-bridge', () => bridgeCheck(s)),
    goShimCheck(s),
    guard('api-socket', () => apiSocketCheck(s)),
    guard('api-tcp', () => apiTcpCheck(s)),
  ].filter((c): c is Check => c !== null)
  const status = checks.some((c) => c.status === 'fail') ? 'fail' : checks.some((c) => c.status === 'warn') ? 'warn' : 'ok'
  return { status, checks }
}
