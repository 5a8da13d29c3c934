/**
 * V2vPreparer (lib/v2v/preparer.ts) against a test double of virt-v2v-in-place, named as such:
 * `virt-v2v-in-place-test-double`, a bash script that records its argv and environment, prints
 * virt-v2v 2.2 machine-readable output (JSON messages, `N/M` progress) and exits 0 or 1 (or hangs).
 * The snapshot is a file copy of the volume, so rollback is checked byte for byte.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import { V2vPreparer, type V2vSnapshot, type V2vVolume } from '../../lib/v2v/preparer.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'
import { disk, manifest } from '../domain/fixtures.ts'

const tmp = tempDir('mig-v2v-test-')
afterAll(() => tmp.cleanup())

const BIN_DIR = path.join(tmp.dir, 'bin')
mkdirSync(BIN_DIR)
const DOUBLE = path.join(BIN_DIR, 'virt-v2v-in-place-test-double')
writeFileSync(
  DOUBLE,
  `#!/bin/bash
# Test double of virt-v2v-in-place (NOT the real tool).
rec="$V2V_DOUBLE_RECORD"
printf '%s\\n' "$@" > "$rec/argv"
env > "$rec/env"
if [ -n "$VIRT_V2V_TMPDIR" ] && [ -d "$VIRT_V2V_TMPDIR" ]; then echo yes > "$rec/tmpdir-existed"; fi
for a in "$@"; do case "$a" in *.xml) cp "$a" "$rec/input.xml";; esac; done
echo '{ "message": "Setting up the source: -i disk x", "timestamp": "2026-01-01T00:00:00+00:00", "type": "message" }'
echo '[   0.0] Setting up the source: -i disk x'
echo 0/100
echo 50/100
echo '{ "message": "virtio-win driver for \\"balloon\\" not found", "timestamp": "2026-01-01T00:00:01+00:00", "type": "warning" }'
case "$V2V_DOUBLE_MODE" in
  ok) echo 100/100; echo '[  12.5] Finishing off'; exit 0;;
  fail)
    printf 'CORRUPTED-BY-V2V' | dd of="$V2V_DOUBLE_CORRUPT" bs=1 seek=0 conv=notrunc 2>/dev/null
    echo '{ "message": "inspection could not detect the source guest (or physical machine).\\n\\nNo root device found in this operating system image.", "timestamp": "2026-01-01T00:00:02+00:00", "type": "error" }'
    echo 'virt-v2v-in-place: error: inspection could not detect the source guest' >&2
    echo '' >&2
    echo 'If reporting bugs, run virt-v2v-in-place with debugging enabled and include the complete output:' >&2
    echo '  virt-v2v-in-place -v -x [...]' >&2
    exit 1;;
  stderr-only) echo 'libguestfs: error: appliance closed the connection' >&2; exit 3;;
  hang) sleep 60 & echo $! > "$rec/child"; wait;;
esac
`,
  { mode: 0o755 },
)
const ISO = path.join(tmp.dir, 'virtio-win.iso')
writeFileSync(ISO, 'not really an ISO')

let seq = 0
/** A fresh recording directory, a boot disk volume, and a file-copy snapshot that logs its calls. */
function setup(opts: { failRollback?: boolean; failTake?: boolean } = {}) {
  const dir = path.join(tmp.dir, `case${seq++}`)
  mkdirSync(dir)
  const vol = path.join(dir, 'C.img')
  makeBootDisk(vol, 'WIN-DISK', 4 << 20)
  const calls: string[] = []
  const snapshot: V2vSnapshot = {
    async take() {
      calls.push('take')
      if (opts.failTake) throw new Error('zfs snapshot: out of space')
      copyFileSync(vol, `${vol}.snap`)
    },
    async rollback() {
      calls.push('rollback')
      if (opts.failRollback) throw new Error('zfs rollback: dataset is busy')
      copyFileSync(`${vol}.snap`, vol)
    },
    async release() {
      calls.push('release')
      rmSync(`${vol}.snap`, { force: true })
    },
  }
  return { dir, vol, calls, snapshot, sha: () => createHash('sha256').update(readFileSync(vol)).digest('hex') }
}

function preparer(dir: string, mode: string, extra: Record<string, string> = {}, binary = DOUBLE, iso = ISO) {
  return new V2vPreparer({
    virtioWinIso: iso,
    binary,
    env: { V2V_DOUBLE_RECORD: dir, V2V_DOUBLE_MODE: mode, LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg', ...extra },
  })
}

/** True while `pid` is a live process (a zombie waiting for its reaper counts as dead). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return !/^[ZX]$/.test(stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3))
  } catch {
    return false
  }
}

/** Waits up to 2 s for `pid` to die. */
async function gone(pid: number): Promise<boolean> {
  for (let i = 0; i < 100 && alive(pid); i++) await Bun.sleep(20)
  return !alive(pid)
}

const WIN = manifest({ name: 'win2019', guest_os: { family: 'windows', id: 'windows2019srv_64Guest' } })

describe('V2vPreparer.command', () => {
  test('one volume: -i disk with the exact argv and environment', () => {
    const p = new V2vPreparer({ env: { LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' } })
    const c = p.command([{ label: 'C', path: '/dev/zvol/tank/vm/migrations/j1/C' }], WIN, '/var/tmp/mig-v2v-abc')
    expect(c.argv).toEqual(['virt-v2v-in-place', '-i', 'disk', '-if', 'raw', '--root', 'first', '--machine-readable', '/dev/zvol/tank/vm/migrations/j1/C'])
    expect(c.env).toEqual({
      PATH: process.env.PATH || '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
      HOME: process.env.HOME || '/root',
      LC_ALL: 'C',
      VIRTIO_WIN: '/usr/share/virtio-win/virtio-win.iso',
      LIBGUESTFS_BACKEND: 'direct',
      VIRT_V2V_TMPDIR: '/var/tmp/mig-v2v-abc',
      LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg',
    })
    expect(c.inputXml).toBeNull()
  })

  test('several volumes: -i libvirtxml with a minimal XML listing the disks in order', () => {
    const m = manifest({
      name: 'win<&>"2019',
      firmware: 'efi',
      memory_bytes: 4 * 1024 ** 3,
      cpu: { count: 4, cores_per_socket: 2 },
      disks: [disk('C'), disk('D')],
    })
    const c = new V2vPreparer({ virtioWinIso: '/srv/iso/virtio-win-0.1.240.iso' }).command(
      [
        { label: 'C', path: '/dev/zvol/t/C' },
        { label: 'D', path: '/var/lib/mig/D.img' },
      ],
      m,
      '/var/tmp/w',
    )
    expect(c.argv).toEqual(['virt-v2v-in-place', '-i', 'libvirtxml', '--root', 'first', '--machine-readable', '/var/tmp/w/input.xml'])
    expect(c.inputXmlPath).toBe('/var/tmp/w/input.xml')
    expect(c.env.VIRTIO_WIN).toBe('/srv/iso/virtio-win-0.1.240.iso')
    expect(c.inputXml).toBe(`<domain type="kvm">
  <name>win_2019</name>
  <memory unit="KiB">4194304</memory>
  <vcpu>4</vcpu>
  <os>
    <type arch="x86_64">hvm</type>
    <loader readonly="yes" type="pflash">/usr/share/OVMF/OVMF_CODE_4M.fd</loader>
  </os>
  <features>
    <acpi/>
    <apic/>
  </features>
  <devices>
    <disk type="block" device="disk">
      <driver name="qemu" type="raw"/>
      <source dev="/dev/zvol/t/C"/>
      <target dev="sda" bus="sata"/>
    </disk>
    <disk type="file" device="disk">
      <driver name="qemu" type="raw"/>
      <source file="/var/lib/mig/D.img"/>
      <target dev="sdb" bus="sata"/>
    </disk>
  </devices>
</domain>
`)
  })

  test('no volume or a relative path: E_MIG_V2V_FAILED', async () => {
    for (const vols of [[], [{ label: 'x', path: 'x.img' }]] as V2vVolume[][]) {
      const err = await thrown(() => new V2vPreparer().command(vols, WIN))
      expect(err).toBeInstanceOf(MigError)
      expect(err.code).toBe('E_MIG_V2V_FAILED')
    }
  })
})

describe('V2vPreparer.run with the test double', () => {
  test('success: runs the exact command, parses progress and messages, releases the snapshot', async () => {
    const s = setup()
    const before = s.sha()
    const progress: Array<number | string> = []
    const r = await preparer(s.dir, 'ok').run([{ label: 'C', path: s.vol }], WIN, {
      snapshot: s.snapshot,
      onProgress: (p) => progress.push(p.fraction ?? p.message!),
    })
    expect(readFileSync(path.join(s.dir, 'argv'), 'utf8').split('\n').slice(0, -1)).toEqual([
      '-i',
      'disk',
      '-if',
      'raw',
      '--root',
      'first',
      '--machine-readable',
      s.vol,
    ])
    const env = Object.fromEntries(
      readFileSync(path.join(s.dir, 'env'), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
    )
    expect(env.VIRTIO_WIN).toBe(ISO)
    expect(env.LIBGUESTFS_BACKEND).toBe('direct')
    expect(env.LIBGUESTFS_BACKEND_SETTINGS).toBe('force_tcg')
    expect(env.LC_ALL).toBe('C')
    expect(env.VIRT_V2V_TMPDIR).toMatch(/^\/var\/tmp\/mig-v2v-/)
    expect(readFileSync(path.join(s.dir, 'tmpdir-existed'), 'utf8')).toBe('yes\n')
    expect(existsSync(env.VIRT_V2V_TMPDIR!)).toBe(false) // removed afterwards
    expect(
      Object.keys(env)
        .filter((k) => !['PWD', 'SHLVL', '_'].includes(k))
        .sort(),
    ).toEqual([
      'HOME',
      'LC_ALL',
      'LIBGUESTFS_BACKEND',
      'LIBGUESTFS_BACKEND_SETTINGS',
      'PATH',
      'V2V_DOUBLE_MODE',
      'V2V_DOUBLE_RECORD',
      'VIRTIO_WIN',
      'VIRT_V2V_TMPDIR',
    ])
    expect(progress).toEqual(['Setting up the source: -i disk x', 0, 0.5, 'warning: virtio-win driver for "balloon" not found', 1, '[  12.5] Finishing off'])
    expect(r.lastFraction).toBe(1)
    expect(r.warnings).toEqual(['virtio-win driver for "balloon" not found'])
    expect(s.calls).toEqual(['take', 'release'])
    expect(s.sha()).toBe(before)
    expect(existsSync(`${s.vol}.snap`)).toBe(false)
  })

  test('binary looked up on PATH by name; several volumes get the libvirt XML input', async () => {
    const s = setup()
    const d2 = path.join(s.dir, 'D.img')
    makeBootDisk(d2, 'D', 1 << 20)
    const p = preparer(s.dir, 'ok', { PATH: `${BIN_DIR}:/usr/bin:/bin` }, 'virt-v2v-in-place-test-double')
    const m = manifest({ disks: [disk('C'), disk('D')] })
    await p.run(
      [
        { label: 'C', path: s.vol },
        { label: 'D', path: d2 },
      ],
      m,
      { snapshot: s.snapshot },
    )
    const argv = readFileSync(path.join(s.dir, 'argv'), 'utf8').split('\n').slice(0, -1)
    expect(argv.slice(0, 5)).toEqual(['-i', 'libvirtxml', '--root', 'first', '--machine-readable'])
    expect(argv[5]).toMatch(/^\/var\/tmp\/mig-v2v-[^/]+\/input\.xml$/)
    const xml = readFileSync(path.join(s.dir, 'input.xml'), 'utf8')
    expect(xml).toContain(`<source file="${s.vol}"/>`)
    expect(xml).toContain(`<source file="${d2}"/>`)
    expect(xml.indexOf(s.vol)).toBeLessThan(xml.indexOf(d2))
  })

  test('failure: the volume is rolled back and E_MIG_V2V_FAILED carries the tool error lines', async () => {
    const s = setup()
    const before = s.sha()
    const err = await thrown(() => preparer(s.dir, 'fail', { V2V_DOUBLE_CORRUPT: s.vol }).run([{ label: 'C', path: s.vol }], WIN, { snapshot: s.snapshot }))
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_V2V_FAILED')
    expect(err.message).toBe(
      `${DOUBLE} exited with status 1; volumes rolled back:\ninspection could not detect the source guest (or physical machine). No root device found in this operating system image.`,
    )
    expect(err.details).toEqual({
      exit_code: 1,
      signal: null,
      last_lines: ['inspection could not detect the source guest (or physical machine). No root device found in this operating system image.'],
      rolled_back: true,
    })
    expect(s.calls).toEqual(['take', 'rollback', 'release'])
    expect(s.sha()).toBe(before)
    expect(readFileSync(s.vol).subarray(0, 16).toString('latin1')).not.toBe('CORRUPTED-BY-V2V')
  })

  test('failure without JSON errors: the last stderr lines are reported', async () => {
    const s = setup()
    const err = await thrown(() => preparer(s.dir, 'stderr-only').run([{ label: 'C', path: s.vol }], WIN, { snapshot: s.snapshot }))
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_V2V_FAILED')
    expect(err.details.exit_code).toBe(3)
    expect(err.details.last_lines).toEqual(['libguestfs: error: appliance closed the connection'])
  })

  test('a failed rollback is reported', async () => {
    const s = setup({ failRollback: true })
    const err = await thrown(() => preparer(s.dir, 'fail', { V2V_DOUBLE_CORRUPT: s.vol }).run([{ label: 'C', path: s.vol }], WIN, { snapshot: s.snapshot }))
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_V2V_FAILED')
    expect(err.message).toContain('exited with status 1; ROLLBACK FAILED: zfs rollback: dataset is busy')
    expect(err.details.rolled_back).toBe(false)
  })

  test('missing ISO or binary or volume: E_MIG_V2V_FAILED naming it, nothing touched, tool never run', async () => {
    const cases: Array<[string, (s: ReturnType<typeof setup>) => V2vPreparer, (s: ReturnType<typeof setup>) => string]> = [
      [
        'iso',
        (s) => preparer(s.dir, 'fail', { V2V_DOUBLE_CORRUPT: s.vol }, DOUBLE, '/usr/share/virtio-win/absent.iso'),
        () => 'virtio-win driver ISO /usr/share/virtio-win/absent.iso not found or not readable',
      ],
      [
        'bin',
        (s) => preparer(s.dir, 'fail', { V2V_DOUBLE_CORRUPT: s.vol }, path.join(BIN_DIR, 'virt-v2v-in-place')),
        () => `${path.join(BIN_DIR, 'virt-v2v-in-place')} not found or not executable`,
      ],
      [
        'path',
        (s) => preparer(s.dir, 'fail', { V2V_DOUBLE_CORRUPT: s.vol, PATH: '/usr/bin:/bin' }, 'virt-v2v-in-place-test-double'),
        () => 'virt-v2v-in-place-test-double not found or not executable (PATH=/usr/bin:/bin)',
      ],
    ]
    for (const [, make, msg] of cases) {
      const s = setup()
      const before = s.sha()
      const err = await thrown(() => make(s).run([{ label: 'C', path: s.vol }], WIN, { snapshot: s.snapshot }))
      expect(err).toBeInstanceOf(MigError)
      expect(err.code).toBe('E_MIG_V2V_FAILED')
      expect(err.message).toContain(msg(s))
      expect(s.calls).toEqual([])
      expect(s.sha()).toBe(before)
      expect(existsSync(path.join(s.dir, 'argv'))).toBe(false)
    }
    const s = setup()
    const err = await thrown(() => preparer(s.dir, 'ok').run([{ label: 'C', path: path.join(s.dir, 'gone.img') }], WIN, { snapshot: s.snapshot }))
    expect(err.code).toBe('E_MIG_V2V_FAILED')
    expect(err.message).toContain('volume C')
    expect(s.calls).toEqual([])
  })

  test('snapshot failure: E_MIG_V2V_FAILED before the tool runs', async () => {
    const s = setup({ failTake: true })
    const err = await thrown(() => preparer(s.dir, 'ok').run([{ label: 'C', path: s.vol }], WIN, { snapshot: s.snapshot }))
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_V2V_FAILED')
    expect(err.message).toContain('snapshot of the volumes before conversion failed: zfs snapshot: out of space')
    expect(s.calls).toEqual(['take'])
    expect(existsSync(path.join(s.dir, 'argv'))).toBe(false)
  })

  test('abort kills the whole process group and rolls back: E_MIG_CANCELLED', async () => {
    const s = setup()
    const ac = new AbortController()
    const run = preparer(s.dir, 'hang').run([{ label: 'C', path: s.vol }], WIN, { snapshot: s.snapshot, signal: ac.signal })
    for (let i = 0; i < 100 && !existsSync(path.join(s.dir, 'child')); i++) await Bun.sleep(20)
    const child = Number(readFileSync(path.join(s.dir, 'child'), 'utf8'))
    expect(alive(child)).toBe(true)
    ac.abort()
    const err = await thrown(() => run)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
    expect(err.message).toBe('V2V cancelled; volumes rolled back')
    expect(s.calls).toEqual(['take', 'rollback', 'release'])
    expect(await gone(child)).toBe(true)
  })

  test('timeout: E_MIG_V2V_FAILED, process group killed, rolled back', async () => {
    const s = setup()
    const err = await thrown(() => preparer(s.dir, 'hang').run([{ label: 'C', path: s.vol }], WIN, { snapshot: s.snapshot, timeoutMs: 300 }))
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_V2V_FAILED')
    expect(err.message).toMatch(/timed out; volumes rolled back/)
    expect(s.calls).toEqual(['take', 'rollback', 'release'])
    const child = Number(readFileSync(path.join(s.dir, 'child'), 'utf8'))
    expect(await gone(child)).toBe(true)
    expect(readdirSync('/var/tmp').filter((f) => f.startsWith('mig-v2v-') && existsSync(path.join('/var/tmp', f, 'input.xml')))).toEqual([])
  })
})
