/**
 * The VMCX passthrough import (lib/v2v/full-import.ts).
 *
 * - The exact command line, environment and `-i libvirtxml` input for a hand-built two-disk
 *   Hyper-V manifest.
 * - The REAL virt-v2v 2.2 (libguestfs direct backend, TCG) on a real Hyper-V export (the corpus
 *   VMCX + a VHDX made with qemu-img) inspected by the real `vmcx_export` importer: the disk holds
 *   no operating system, so virt-v2v's inspection fails; E_MIG_V2V_FAILED carries its error and
 *   the destination volume is unchanged. (~30 s: appliance boot under TCG.)
 * - The success path needs a guest virt-v2v can convert, which cannot be had here (no Windows or
 *   Linux guest image, no network): `virt-v2v-test-double`, a TEST DOUBLE of virt-v2v (a bash script,
 *   NOT the real tool) records its argv, environment and input XML, prints virt-v2v 2.2's
 *   machine-readable output (JSON messages with their human duplicates; nbdcopy's progress bar on
 *   stderr for disk 1, virt-v2v(1)'s `N/M` progress lines for disk 2) and writes the output disks
 *   where the real tool would (`<os>/<name>-sd<x>`: libguestfs `disk_create`, then the data with
 *   `qemu-img convert -n -O raw`). The destination volumes are a real file-sink volume and a real
 *   loop device (the zvol sink's block-device path).
 * - Cancellation kills the tool's whole process group.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import {
  closeSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import type { ManifestDisk, VmManifest } from '../../lib/manifest.ts'
import { importer as vmcxImporter } from '../../lib/importers/vmcx-export.ts'
import { FileSink } from '../../lib/sink/file.ts'
import { fullImportCommand, v2vDriveName } from '../../lib/v2v/full-import-command.ts'
import { runV2vFullImport, type FullImportOptions, type FullImportVolume } from '../../lib/v2v/full-import.ts'
import { makeBootDisk } from '../helpers/bootdisk.ts'
import { CORPUS, tempDir, thrown } from '../helpers/tmp.ts'

const MiB = 1024 * 1024
const tmp = tempDir('mig-v2v-full-')
const BIN = path.join(tmp.dir, 'bin')
const DOUBLE = path.join(BIN, 'virt-v2v-test-double')
let loop = ''
let seq = 0

// virt-v2v-test-double: a TEST DOUBLE of virt-v2v 2.2, not the real tool.
const DOUBLE_SCRIPT = `#!/bin/bash
# Test double of virt-v2v 2.2 (NOT the real tool): see test/v2v/full-import.integ.test.ts.
set -u
rec="$V2V_DOUBLE_RECORD"
mode="$V2V_DOUBLE_MODE"
printf '%s\\n' "$@" > "$rec/argv"
env > "$rec/env"
echo $$ > "$rec/pid"
xml='' os='' name=''
while [ $# -gt 0 ]; do
  case "$1" in
    -os) os="$2"; shift 2;;
    -on) name="$2"; shift 2;;
    -i|-o|-of|-oa|--root) shift 2;;
    --machine-readable) shift;;
    *) xml="$1"; shift;;
  esac
done
cp "$xml" "$rec/input.xml"
ls -l "$os" > "$rec/os-listing"
msg() { printf '{ "message": "%s", "timestamp": "%s", "type": "%s" }\\n' "$1" "$(date -u +%Y-%m-%dT%H:%M:%S.%N+00:00)" "\${2:-message}"; printf '[%6.1f] %s\\n' "$SECONDS" "$1"; }
bar() { # nbdcopy --progress (libnbd 1.14 copy/progress.c), on stderr
  local p=$1 stars=$(( $1 * 40 / 100 )) s
  s=$(printf '%*s' $stars '' | tr ' ' '*')$(printf '%*s' $((40 - stars)) '' | tr ' ' '-')
  if [ "$p" -eq 100 ]; then printf '\\xe2\\x96\\x88 100%% [%s]\\n' "$s" >&2; else printf '\\xe2\\x96\\x9d %3d%% [%s]\\r' "$p" "$s" >&2; fi
}
mapfile -t srcs < <(grep -o '<source file="[^"]*"' "$xml" | sed 's/^<source file="//; s/"$//')
mapfile -t fmts < <(grep -o '<driver name="qemu" type="[^"]*"' "$xml" | sed 's/.*type="//; s/"$//')
msg "Setting up the source: -i libvirtxml $xml"
msg "Opening the source"
msg "Inspecting the source"
if [ "$mode" = hang ]; then sleep 300 & echo $! > "$rec/child"; wait; exit 0; fi
msg "Converting Windows Server 2019 Standard to run on KVM"
msg "there are no virtio drivers available for this version of Windows (10.0 x86_64 Server).  virt-v2v looks for drivers in /usr/share/virtio-win" warning
msg "Setting up the destination: -o disk -os $os"
letters=(a b c d e f g h)
n=\${#srcs[@]}
for i in "\${!srcs[@]}"; do
  out="$os/$name-sd\${letters[$i]}"
  size=$(qemu-img info --output=json -f "\${fmts[$i]}" "\${srcs[$i]}" | grep -o '"virtual-size": [0-9]*' | grep -o '[0-9]*$')
  case "$mode" in
    beside) rm -f "$out";;
    missing) if [ "$i" -eq 1 ]; then rm -f "$out"; continue; fi;;
  esac
  # libguestfs disk_create: a block device is left in place, a file is truncated and sized.
  if [ ! -b "$out" ]; then : > "$out"; truncate -s "$size" "$out"; fi
  msg "Copying disk $((i + 1))/$n"
  if [ "$i" -eq 0 ]; then bar 0; bar 10; bar 37; else echo 0/100; echo 15/100; fi
  qemu-img convert -n -f "\${fmts[$i]}" -O raw "\${srcs[$i]}" "$out" || exit 1
  if [ "$i" -eq 0 ]; then bar 81; bar 100; else echo 60/100; echo 100/100; fi
  if [ "$mode" = short ] && [ "$i" -eq 0 ]; then truncate -s $((size - 512)) "$out"; fi
done
msg "Creating output metadata"
{
  echo "<domain type='kvm'><name>$name</name><devices>"
  for i in "\${!srcs[@]}"; do echo "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='$os/$name-sd\${letters[$i]}'/><target dev='vd\${letters[$i]}' bus='virtio'/></disk>"; done
  echo "</devices></domain>"
} > "$os/$name.xml"
msg "Finishing off"
exit 0
`

beforeAll(() => {
  mkdirSync(BIN)
  writeFileSync(DOUBLE, DOUBLE_SCRIPT, { mode: 0o755 })
  const backing = path.join(tmp.dir, 'loop-backing.img')
  execFileSync('truncate', ['-s', '24M', backing])
  loop = execFileSync('losetup', ['-f', '--show', backing], { encoding: 'utf8' }).trim()
})

afterAll(() => {
  if (loop) execFileSync('losetup', ['-d', loop])
  tmp.cleanup()
})

const sha = (file: string, length?: number) => {
  const h = createHash('sha256')
  const fd = openSync(file, 'r')
  try {
    const buf = Buffer.alloc(4 * MiB)
    let pos = 0
    for (;;) {
      const want = length === undefined ? buf.length : Math.min(buf.length, length - pos)
      if (want <= 0) break
      const n = readSync(fd, buf, 0, want, pos)
      if (n === 0) break
      h.update(buf.subarray(0, n))
      pos += n
    }
  } finally {
    closeSync(fd)
  }
  return h.digest('hex')
}
const qemuInfo = (file: string, fmt: string) => JSON.parse(execFileSync('qemu-img', ['info', '--output=json', '-f', fmt, file], { encoding: 'utf8' }))
const recorded = (dir: string, name: string) => readFileSync(path.join(dir, name), 'utf8')

/** True while `pid` is a live process (a zombie counts as dead). */
function alive(pid: number): boolean {
  try {
    const st = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return !/^[ZX]$/.test(st.slice(st.lastIndexOf(')') + 2, st.lastIndexOf(')') + 3))
  } catch {
    return false
  }
}

/** Fills `file` (already sized) with random data in a few places, so zeros and data alternate. */
function scatter(file: string, size: number): void {
  const fd = openSync(file, 'r+')
  for (let off = 0; off < size; off += 5 * MiB) writeSync(fd, randomBytes(Math.min(700 * 1024, size - off)), 0, undefined, off)
  closeSync(fd)
}

/**
 * A two-disk Hyper-V VM on disk: disk 1 a dynamic VHDX (boot sector + scattered data), disk 2 a
 * fixed VHD (`vpc`); two destination volumes: a file-sink volume and the loop device (zeroed).
 */
async function twoDiskCase() {
  const dir = path.join(tmp.dir, `case${seq++}`)
  const vhdDir = path.join(dir, 'export', 'Virtual Hard Disks')
  mkdirSync(vhdDir, { recursive: true })
  const raw1 = path.join(dir, 'os.raw')
  makeBootDisk(raw1, 'VMCX-OS', 40 * MiB)
  scatter(raw1, 40 * MiB)
  const raw2 = path.join(dir, 'data.raw')
  execFileSync('truncate', ['-s', '20M', raw2])
  scatter(raw2, 20 * MiB)
  const vhdx = path.join(vhdDir, 'OS.vhdx')
  const vhd = path.join(vhdDir, 'Data.vhd')
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vhdx', raw1, vhdx])
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vpc', '-o', 'subformat=fixed,force_size=on', raw2, vhd])
  const cap1 = qemuInfo(vhdx, 'vhdx')['virtual-size'] as number
  const cap2 = qemuInfo(vhd, 'vpc')['virtual-size'] as number
  const disks: ManifestDisk[] = [
    { label: 'OS', capacity_bytes: cap1, disk_format: 'vhdx', source: { path: vhdx }, controller: 'scsi', address: '0:0' },
    { label: 'Data', capacity_bytes: cap2, disk_format: 'vpc', source: { path: vhd }, controller: 'scsi', address: '0:1' },
  ]
  const m = hyperv({ disks })
  const sink = new FileSink({ dataDir: path.join(dir, 'data') })
  const fileVol = await sink.create('job1', 'OS', cap1)
  await fileVol.close()
  execFileSync('blkdiscard', [loop])
  const volumes: FullImportVolume[] = [
    { label: 'OS', path: fileVol.path },
    { label: 'Data', path: loop },
  ]
  // What the destination must hold: qemu-img's raw conversion of each source disk.
  const expected = [rawSha(vhdx, 'vhdx', path.join(dir, 'e1.raw')), rawSha(vhd, 'vpc', path.join(dir, 'e2.raw'))]
  const rec = path.join(dir, 'rec')
  mkdirSync(rec)
  return { dir, m, volumes, expected, caps: [cap1, cap2], rec, workDir: path.join(dir, 'work') }
}

function rawSha(src: string, fmt: string, out: string): string {
  execFileSync('qemu-img', ['convert', '-f', fmt, '-O', 'raw', src, out])
  const s = sha(out)
  rmSync(out)
  return s
}

function hyperv(over: Partial<VmManifest> = {}): VmManifest {
  return {
    name: 'SQL Prod 01',
    source_format: 'vmcx_export',
    guest_os: { family: 'windows', id: 'Windows Server 2019' },
    firmware: 'efi',
    secure_boot: true,
    cpu: { count: 4, cores_per_socket: 2 },
    memory_bytes: 8 * 1024 * MiB,
    disks: [],
    nics: [{ label: 'nic0', mac: '00:15:5d:0a:0b:0c', model: 'virtio', network: 'External Switch' }],
    cbt_available: false,
    warnings: [],
    ...over,
  }
}

const doubleEnv = (rec: string, mode: string) => ({ V2V_DOUBLE_RECORD: rec, V2V_DOUBLE_MODE: mode, LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' })

/** runV2vFullImport's options for the case `c` (its manifest, volumes and run directory; never aborted, progress ignored, no virtio-win ISO), `over` on top. */
const importOptions = (c: { m: VmManifest; volumes: FullImportOptions['volumes']; workDir: string }, over: Partial<FullImportOptions>): FullImportOptions => ({
  manifest: c.m,
  volumes: c.volumes,
  signal: new AbortController().signal,
  onProgress: () => {},
  workDir: c.workDir,
  virtioWinIso: null,
  ...over,
})

describe('fullImportCommand', () => {
  test('exact command line, environment and input XML for a two-disk Hyper-V manifest', () => {
    const m = hyperv({
      name: 'SQL <Prod> 01',
      disks: [
        {
          label: 'OS',
          capacity_bytes: 64 * 1024 * MiB,
          disk_format: 'vhdx',
          source: { path: '/var/lib/app/imports/sql/Virtual Hard Disks/OS.vhdx' },
          controller: 'scsi',
          address: '0:0',
        },
        {
          label: 'Logs',
          capacity_bytes: 10 * 1024 * MiB,
          disk_format: 'vpc',
          source: { path: '/var/lib/app/imports/sql/Virtual Hard Disks/Logs & Temp.vhd' },
          controller: 'ide',
          address: '0:1',
        },
      ],
      nics: [
        { label: 'nic0', mac: '00:15:5d:0a:0b:0c', model: 'virtio', network: 'External Switch' },
        { label: 'nic1', mac: null, model: 'e1000', network: null },
      ],
    })
    const c = fullImportCommand(m, '/var/tmp/mig/vmcx-import-x1', { env: { LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' }, virtioWinIso: '/srv/virtio-win.iso' })
    expect(c.argv).toEqual([
      'virt-v2v',
      '-i',
      'libvirtxml',
      '/var/tmp/mig/vmcx-import-x1/input.xml',
      '-o',
      'local',
      '-os',
      '/var/tmp/mig/vmcx-import-x1/out',
      '-of',
      'raw',
      '-oa',
      'sparse',
      '-on',
      'SQL_Prod_01',
      '--root',
      'first',
      '--machine-readable',
    ])
    expect(c.env).toEqual({
      PATH: process.env.PATH || '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
      HOME: process.env.HOME || '/root',
      LC_ALL: 'C',
      LIBGUESTFS_BACKEND: 'direct',
      VIRT_V2V_TMPDIR: '/var/tmp/mig/vmcx-import-x1/tmp',
      VIRTIO_WIN: '/srv/virtio-win.iso',
      LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg',
    })
    expect(c.outputs).toEqual(['/var/tmp/mig/vmcx-import-x1/out/SQL_Prod_01-sda', '/var/tmp/mig/vmcx-import-x1/out/SQL_Prod_01-sdb'])
    expect(c.outputXmlPath).toBe('/var/tmp/mig/vmcx-import-x1/out/SQL_Prod_01.xml')
    expect(c.inputXml).toBe(`<domain type="hyperv">
  <name>SQL &lt;Prod&gt; 01</name>
  <memory unit="KiB">8388608</memory>
  <vcpu>4</vcpu>
  <cpu>
    <topology sockets="2" cores="2" threads="1"/>
  </cpu>
  <os firmware="efi">
    <type arch="x86_64">hvm</type>
  </os>
  <features>
    <acpi/>
    <apic/>
  </features>
  <devices>
    <disk type="file" device="disk">
      <driver name="qemu" type="vhdx"/>
      <source file="/var/lib/app/imports/sql/Virtual Hard Disks/OS.vhdx"/>
      <target dev="sda" bus="scsi"/>
    </disk>
    <disk type="file" device="disk">
      <driver name="qemu" type="vpc"/>
      <source file="/var/lib/app/imports/sql/Virtual Hard Disks/Logs &amp; Temp.vhd"/>
      <target dev="hdb" bus="ide"/>
    </disk>
    <interface type="network">
      <mac address="00:15:5d:0a:0b:0c"/>
      <source network="External Switch"/>
    </interface>
    <interface type="network">
      <source network="eth1"/>
    </interface>
  </devices>
</domain>
`)
    // No ISO: no VIRTIO_WIN at all.
    expect('VIRTIO_WIN' in fullImportCommand(m, '/w', { virtioWinIso: null }).env).toBe(false)
    expect([0, 1, 25, 26, 27, 51, 52, 701, 702].map(v2vDriveName)).toEqual(['a', 'b', 'z', 'aa', 'ab', 'az', 'ba', 'zz', 'aaa'])
  })
})

describe('runV2vFullImport with the real virt-v2v', () => {
  test('a Hyper-V export whose disk has no OS: E_MIG_V2V_FAILED with the inspection error, volume unchanged', async () => {
    const root = path.join(tmp.dir, 'imports')
    const exp = path.join(root, 'noos')
    mkdirSync(path.join(exp, 'Virtual Machines'), { recursive: true })
    mkdirSync(path.join(exp, 'Virtual Hard Disks'), { recursive: true })
    copyFileSync(path.join(CORPUS, 'dissect.hypervisor/test.vmcx'), path.join(exp, 'Virtual Machines', '282874FC-59D6-4F30-BC04-5FDD909C82E0.vmcx'))
    const raw = path.join(tmp.dir, 'noos.raw')
    makeBootDisk(raw, 'NO-OS-HERE', 64 * MiB)
    // The VMCX attaches "...\Virtual Hard Disks\Other Location.vhdx" on IDE 0:0.
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vhdx', raw, path.join(exp, 'Virtual Hard Disks', 'Other Location.vhdx')])
    const m = await vmcxImporter.inspect(exp, { importRoot: root })
    expect(m.disks.map((d) => [d.label, d.disk_format, d.capacity_bytes])).toEqual([['Other_Location', 'vhdx', 64 * MiB]])

    const sink = new FileSink({ dataDir: path.join(tmp.dir, 'real-data') })
    const vol = await sink.create('realjob', m.disks[0]!.label, m.disks[0]!.capacity_bytes)
    await vol.write(0, Buffer.from('PRE-EXISTING VOLUME CONTENT'))
    await vol.write(32 * MiB, randomBytes(MiB))
    await vol.flush()
    await vol.close()
    const before = sha(vol.path)
    const workDir = path.join(tmp.dir, 'real-work')
    const messages: string[] = []
    const progress: number[] = []
    const err = await thrown(() =>
      runV2vFullImport({
        manifest: m,
        volumes: [{ label: m.disks[0]!.label, path: vol.path }],
        signal: new AbortController().signal,
        onProgress: (_l, b) => progress.push(b),
        onMessage: (t) => messages.push(t),
        env: { LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' },
        workDir,
        virtioWinIso: null,
      }),
    )
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_V2V_FAILED')
    expect(err.message).toContain('virt-v2v exited with status 1:')
    expect(err.message).toContain('inspection could not detect the source guest')
    expect(err.details.exit_code).toBe(1)
    expect(err.details.last_lines.join('\n')).toContain('No root device found in this operating system image.')
    expect(messages).toEqual(
      expect.arrayContaining([expect.stringMatching(/^Setting up the source: -i libvirtxml .*\/input\.xml$/), 'Opening the source', 'Inspecting the source']),
    )
    expect(messages.some((t) => t.startsWith('Copying disk'))).toBe(false)
    expect(progress).toEqual([])
    expect(sha(vol.path)).toBe(before)
    expect(statSync(vol.path).size).toBe(64 * MiB)
    expect(existsSync(workDir)).toBe(false)
    let left = ''
    try {
      left = execFileSync('pgrep', ['-f', 'vmcx-import-'], { encoding: 'utf8' })
    } catch {
      left = ''
    }
    expect(left).toBe('')
  }, 120_000)
})

describe("virt-v2v's real output path through the volume links", () => {
  test('libguestfs disk_create + nbdkit file plugin (what -o local runs after conversion) write into the linked volumes in place', async () => {
    // virt-v2v 2.2 output/output.ml output_to_local_file: `g#disk_create <os>/<name>-sdX raw <size>`,
    // then `nbdkit file file=<os>/<name>-sdX cache=none` that nbdcopy writes to (nbdcopy is replaced
    // by qemu-img here: Debian's virt-v2v does not pull libnbd-bin in).
    const c = await twoDiskCase()
    const out = path.join(c.dir, 'out')
    mkdirSync(out)
    const fileInode = statSync(c.volumes[0]!.path).ino
    for (let i = 0; i < 2; i++) {
      const link = path.join(out, `SQL_Prod_01-sd${v2vDriveName(i)}`)
      execFileSync('ln', ['-s', c.volumes[i]!.path, link])
      execFileSync('guestfish', ['--', 'disk-create', link, 'raw', String(c.caps[i])], { env: { ...process.env, LIBGUESTFS_BACKEND: 'direct' } })
      const d = c.m.disks[i]!
      execFileSync('nbdkit', [
        '-U',
        '-',
        '--run',
        `qemu-img convert -n -f ${d.disk_format} -O raw '${d.source.path}' "$nbd"`,
        'file',
        `file=${link}`,
        'cache=none',
      ])
    }
    expect(statSync(c.volumes[0]!.path).ino).toBe(fileInode)
    expect(statSync(c.volumes[0]!.path).size).toBe(c.caps[0]!)
    expect(sha(c.volumes[0]!.path)).toBe(c.expected[0]!)
    expect(sha(loop, c.caps[1]!)).toBe(c.expected[1]!)
  })
})

describe('runV2vFullImport with virt-v2v-test-double (a test double, not the real tool)', () => {
  test('success: the converted disks land in a file volume and a block device, bit-exact, progress monotone to capacity', async () => {
    const c = await twoDiskCase()
    const calls: Array<[string, number]> = []
    const messages: string[] = []
    const fileInode = statSync(c.volumes[0]!.path).ino
    const r = await runV2vFullImport(
      importOptions(c, { onProgress: (l, b) => calls.push([l, b]), onMessage: (t) => messages.push(t), binary: DOUBLE, env: doubleEnv(c.rec, 'ok') }),
    )
    // The command it ran and what it was given.
    const argv = recorded(c.rec, 'argv').split('\n').slice(0, -1)
    const runDir = path.dirname(argv[2]!)
    expect(path.dirname(runDir)).toBe(c.workDir)
    expect(argv).toEqual([
      '-i',
      'libvirtxml',
      `${runDir}/input.xml`,
      '-o',
      'local',
      '-os',
      `${runDir}/out`,
      '-of',
      'raw',
      '-oa',
      'sparse',
      '-on',
      'SQL_Prod_01',
      '--root',
      'first',
      '--machine-readable',
    ])
    expect(recorded(c.rec, 'input.xml')).toBe(fullImportCommand(c.m, runDir).inputXml)
    const env = Object.fromEntries(
      recorded(c.rec, 'env')
        .split('\n')
        .filter(Boolean)
        .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
    )
    expect(
      Object.keys(env)
        .filter((k) => !['PWD', 'SHLVL', '_', 'OLDPWD'].includes(k))
        .sort(),
    ).toEqual(['HOME', 'LC_ALL', 'LIBGUESTFS_BACKEND', 'LIBGUESTFS_BACKEND_SETTINGS', 'PATH', 'V2V_DOUBLE_MODE', 'V2V_DOUBLE_RECORD', 'VIRT_V2V_TMPDIR'])
    expect(env.VIRT_V2V_TMPDIR).toBe(`${runDir}/tmp`)
    // Before the tool ran, each output disk was a link to its volume.
    const listing = recorded(c.rec, 'os-listing')
    expect(listing).toContain(`SQL_Prod_01-sda -> ${c.volumes[0]!.path}`)
    expect(listing).toContain(`SQL_Prod_01-sdb -> ${loop}`)
    // Bit-exact destinations; the file volume is the same inode, sized to the disk.
    expect(sha(c.volumes[0]!.path)).toBe(c.expected[0]!)
    expect(statSync(c.volumes[0]!.path).size).toBe(c.caps[0]!)
    expect(statSync(c.volumes[0]!.path).ino).toBe(fileInode)
    expect(sha(loop, c.caps[1]!)).toBe(c.expected[1]!)
    expect(r.placement).toEqual(['in_place', 'in_place'])
    expect(r.libvirtXml).toContain(`<source file='${runDir}/out/SQL_Prod_01-sda'/>`)
    expect(r.warnings).toEqual([expect.stringContaining('there are no virtio drivers available for this version of Windows')])
    expect(messages).toEqual(expect.arrayContaining(['Copying disk 1/2', 'Copying disk 2/2', 'Finishing off']))
    // Progress: per disk monotone, from the bar (disk 1) and N/M lines (disk 2), ending at capacity.
    const os = calls.filter(([l]) => l === 'OS').map(([, b]) => b)
    const data = calls.filter(([l]) => l === 'Data').map(([, b]) => b)
    expect(os).toEqual([0.1, 0.37, 0.81, 1].map((f) => Math.floor(f * c.caps[0]!)))
    expect(data).toEqual([0.15, 0.6, 1].map((f) => Math.floor(f * c.caps[1]!)))
    expect(calls.findIndex(([l]) => l === 'Data')).toBeGreaterThan(calls.findLastIndex(([l]) => l === 'OS'))
    // The run directory is gone (its links removed, not followed).
    expect(existsSync(c.workDir)).toBe(false)
    expect(existsSync(c.volumes[0]!.path)).toBe(true)
  })

  test('a tool that writes its own files: renamed onto the file volume, copied into the block device', async () => {
    const c = await twoDiskCase()
    const calls: Array<[string, number]> = []
    const fileInode = statSync(c.volumes[0]!.path).ino
    const mode = statSync(c.volumes[0]!.path).mode & 0o7777
    const r = await runV2vFullImport(importOptions(c, { onProgress: (l, b) => calls.push([l, b]), binary: DOUBLE, env: doubleEnv(c.rec, 'beside') }))
    expect(r.placement).toEqual(['renamed', 'copied'])
    expect(r.warnings.filter((w) => w.includes('instead of the volume link'))).toHaveLength(2)
    expect(sha(c.volumes[0]!.path)).toBe(c.expected[0]!)
    expect(statSync(c.volumes[0]!.path).ino).not.toBe(fileInode)
    expect(statSync(c.volumes[0]!.path).mode & 0o7777).toBe(mode)
    expect(sha(loop, c.caps[1]!)).toBe(c.expected[1]!)
    expect(calls.at(-1)).toEqual(['Data', c.caps[1]!])
    expect(existsSync(c.workDir)).toBe(false)
  })

  test('a converted disk of the wrong size or missing: E_MIG_V2V_FAILED', async () => {
    const c = await twoDiskCase()
    const base = importOptions(c, { binary: DOUBLE })
    const short = await thrown(() => runV2vFullImport({ ...base, env: doubleEnv(c.rec, 'short') }))
    expect(short).toBeInstanceOf(MigError)
    expect(short.code).toBe('E_MIG_V2V_FAILED')
    expect(short.message).toContain(`converted disk OS in ${c.volumes[0]!.path} holds ${c.caps[0]! - 512} bytes, the disk has ${c.caps[0]}`)
    const missing = await thrown(() => runV2vFullImport({ ...base, env: doubleEnv(c.rec, 'missing') }))
    expect(missing.code).toBe('E_MIG_V2V_FAILED')
    expect(missing.message).toContain('wrote no disk 2 (Data): SQL_Prod_01-sdb is missing')
    expect(missing.details.disk).toBe('Data')
    expect(existsSync(c.workDir)).toBe(false)
  })

  test('cancel: the whole process group is killed, E_MIG_CANCELLED, volumes untouched, run directory removed', async () => {
    const c = await twoDiskCase()
    const before = [sha(c.volumes[0]!.path), sha(loop, c.caps[1]!)]
    const ac = new AbortController()
    const t0 = Date.now()
    const err = await thrown(() =>
      runV2vFullImport(
        importOptions(c, {
          signal: ac.signal,
          onMessage: (t) => t === 'Inspecting the source' && setTimeout(() => ac.abort(), 100),
          binary: DOUBLE,
          env: doubleEnv(c.rec, 'hang'),
        }),
      ),
    )
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_CANCELLED')
    expect(Date.now() - t0).toBeLessThan(10_000)
    const pid = Number(recorded(c.rec, 'pid'))
    const child = Number(recorded(c.rec, 'child'))
    for (let i = 0; i < 100 && (alive(pid) || alive(child)); i++) await Bun.sleep(20)
    expect(alive(pid)).toBe(false)
    expect(alive(child)).toBe(false)
    expect([sha(c.volumes[0]!.path), sha(loop, c.caps[1]!)]).toEqual(before)
    expect(existsSync(c.workDir)).toBe(false)
  })

  test('preflight: missing binary, missing source, differencing disk, mismatched volumes; nothing runs', async () => {
    const c = await twoDiskCase()
    const base = importOptions(c, { env: doubleEnv(c.rec, 'ok') })
    const noBin = await thrown(() => runV2vFullImport({ ...base, binary: 'virt-v2v-not-installed-here' }))
    expect(noBin.code).toBe('E_MIG_V2V_FAILED')
    expect(noBin.message).toContain('virt-v2v-not-installed-here not found')
    expect(noBin.details.missing).toBe('virt-v2v-not-installed-here')

    const gone = { ...c.m, disks: [{ ...c.m.disks[0]!, source: { path: path.join(c.dir, 'nope.vhdx') } }, c.m.disks[1]!] }
    const noSrc = await thrown(() => runV2vFullImport({ ...base, binary: DOUBLE, manifest: gone }))
    expect(noSrc.code).toBe('E_MIG_V2V_FAILED')
    expect(noSrc.details.missing).toBe(path.join(c.dir, 'nope.vhdx'))

    const diff = { ...c.m, disks: [{ ...c.m.disks[0]!, source: { path: '/x/OS_ABC.avhdx' }, backing_chain: ['/x/OS.vhdx'] }, c.m.disks[1]!] }
    const noDiff = await thrown(() => runV2vFullImport({ ...base, binary: DOUBLE, manifest: diff }))
    expect(noDiff.code).toBe('E_MIG_V2V_FAILED')
    expect(noDiff.message).toContain('differencing disk (OS_ABC.avhdx over OS.vhdx)')

    const oneVol = await thrown(() => runV2vFullImport({ ...base, binary: DOUBLE, volumes: [c.volumes[0]!] }))
    expect(oneVol.code).toBe('E_MIG_INTERNAL')

    const badIso = await thrown(() => runV2vFullImport({ ...base, binary: DOUBLE, virtioWinIso: path.join(c.dir, 'no-virtio-win.iso') }))
    expect(badIso.code).toBe('E_MIG_V2V_FAILED')
    expect(badIso.details.missing).toBe(path.join(c.dir, 'no-virtio-win.iso'))

    const pre = new AbortController()
    pre.abort()
    expect((await thrown(() => runV2vFullImport({ ...base, binary: DOUBLE, signal: pre.signal }))).code).toBe('E_MIG_CANCELLED')

    expect(existsSync(path.join(c.rec, 'argv'))).toBe(false)
    expect(existsSync(c.workDir) ? readdirSync(c.workDir) : []).toEqual([])
  })
})
