/**
 * The vCenter simulator harness of the vim_api tests (test/vcsim/main.go over govmomi's
 * simulator, DESIGN.md section 7): builds it once into a cache directory under the OS temp dir
 * keyed by the SHA-256 of its source (offline, GOPATH mode over Debian's
 * golang-github-vmware-govmomi-dev), starts it on 127.0.0.1 with TLS and a checked password, and
 * drives its control API (create VMs from disk files placed in the datastore, read a VM's state,
 * reset its CBT, disable a method).
 */
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { Agent, request } from 'undici/index.js'
import { makeRawImage } from './inputs.ts'
import { REPO } from './tmp.ts'

const SRC_DIR = path.join(REPO, 'test', 'vcsim')

/** The built harness binary (builds it when the cache has none for this source). */
export async function buildVcsim(): Promise<string> {
  const src = readFileSync(path.join(SRC_DIR, 'main.go'))
  const key = createHash('sha256').update(src).digest('hex').slice(0, 16)
  const cache = path.join(tmpdir(), `migrator-vcsim-${key}`)
  const bin = path.join(cache, 'vcsim')
  if (existsSync(bin)) return bin
  mkdirSync(cache, { recursive: true })
  const tmpBin = `${bin}.${process.pid}.tmp`
  await new Promise<void>((resolve, reject) => {
    execFile(
      'go',
      ['build', '-o', tmpBin, '.'],
      {
        cwd: SRC_DIR,
        env: {
          ...process.env,
          GO111MODULE: 'off',
          GOPATH: `${path.join(cache, 'gopath')}:/usr/share/gocode`,
          GOCACHE: path.join(cache, 'gocache'),
          GOFLAGS: '',
          CGO_ENABLED: '0',
        },
        timeout: 300_000,
      },
      (err, _out, stderr) => (err ? reject(new Error(`go build of the vcsim harness failed: ${stderr || err.message}`)) : resolve()),
    )
  })
  renameSync(tmpBin, bin)
  return bin
}

/** A disk of a harness VM: a file relative to the datastore directory, and its capacity in bytes. */
export interface HarnessDisk {
  file: string
  capacity_bytes: number
}

/** A VM to create in the simulator. */
export interface HarnessVmSpec {
  name: string
  guest_id?: string
  firmware?: 'bios' | 'efi'
  num_cpu?: number
  cores_per_socket?: number
  memory_mb?: number
  cbt?: boolean
  /** Snapshots after the first are ESXi-style delta disks over the previous snapshot (see test/vcsim/main.go). */
  delta_snapshots?: boolean
  power_on?: boolean
  disks: HarnessDisk[]
  nics?: { mac?: string }[]
}

/** The small Linux VM most tests make (BIOS, 1 vCPU, 128 MiB): spread it into a {@link HarnessVmSpec}. */
export const SMALL_LINUX_VM = { guest_id: 'debian10_64Guest', firmware: 'bios', num_cpu: 1, memory_mb: 128 } as const

/** What the harness reports about a VM (read from the simulator's own objects). */
export interface HarnessVmState {
  name: string
  power_state: string
  annotation: string
  change_tracking: boolean
  custom_values: Record<string, string>
  snapshots: { ref: string; name: string }[]
  disks: { key: number; file: string }[]
  /** Snapshots taken of the VM since it was created. */
  snapshots_taken: number
  /** Delta disks the harness made for snapshots of a delta_snapshots VM. */
  delta_disks: number
}

/**
 * A guest write the harness applies (with qemu-io) to the VM's active disk `file` just before
 * snapshot number `before_snapshot` (0 = the first) is taken, or before every snapshot from then
 * on with `every`; the byte written is `(pattern + snapshot number) & 0xff`.
 */
export interface GuestWrite {
  before_snapshot: number
  every?: boolean
  file: string
  offset: number
  length: number
  pattern: number
}

/** A running harness. */
export interface Vcsim {
  /** `https://127.0.0.1:<port>/sdk` */
  url: string
  /** `127.0.0.1:<port>` (a bare vim_api endpoint). */
  hostPort: string
  username: string
  password: string
  datacenter: string
  datastore: { name: string; dir: string }
  certPem: string
  /** SHA-256 thumbprint of the server certificate, `AA:BB:...`. */
  thumbprint: string
  createVm(spec: HarnessVmSpec): Promise<string>
  vm(id: string): Promise<HarnessVmState>
  resetCbt(id: string): Promise<void>
  disableMethod(id: string, method: string): Promise<void>
  /** Makes the VM's guest ignore ShutdownGuest (answered, nothing happens): clients must power it off. */
  ignoreShutdown(id: string): Promise<void>
  scheduleWrites(id: string, writes: GuestWrite[]): Promise<void>
  /** Bytes of datastore files served under /folder since the harness started. */
  folderBytes(): Promise<number>
  /** SIGTERM (SIGKILL after 5 s), removes the state and datastore directories. */
  stop(): Promise<void>
}

/** Starts the harness (building it first if needed). `cbtPage`: bytes one QueryChangedDiskAreas answer covers. */
export async function startVcsim(opts: { password?: string; username?: string; cbtPage?: number } = {}): Promise<Vcsim> {
  const bin = await buildVcsim()
  const username = opts.username ?? 'administrator@vsphere.local'
  const password = opts.password ?? `pw-${Math.random().toString(36).slice(2)}`
  const state = mkdtempSync(path.join(tmpdir(), 'mig-vcsim-state-'))
  const args = ['-listen', '127.0.0.1:0', '-user', username, '-password', password, '-state', state]
  if (opts.cbtPage) args.push('-cbt-page', String(opts.cbtPage))
  const child: ChildProcess = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  child.stderr!.on('data', (d) => {
    if (err.length < 65536) err += d
  })
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  const info = await new Promise<{ url: string; datacenter: string; datastores: { name: string; dir: string }[]; cert_pem: string; thumbprint: string }>(
    (resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`vcsim did not start within 30 s: ${err}`)), 30_000)
      child.stdout!.on('data', (d) => {
        out += d
        const nl = out.indexOf('\n')
        if (nl >= 0) {
          clearTimeout(timer)
          try {
            resolve(JSON.parse(out.slice(0, nl)))
          } catch (e) {
            reject(e)
          }
        }
      })
      child.once('exit', (code) => {
        clearTimeout(timer)
        reject(new Error(`vcsim exited with ${code}: ${err}`))
      })
    },
  )
  const url = new URL(info.url)
  const agent = new Agent({ connect: { ca: info.cert_pem } })
  const control = async (method: 'GET' | 'POST', p: string, body?: unknown) => {
    const r = await request(`${url.origin}/harness/${p}`, {
      method,
      dispatcher: agent,
      headers: { authorization: `Bearer ${password}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
    const text = await r.body.text()
    if (r.statusCode !== 200) throw new Error(`vcsim ${method} ${p}: ${r.statusCode} ${text}`)
    return JSON.parse(text)
  }
  const ds = info.datastores[0]
  let stopped = false
  return {
    url: info.url,
    hostPort: url.host,
    username,
    password,
    datacenter: info.datacenter,
    datastore: ds,
    certPem: info.cert_pem,
    thumbprint: info.thumbprint,
    createVm: async (spec) => (await control('POST', 'vms', spec)).vm_id,
    vm: (id) => control('GET', `vms/${id}`),
    resetCbt: async (id) => void (await control('POST', `vms/${id}/reset-cbt`)),
    scheduleWrites: async (id, writes) => void (await control('POST', `vms/${id}/writes`, writes)),
    folderBytes: async () => ((await control('GET', 'stats')) as { folder_bytes: number }).folder_bytes,
    ignoreShutdown: async (id) => void (await control('POST', `vms/${id}/ignore-shutdown`)),
    disableMethod: async (id, method) => void (await control('POST', `vms/${id}/disable?method=${encodeURIComponent(method)}`)),
    async stop() {
      if (stopped) return
      stopped = true
      await agent.close().catch(() => {})
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM')
        const t = setTimeout(() => child.kill('SIGKILL'), 5000)
        await exited
        clearTimeout(t)
      }
      rmSync(state, { recursive: true, force: true })
      for (const d of info.datastores) if (d.dir.startsWith(tmpdir())) rmSync(d.dir, { recursive: true, force: true })
    },
  }
}

/** Runs `qemu-img` with `args`; rejects with its stderr. */
export function qemuImg(...args: string[]): Promise<void> {
  return new Promise((resolve, reject) =>
    execFile('qemu-img', args, (e, _o, stderr) => (e ? reject(new Error(`qemu-img ${args.join(' ')}: ${stderr}`)) : resolve())),
  )
}

/**
 * Writes `raw` (a raw image path) into the datastore as a VMDK named `<dir>/<name>.vmdk`:
 * `flat` = monolithicFlat (descriptor + `<name>-flat.vmdk`), `sparse` = monolithicSparse.
 * Returns the file path relative to the datastore.
 */
export async function putVmdk(v: Vcsim, dir: string, name: string, raw: string, kind: 'flat' | 'sparse'): Promise<string> {
  mkdirSync(path.join(v.datastore.dir, dir), { recursive: true })
  const rel = `${dir}/${name}.vmdk`
  await qemuImg(
    'convert',
    '-f',
    'raw',
    '-O',
    'vmdk',
    '-o',
    `subformat=${kind === 'flat' ? 'monolithicFlat' : 'monolithicSparse'}`,
    raw,
    path.join(v.datastore.dir, rel),
  )
  return rel
}

/**
 * A powered-on VM with CBT on, as the live and warm tests use it: disk 1 is `boot` (a raw image,
 * stored as the flat VMDK `<name>/<name>.vmdk`), disk 2 a 2 MiB sparse VMDK `<name>/<name>_1.vmdk`
 * whose data is `dataPattern` (default the name's length), its raw image written in `scratchDir`.
 * `opts`: the guest id (default Debian 10), NIC MACs (default none). Resolves with the VM's id
 * and its two disk files (datastore-relative).
 */
export async function createTwoDiskVm(
  v: Vcsim,
  scratchDir: string,
  name: string,
  boot: string,
  opts: { guestId?: string; macs?: string[]; dataPattern?: number } = {},
): Promise<{ id: string; files: string[] }> {
  const data = makeRawImage(path.join(scratchDir, `${name}-data.raw`), 2 * 1024 * 1024, opts.dataPattern ?? name.length)
  const files = [await putVmdk(v, name, name, boot, 'flat'), await putVmdk(v, name, `${name}_1`, data, 'sparse')]
  const id = await v.createVm({
    name,
    ...SMALL_LINUX_VM,
    ...(opts.guestId ? { guest_id: opts.guestId } : {}),
    cbt: true,
    power_on: true,
    disks: [
      { file: files[0]!, capacity_bytes: statSync(boot).size },
      { file: files[1]!, capacity_bytes: 2 * 1024 * 1024 },
    ],
    ...(opts.macs ? { nics: opts.macs.map((mac) => ({ mac })) } : {}),
  })
  return { id, files }
}

/** The raw contents of datastore VMDK `rel` now (converted with qemu-img through a scratch file in `scratchDir`). */
export function datastoreRaw(v: Vcsim, rel: string, scratchDir: string): Buffer {
  const out = path.join(scratchDir, `cmp-${Math.random().toString(36).slice(2)}.raw`)
  execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'raw', path.join(v.datastore.dir, rel), out])
  try {
    return readFileSync(out)
  } finally {
    rmSync(out, { force: true })
  }
}

/** Registers harness `v` as a `vim_api` source (pinned thumbprint) on the server at `base`; returns the source id. */
export async function registerVcsim(base: string, v: Vcsim, name = 'vcsim'): Promise<string> {
  const res = await fetch(`${base}/sources`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ name, kind: 'vim_api', endpoint: v.url, username: v.username, password: v.password, tls: { thumbprint: v.thumbprint } }),
  })
  const body = (await res.json()) as { id?: string }
  if (res.status !== 201 || !body.id) throw new Error(`registering the vcsim source: ${res.status} ${JSON.stringify(body)}`)
  return body.id
}
