/**
 * Inspect through HTTP (spec 4): the real server, started as a child process under each
 * runtime (Bun and Node 20), inspects one valid input of each of the nine offline kinds built
 * with real tools (`qemu-img convert`, `tar`; two disks where the format allows: OVA, OVF, VMX,
 * VBOX, XVA) through `POST /host-files/inspect`, and the OVA once more as an upload
 * (`POST /uploads` multipart, then `POST /uploads/:id/inspect`). The manifest is compared with
 * what the builders wrote (`test/helpers/inputs.ts`): kind, disk count, each capacity equal to
 * its raw image's size, disk format, firmware, guest family, and CPU/memory/NICs of the
 * descriptors. Then one hostile input per container kind: a tar whose members are named `../`,
 * an OVF with a DOCTYPE entity bomb, a VMX whose disk is `/etc/passwd`.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { buildInput, buildVmcxExport, makeRawImage, type BuiltInput } from '../helpers/inputs.ts'
import { RUNTIMES, startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

const MiB = 1024 * 1024

async function call(base: string, method: string, p: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(base + p, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text === '' ? null : JSON.parse(text) }
}

/** What the builders of `test/helpers/inputs.ts` write into each descriptor. */
interface Expected {
  disks: 1 | 2
  formats: string[]
  guest: string
  cpu?: [number, number]
  memory?: number
  nics?: Array<{ mac: string | null; model: string; network: string | null }>
}

// OVF envelope of inputs.ts: 2 vCPU, 512 MiB (byte * 2^20), one VmxNet3 NIC 00:50:56:01:02:03 on
// "VM Network", otherLinux64Guest, firmware bios; streamOptimized VMDKs.
const OVF: Omit<Expected, 'disks' | 'formats'> = {
  guest: 'linux',
  cpu: [2, 1],
  memory: 512 * MiB,
  nics: [{ mac: '00:50:56:01:02:03', model: 'vmxnet3', network: 'VM Network' }],
}
const EXPECTED: Record<string, Expected> = {
  ova_archive: { disks: 2, formats: ['vmdk', 'vmdk'], ...OVF },
  ovf_folder: { disks: 2, formats: ['vmdk', 'vmdk'], ...OVF },
  // VMX: debian10-64, numvcpus 2, coresPerSocket 2, memSize 768, vmxnet3 00:0c:29:aa:bb:cc; disk 1
  // monolithicSparse (vmdk), disk 2 monolithicFlat whose flat extent is read as raw.
  vmx_folder: {
    disks: 2,
    formats: ['vmdk', 'raw'],
    guest: 'linux',
    cpu: [2, 2],
    memory: 768 * MiB,
    nics: [{ mac: '00:0c:29:aa:bb:cc', model: 'vmxnet3', network: 'VM Network' }],
  },
  vhdx: { disks: 1, formats: ['vhdx'], guest: 'unknown' },
  qcow2: { disks: 1, formats: ['qcow2'], guest: 'unknown' },
  vmdk: { disks: 1, formats: ['vmdk'], guest: 'unknown' },
  // Hyper-V export: the corpus Gen 1 VMCX (BIOS, 1 vCPU, 1024 MB, no guest OS recorded).
  vmcx_export: { disks: 1, formats: ['vhdx'], guest: 'unknown', cpu: [1, 1], memory: 1024 * MiB },
  // VBOX: Debian_64, CPU count 2, RAMSize 1024, 82540EM NIC 080027123456 on NAT; VDI + VMDK on SATA.
  vbox_folder: {
    disks: 2,
    formats: ['vdi', 'vmdk'],
    guest: 'linux',
    cpu: [2, 1],
    memory: 1024 * MiB,
    nics: [{ mac: '08:00:27:12:34:56', model: 'e1000', network: 'NAT' }],
  },
  // XVA ova.xml: VCPUs_max 2, memory_static_max 1 GiB, no VIFs, raw 1 MiB blocks.
  xva_archive: { disks: 2, formats: ['raw', 'raw'], guest: 'unknown', cpu: [2, 1], memory: 1024 * MiB, nics: [] },
}

/** The nine inputs under `root`, from two raw images of different sizes. */
function buildAll(root: string): Map<string, BuiltInput> {
  const raws = path.join(root, '.raws')
  mkdirSync(raws, { recursive: true })
  const a = makeRawImage(path.join(raws, 'a.raw'), 8 * MiB, 1)
  const b = makeRawImage(path.join(raws, 'b.raw'), 12 * MiB, 2)
  const out = new Map<string, BuiltInput>()
  for (const kind of Object.keys(EXPECTED)) {
    const name = `vm-${kind.replace(/_/g, '-')}`
    out.set(kind, kind === 'vmcx_export' ? buildVmcxExport(root, name, a) : buildInput(kind, root, name, EXPECTED[kind]!.disks === 2 ? [a, b] : [a]))
  }
  return out
}

/** Hostile inputs: returns their paths relative to `root`. */
function buildHostile(root: string, built: Map<string, BuiltInput>): { dotdotOva: string; dotdotXva: string; entityOvf: string; passwdVmx: string } {
  // A tar whose members are all named "../<name>" (GNU tar's --transform keeps the prefix).
  const retar = (archive: string, out: string) => {
    const x = path.join(root, '.x-' + path.basename(out))
    mkdirSync(x, { recursive: true })
    execFileSync('tar', ['-xf', archive, '-C', x])
    const names = execFileSync('tar', ['-tf', archive], { encoding: 'utf8' })
      .split('\n')
      .filter((n) => n !== '' && !n.endsWith('/'))
    execFileSync('tar', ['--format=ustar', '-cf', path.join(root, out), '-C', x, '--transform=s,^,../,', ...names], { stdio: ['ignore', 'ignore', 'ignore'] })
    rmSync(x, { recursive: true, force: true })
    return out
  }
  const dotdotOva = retar(built.get('ova_archive')!.path, 'dotdot.ova')
  const dotdotXva = retar(built.get('xva_archive')!.path, 'dotdot.xva')
  // An OVF folder whose descriptor declares a DOCTYPE with nested entities (billion laughs).
  const src = built.get('ovf_folder')!.path
  const bomb = path.join(root, 'entity-ovf')
  mkdirSync(bomb, { recursive: true })
  for (const f of ['vm-ovf-folder-disk1.vmdk', 'vm-ovf-folder-disk2.vmdk']) copyFileSync(path.join(src, f), path.join(bomb, f))
  const ents = ['<!ENTITY l0 "lol">', ...Array.from({ length: 9 }, (_, i) => `<!ENTITY l${i + 1} "${`&l${i};`.repeat(10)}">`)].join('\n  ')
  const ovf = readFileSync(path.join(src, 'vm-ovf-folder.ovf'), 'utf8')
    .replace('<?xml version="1.0" encoding="UTF-8"?>\n', `<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE Envelope [\n  ${ents}\n]>\n`)
    .replace('<Name>vm-ovf-folder</Name>', '<Name>&l9;</Name>')
  if (!ovf.includes('<!DOCTYPE Envelope') || !ovf.includes('&l9;')) throw new Error('entity OVF not built')
  writeFileSync(path.join(bomb, 'vm.ovf'), ovf)
  // A VMX folder whose disk is the host's /etc/passwd.
  const vmx = path.join(root, 'passwd-vmx')
  mkdirSync(vmx, { recursive: true })
  writeFileSync(
    path.join(vmx, 'evil.vmx'),
    [
      'displayName = "evil"',
      'guestOS = "debian10-64"',
      'memsize = "512"',
      'scsi0.present = "TRUE"',
      'scsi0:0.present = "TRUE"',
      'scsi0:0.fileName = "/etc/passwd"',
      '',
    ].join('\n'),
  )
  return { dotdotOva, dotdotXva, entityOvf: 'entity-ovf', passwdVmx: 'passwd-vmx' }
}

/** Asserts one inspect answer against what the builder of `kind` wrote. */
function checkManifest(kind: string, built: BuiltInput, body: any, importRoot: string): void {
  const exp = EXPECTED[kind]!
  const m = body.manifest
  expect(body.detected_kind).toBe(kind)
  expect(m.source_format).toBe(kind)
  expect(m.disks.length).toBe(exp.disks)
  expect(m.disks.map((d: any) => d.capacity_bytes)).toEqual(built.disks.map((d) => statSync(d.raw).size))
  expect(m.disks.map((d: any) => d.disk_format)).toEqual(exp.formats)
  for (const d of m.disks) expect(path.relative(importRoot, d.source.path).startsWith('..')).toBe(false)
  expect([m.firmware, m.secure_boot]).toEqual(['bios', false])
  expect(m.guest_os.family).toBe(exp.guest)
  expect(m.cbt_available).toBe(false)
  if (exp.cpu) expect([m.cpu.count, m.cpu.cores_per_socket]).toEqual(exp.cpu)
  if (exp.memory) expect(m.memory_bytes).toBe(exp.memory)
  if (exp.nics) expect(m.nics.map((n: any) => ({ mac: n.mac, model: n.model, network: n.network }))).toEqual(exp.nics)
}

for (const runtime of RUNTIMES) {
  describe(`inspect over HTTP under ${runtime}`, () => {
    const t = tempDir(`mig-inspect-${runtime}-`)
    const importRoot = path.join(t.dir, 'imports')
    let srv: RunningServer
    let base = ''
    let built: Map<string, BuiltInput>
    let hostile: ReturnType<typeof buildHostile>
    beforeAll(async () => {
      mkdirSync(importRoot, { recursive: true, mode: 0o750 })
      built = buildAll(importRoot)
      hostile = buildHostile(importRoot, built)
      srv = await startServer(runtime, t.dir)
      base = srv.base
    })
    afterAll(async () => {
      await srv?.stop()
      t.cleanup()
    })

    for (const kind of Object.keys(EXPECTED)) {
      test(`${kind}: POST /host-files/inspect detects the kind and returns the manifest`, async () => {
        const input = built.get(kind)!
        const rel = path.relative(importRoot, input.path)
        const r = await call(base, 'POST', '/host-files/inspect', { path: rel })
        expect(r.status).toBe(200)
        checkManifest(kind, input, r.body, importRoot)
        // Naming the kind skips detection and gives the same manifest.
        const named = await call(base, 'POST', '/host-files/inspect', { path: input.path, kind })
        expect(named.status).toBe(200)
        expect(named.body.manifest).toEqual(r.body.manifest)
      })
    }

    test('ova_archive as an upload: POST /uploads (multipart) then POST /uploads/:id/inspect', async () => {
      const input = built.get('ova_archive')!
      const fd = new FormData()
      fd.append('file', new Blob([readFileSync(input.path)]), 'vm.ova')
      const up = await fetch(`${base}/uploads`, { method: 'POST', body: fd })
      expect(up.status).toBe(201)
      const { id } = await up.json()
      const r = await call(base, 'POST', `/uploads/${id}/inspect`)
      expect(r.status).toBe(200)
      checkManifest('ova_archive', input, r.body, importRoot)
      // The disks are read in place in the uploaded archive, at the members' offsets.
      for (const d of r.body.manifest.disks) {
        expect(d.source.path).toBe(path.join(importRoot, '.uploads', id))
        expect(d.source.offset % 512).toBe(0)
      }
      const missing = await call(base, 'POST', '/uploads/00000000-0000-4000-8000-000000000000/inspect')
      expect([missing.status, missing.body.error.code]).toEqual([404, 'E_MIG_UPLOAD_NOT_FOUND'])
      expect((await call(base, 'DELETE', `/uploads/${id}`)).status).toBe(204)
    })

    test('hostile: a tar whose members are named ../ (OVA and XVA) -> 403 E_MIG_HOST_PATH_REJECTED', async () => {
      for (const [p, kind] of [
        [hostile.dotdotOva, undefined],
        [hostile.dotdotOva, 'ova_archive'],
        [hostile.dotdotXva, 'xva_archive'],
      ] as const) {
        const r = await call(base, 'POST', '/host-files/inspect', kind ? { path: p, kind } : { path: p })
        expect([p, r.status, r.body.error.code]).toEqual([p, 403, 'E_MIG_HOST_PATH_REJECTED'])
        expect(r.body.error.message).toContain('"../')
      }
    })

    test('hostile: an OVF with a DOCTYPE entity -> 422 E_MIG_MALFORMED_ARCHIVE, the server stays up', async () => {
      const r = await call(base, 'POST', '/host-files/inspect', { path: hostile.entityOvf })
      expect([r.status, r.body.error.code]).toEqual([422, 'E_MIG_MALFORMED_ARCHIVE'])
      expect(r.body.error.message).toContain('vm.ovf')
      expect((await call(base, 'GET', '/migrations')).status).toBe(200)
    })

    test('hostile: a VMX whose disk is /etc/passwd -> 403 E_MIG_HOST_PATH_REJECTED', async () => {
      const r = await call(base, 'POST', '/host-files/inspect', { path: hostile.passwdVmx })
      expect([r.status, r.body.error.code]).toEqual([403, 'E_MIG_HOST_PATH_REJECTED'])
      expect(r.body.error.message).toContain('/etc/passwd')
    })
  })
}
