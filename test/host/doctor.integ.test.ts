/**
 * The pre-flight checks (lib/host/doctor.ts), each seen passing and failing on real directories,
 * files and tools: temp dirs with wrong modes, tmpfs file systems of chosen sizes, binaries
 * removed from the search path. Test doubles, named as such, stand in where the real thing
 * cannot run here: `zfs-test-double` (no ZFS on this machine) and `qemu-kvm-test-double` (KVM
 * cannot run a guest on this nested host, so the "KVM usable" answer needs a qemu that exits 0).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { chmodSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import {
  accessChecks,
  binaryChecks,
  bridgeCheck,
  domainTypeCheck,
  freeSpaceCheck,
  goShimCheck,
  importRootCheck,
  isoCheck,
  keyFileCheck,
  libvirtCheck,
  probeKvm,
  runDoctor,
  zfsPoolCheck,
  type Check,
  type DoctorSettings,
} from '../../lib/host/doctor.ts'
import { qemuCanReach, readQemuUser } from '../../lib/host/qemu-access.ts'
import { loadConfig } from '../../runtime/config.ts'
import { doctorSettings } from '../../runtime/preflight.ts'
import { ensureLibvirt } from '../helpers/libvirt.ts'
import { tempDir } from '../helpers/tmp.ts'

const t = tempDir('i13-doctor-')
const root = t.dir
const bin = path.join(root, 'bin')
const mounts: string[] = []

function tmpfs(dir: string, size: string): string {
  mkdirSync(dir, { recursive: true })
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${size},mode=0711`, 'tmpfs', dir])
  mounts.push(dir)
  return dir
}

function exe(file: string, body: string): string {
  writeFileSync(file, `#!/bin/sh\n${body}\n`, { mode: 0o755 })
  return file
}

/** Settings over `root` that pass every check, changed by `over`. */
function settings(over: Partial<DoctorSettings> = {}): DoctorSettings {
  return {
    sink: 'file',
    zfsPool: 'tank',
    volumesDir: path.join(root, 'ok', 'volumes'),
    logsDir: path.join(root, 'ok', 'logs'),
    keyFile: path.join(root, 'ok', 'keyring', 'migrator.key'),
    importRoot: path.join(root, 'ok', 'imports'),
    libvirtUri: 'qemu:///system',
    domainType: 'qemu',
    defaultBridge: null,
    v2vBinary: 'virt-v2v-in-place',
    fullImportBinary: 'virt-v2v',
    virtioWinIso: path.join(root, 'virtio-win.iso'),
    qemuConf: path.join(root, 'qemu.conf'),
    skipGoShim: { variable: 'MIGRATOR_MIGRATOR_SKIP_GO_SHIM', value: null },
    searchPath: bin,
    zfsBinary: path.join(bin, 'zfs'),
    netDir: path.join(root, 'net'),
    // libvirt on this shared machine can be slow to answer while other suites run domains.
    libvirtTimeoutMs: 120_000,
    ...over,
  }
}

/** The check `id` on `settings(over)` (run alone: libvirt and the KVM probe only when asked for). */
async function check(id: string, over: Partial<DoctorSettings> = {}): Promise<Check> {
  const s = settings(over)
  const family = id.split(':')[0]
  const all: Array<Check | null> =
    family === 'binary'
      ? binaryChecks(s)
      : family === 'qemu-access' || id === 'dynamic-ownership'
        ? await accessChecks(s)
        : id === 'virtio-win-iso'
          ? [isoCheck(s)]
          : id === 'zfs-pool'
            ? [await zfsPoolCheck(s)]
            : id === 'libvirt'
              ? [await libvirtCheck(s)]
              : id === 'domain-type'
                ? [await domainTypeCheck(s)]
                : id === 'key-file'
                  ? [keyFileCheck(s)]
                  : id === 'import-root'
                    ? [importRootCheck(s)]
                    : id === 'free-space'
                      ? [freeSpaceCheck(s)]
                      : id === 'default-bridge'
                        ? [bridgeCheck(s)]
                        : [goShimCheck(s)]
  const c = all.find((x) => x?.id === id)
  if (!c) throw new Error(`no check ${id}`)
  if (c.status !== 'ok') expect(c.fix).toBeTruthy()
  return c
}

beforeAll(async () => {
  await ensureLibvirt()
  chmodSync(root, 0o711)
  mkdirSync(bin)
  // The real tools, linked into a private search path so each can be taken away.
  for (const b of ['blkdiscard', 'qemu-img', 'qemu-nbd', 'virt-v2v-in-place', 'virt-v2v'])
    symlinkSync(execFileSync('sh', ['-c', `command -v ${b}`], { encoding: 'utf8' }).trim(), path.join(bin, b))
  // zfs-test-double: `zfs list -H -p -o name,avail <pool>` answers for pool "tank" only.
  exe(
    path.join(bin, 'zfs'),
    `for last in "$@"; do :; done\n[ "$last" = tank ] || { echo "cannot open '$last': dataset does not exist" >&2; exit 1; }\nprintf 'tank\\t%s\\n' "\${ZFS_AVAIL:-107374182400}"`,
  )
  writeFileSync(path.join(root, 'virtio-win.iso'), 'iso')
  writeFileSync(path.join(root, 'qemu.conf'), '# test\nuser = "libvirt-qemu"\ngroup = "libvirt-qemu"\n')
  mkdirSync(path.join(root, 'net', 'br-i13'), { recursive: true })
  mkdirSync(path.join(root, 'ok', 'keyring'), { recursive: true, mode: 0o700 })
  writeFileSync(path.join(root, 'ok', 'keyring', 'migrator.key'), Buffer.alloc(32, 7), { mode: 0o600 })
  mkdirSync(path.join(root, 'ok', 'imports'), { mode: 0o750 })
  chmodSync(path.join(root, 'ok', 'imports'), 0o750)
  tmpfs(path.join(root, 'ok', 'volumes'), '20g')
  mkdirSync(path.join(root, 'ok', 'logs'), { mode: 0o711 })
  chmodSync(path.join(root, 'ok'), 0o711)
})

afterAll(() => {
  for (const m of mounts.reverse()) execFileSync('umount', [m])
  t.cleanup()
})

describe('pre-flight checks', () => {
  test('a fit host: no check fails (all of them, through runDoctor)', async () => {
    const report = await runDoctor(settings())
    expect(report.checks.filter((c) => c.status === 'fail')).toEqual([])
    expect(report.status).not.toBe('fail')
    expect(report.checks.map((c) => c.id)).toEqual(
      expect.arrayContaining([
        'binary:zfs',
        'binary:blkdiscard',
        'binary:virt-v2v-in-place',
        'binary:virt-v2v',
        'binary:qemu-img',
        'virtio-win-iso',
        'libvirt',
        'domain-type',
        'qemu-access:volumes',
        'qemu-access:logs',
        'key-file',
        'import-root',
        'free-space',
        'go-shim',
      ]),
    )
    for (const c of report.checks) expect(c.found.length).toBeGreaterThan(0)
  }, 150_000)

  test('host binaries: found on the search path, or named with their package when missing', async () => {
    expect((await check('binary:qemu-img')).status).toBe('ok')
    const missing = await check('binary:qemu-img', { searchPath: path.join(root, 'empty') })
    expect(missing).toMatchObject({ status: 'fail', fix: expect.stringContaining('qemu-utils') })
    // V2V tools are needed only for some guests: missing is a warning.
    expect((await check('binary:virt-v2v-in-place', { searchPath: path.join(root, 'empty') })).status).toBe('warn')
    // zfs and blkdiscard: a warning with the file sink, a failure with the zvol sink.
    expect((await check('binary:zfs', { zfsBinary: path.join(root, 'nowhere', 'zfs') })).status).toBe('warn')
    expect((await check('binary:zfs', { sink: 'zvol', zfsBinary: path.join(root, 'nowhere', 'zfs') })).status).toBe('fail')
    expect((await check('binary:blkdiscard', { sink: 'zvol', searchPath: path.join(root, 'empty') })).status).toBe('fail')
    expect((await check('binary:zfs', { sink: 'zvol' })).status).toBe('ok')
  }, 60_000)

  test('the virtio-win ISO', async () => {
    expect((await check('virtio-win-iso')).status).toBe('ok')
    expect((await check('virtio-win-iso', { virtioWinIso: path.join(root, 'none.iso') })).status).toBe('warn')
  }, 30_000)

  test('the zvol pool (zfs-test-double): present with room, absent', async () => {
    expect(await check('zfs-pool', { sink: 'zvol' })).toMatchObject({ status: 'ok', found: expect.stringContaining('100.0 GiB') })
    expect((await check('zfs-pool', { sink: 'zvol', zfsPool: 'missing' })).status).toBe('fail')
    expect(await zfsPoolCheck(settings())).toBeNull()
  }, 30_000)

  test('libvirt reachable, or not', async () => {
    expect((await check('libvirt')).status).toBe('ok')
    const down = await check('libvirt', { libvirtUri: `qemu+unix:///system?socket=${root}/no-such-socket` })
    expect(down).toMatchObject({ status: 'fail', fix: expect.stringContaining('libvirtd') })
  }, 150_000)

  test('domain type: the KVM probe against the configured type', async () => {
    // The real probe: some machines of this kind have a /dev/kvm on which qemu aborts creating a
    // KVM vCPU (DESIGN.md), others a working one; both settings must agree with what it found.
    const real = await probeKvm()
    if (real.usable) {
      expect((await check('domain-type', { domainType: 'kvm' })).status).toBe('ok')
      expect(await check('domain-type', { domainType: 'qemu' })).toMatchObject({ status: 'warn', fix: expect.stringContaining('MIGRATOR_DOMAIN_TYPE=kvm') })
    } else {
      expect(await check('domain-type', { domainType: 'kvm' })).toMatchObject({ status: 'fail', fix: expect.stringContaining('MIGRATOR_DOMAIN_TYPE=qemu') })
      expect(await check('domain-type', { domainType: 'qemu' })).toMatchObject({ status: 'ok', found: expect.stringContaining('TCG only') })
    }
    // kvm-device-stand-in: a file standing in for /dev/kvm, so the probe goes on to the qemu test
    // doubles below on any host, with or without a /dev/kvm of its own.
    const kvmDevice = path.join(root, 'kvm-device-stand-in')
    writeFileSync(kvmDevice, '')
    // qemu-kvm-broken-test-double: a qemu that aborts creating a KVM vCPU, i.e. a host where only TCG works.
    const kvmBroken = exe(
      path.join(root, 'qemu-kvm-broken-test-double'),
      'cat >/dev/null; echo "qemu-system-x86_64: failed to initialize kvm: Operation not supported" >&2; exit 1',
    )
    expect(await check('domain-type', { domainType: 'kvm', qemuBinary: kvmBroken, kvmDevice })).toMatchObject({
      status: 'fail',
      found: expect.stringContaining('failed to initialize kvm'),
      fix: expect.stringContaining('MIGRATOR_DOMAIN_TYPE=qemu'),
    })
    expect(await check('domain-type', { domainType: 'qemu', qemuBinary: kvmBroken, kvmDevice })).toMatchObject({
      status: 'ok',
      found: expect.stringContaining('TCG only'),
    })
    // qemu-kvm-test-double: a qemu that starts and quits cleanly, i.e. a host where KVM works.
    const kvmOk = exe(path.join(root, 'qemu-kvm-test-double'), 'cat >/dev/null; exit 0')
    expect((await check('domain-type', { domainType: 'kvm', qemuBinary: kvmOk, kvmDevice })).status).toBe('ok')
    expect(await check('domain-type', { domainType: 'qemu', qemuBinary: kvmOk, kvmDevice })).toMatchObject({
      status: 'warn',
      fix: expect.stringContaining('MIGRATOR_DOMAIN_TYPE=kvm'),
    })
    // No device: the probe answers from its absence, without starting qemu (kvmOk would say usable).
    expect(await check('domain-type', { domainType: 'kvm', qemuBinary: kvmOk, kvmDevice: path.join(root, 'no-kvm-device') })).toMatchObject({
      status: 'fail',
      found: expect.stringContaining(`${path.join(root, 'no-kvm-device')} does not exist`),
      fix: expect.stringContaining('MIGRATOR_DOMAIN_TYPE=qemu'),
    })
  }, 60_000)

  test("the qemu user's access: a 0700 directory on the way fails, naming it and the fix", async () => {
    const blocked = path.join(root, 'private')
    mkdirSync(path.join(blocked, 'data', 'volumes'), { recursive: true })
    chmodSync(blocked, 0o700)
    const c = await check('qemu-access:volumes', { volumesDir: path.join(blocked, 'data', 'volumes') })
    expect(c.status).toBe('fail')
    expect(c.found).toContain(`cannot search ${blocked},`)
    expect(c.fix).toContain(`chmod o+x ${blocked}`)
    expect((await check('qemu-access:logs', { logsDir: path.join(blocked, 'data', 'logs') })).status).toBe('warn')
    expect((await check('qemu-access:volumes')).status).toBe('ok')
    expect((await check('qemu-access:logs')).status).toBe('ok')
    // The kernel's answer, not a guess from the mode bits: an ACL entry for the user opens the way.
    execFileSync('setfacl', ['-m', 'u:libvirt-qemu:x', blocked])
    expect((await check('qemu-access:volumes', { volumesDir: path.join(blocked, 'data', 'volumes') })).status).toBe('ok')
    // The zvol sink has no volume directory.
    expect((await check('qemu-access:volumes', { sink: 'zvol', volumesDir: path.join(root, 'nowhere') })).status).toBe('ok')
  }, 60_000)

  test('qemu.conf: an unknown user, dynamic_ownership off', async () => {
    const conf = path.join(root, 'qemu-bad.conf')
    writeFileSync(conf, 'user = "i13-no-such-user"\n')
    expect((await check('qemu-access:volumes', { qemuConf: conf })).status).toBe('fail')
    writeFileSync(conf, 'dynamic_ownership = 0\n')
    expect(await readQemuUser(conf)).toMatchObject({ user: 'libvirt-qemu', dynamicOwnership: false })
    expect((await check('dynamic-ownership', { qemuConf: conf })).status).toBe('fail')
    expect((await check('dynamic-ownership')).status).toBe('ok')
  }, 30_000)

  test('qemu.conf: numeric ids (+N) resolve without a name; uidKnown says whether the user database has the uid', async () => {
    const conf = path.join(root, 'qemu-ids.conf')
    writeFileSync(conf, 'user = "+0"\ngroup = "+0"\n')
    expect(await readQemuUser(conf)).toMatchObject({ uid: 0, gid: 0, uidKnown: true })
    writeFileSync(conf, 'user = "+59999"\ngroup = "+59999"\n')
    expect(await readQemuUser(conf)).toMatchObject({ uid: 59999, gid: 59999, uidKnown: false })
    writeFileSync(conf, 'user = "root"\n')
    expect(await readQemuUser(conf)).toMatchObject({ user: 'root', uid: 0, uidKnown: true })
  }, 30_000)

  test('the key file: 32 bytes 0600, else a failure', async () => {
    expect((await check('key-file')).status).toBe('ok')
    const dir = path.join(root, 'keys')
    mkdirSync(dir)
    writeFileSync(path.join(dir, 'open.key'), Buffer.alloc(32), { mode: 0o644 })
    writeFileSync(path.join(dir, 'short.key'), Buffer.alloc(31), { mode: 0o600 })
    expect(await check('key-file', { keyFile: path.join(dir, 'open.key') })).toMatchObject({ status: 'fail', fix: expect.stringContaining('chmod 0600') })
    expect(await check('key-file', { keyFile: path.join(dir, 'short.key') })).toMatchObject({ status: 'fail', found: expect.stringContaining('31 bytes') })
  }, 30_000)

  test('the import root: 0750 owned by the daemon, a warning for other modes, a failure when world-writable', async () => {
    expect((await check('import-root')).status).toBe('ok')
    const loose = path.join(root, 'imports-755')
    const open = path.join(root, 'imports-777')
    mkdirSync(loose)
    mkdirSync(open)
    chmodSync(loose, 0o755)
    chmodSync(open, 0o777)
    expect((await check('import-root', { importRoot: loose })).status).toBe('warn')
    expect((await check('import-root', { importRoot: open })).status).toBe('fail')
  }, 30_000)

  test('free space at the destination (tmpfs file systems of 20 GiB and 64 MiB)', async () => {
    expect((await check('free-space')).status).toBe('ok')
    const small = tmpfs(path.join(root, 'small'), '64m')
    const c = await check('free-space', { volumesDir: path.join(small, 'volumes') })
    expect(c.status).toBe('fail')
    expect(c.found).toMatch(/^0\.1 GiB free/)
    // zvol: the pool's space (zfs-test-double answering 512 MiB).
    process.env.ZFS_AVAIL = String(512 * 1024 * 1024)
    try {
      expect((await check('zfs-pool', { sink: 'zvol' })).status).toBe('fail')
    } finally {
      delete process.env.ZFS_AVAIL
    }
  }, 30_000)

  test('the default bridge, when set', async () => {
    expect((await check('default-bridge', { defaultBridge: 'br-i13' })).status).toBe('ok')
    expect((await check('default-bridge', { defaultBridge: 'br-i13-none' })).status).toBe('fail')
  }, 30_000)

  test('<APPLIANCE>_MIGRATOR_SKIP_GO_SHIM is accepted and reported', async () => {
    const cfg = loadConfig({ MIGRATOR_DATA_DIR: path.join(root, 'ok'), MIGRATOR_APPLIANCE: 'hostd', HOSTD_MIGRATOR_SKIP_GO_SHIM: '1' })
    expect(cfg.skipGoShim).toEqual({ variable: 'HOSTD_MIGRATOR_SKIP_GO_SHIM', value: '1' })
    const c = await check('go-shim', { skipGoShim: cfg.skipGoShim })
    expect(c).toMatchObject({ status: 'ok', found: expect.stringContaining('HOSTD_MIGRATOR_SKIP_GO_SHIM="1" is accepted') })
    expect((await check('go-shim')).found).toContain('MIGRATOR_MIGRATOR_SKIP_GO_SHIM is unset')
  }, 30_000)

  test('defaults: as root the data lives in /var/lib/<appliance>, otherwise in ./var', () => {
    expect(loadConfig({ MIGRATOR_APPLIANCE: 'hostd' }).dataDir).toBe(process.getuid!() === 0 ? '/var/lib/hostd' : path.resolve('var'))
    expect(doctorSettings(loadConfig({ MIGRATOR_APPLIANCE: 'hostd' })).keyFile).toBe(
      process.getuid!() === 0 ? '/var/lib/hostd/keyring/migrator.key' : path.resolve('var/keyring/migrator.key'),
    )
  })

  test('reachability without changing user (not root): judged from modes, and says so', async () => {
    const qemu = await readQemuUser(path.join(root, 'qemu.conf'))
    const r = await qemuCanReach(path.join(root, 'ok', 'volumes'), qemu)
    expect(r).toEqual({ ok: true, blockedAt: null, method: process.getuid!() === 0 ? 'as-user' : 'modes' })
  })
})
