/**
 * Remote-input benchmark (docs/remote-sources.md): the migrator importing the same object over
 * HTTP (nginx), S3 (s3rver) and SMB (smbd), beside a plain download of that object by the
 * transport's own client: `curl -o` (HTTP), `curl --aws-sigv4 -o` (one signed S3 `GET`),
 * `smbclient -c get` (SMB), on two links:
 * - `loopback`: every server on 127.0.0.1;
 * - `shaped`: every server in a network namespace of the bench's own, reached over a veth pair
 *   shaped to a 20 ms round trip and 1 Gbit/s (bench/shaped-link.ts: `tc netem`, or `tc tbf`
 *   and an NFQUEUE delay where the kernel has no netem), the migrator and the reference clients
 *   on the host.
 * The servers serve one directory: test/helpers/nginx.ts, bench/s3-server.ts (s3rver in a process
 * of its own), test/helpers/smbd.ts.
 *
 * Objects: a qcow2 of SIZE GiB virtual with half its 64 KiB clusters random data
 * ({@link makeHalfFullQcow2}), and (`--objects qcow2,ova`) a one-disk OVA of the same disk
 * (stream-optimized VMDK, `fixtures/inputs.ts`). Ours: a job (`offline_url`, `start: false`) of
 * the real server (Bun) and its worker into the file sink; its time is the job's `CopyingFull`
 * phase from the SSE stream. Theirs: the download's wall time; and for a disk image object, the
 * download followed by `qemu-img convert` of it to a raw volume (what an administrator runs
 * without the migrator: the job's output is that volume, flushed). MB/s are of the object's size on
 * the server. Each side runs `--reps` times (default 3), the order alternating, each run after
 * the other side's output was removed; best and median printed, and the ratio ours / theirs of
 * each. Bytes equal: every download's sha256 is the object's, every job's volume the sha256 of
 * `qemu-img convert` of the local object (a mismatch sets a failing exit code). The load average
 * (`uptime`) is printed before and after each row: the machine may be shared.
 *
 *   ./node_modules/.bin/bun bench/remote.ts [--size 2] [--reps 3] [--objects qcow2] [--transports http,s3,smb] [--links loopback,shaped]
 * Needs root, iproute2 (ip, tc), qemu-utils, nginx-light, samba, smbclient, curl and libvirt
 * (started when not running).
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { mkdirSync, readFileSync, rmSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { AwsClient } from 'aws4fetch'
import { buildInput } from '../fixtures/inputs.ts'
import { call, openStream, submit, volumePath, waitJob } from '../test/helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../test/helpers/libvirt.ts'
import { startNginx } from '../test/helpers/nginx.ts'
import { freePort, startServer } from '../test/helpers/server.ts'
import { SMBD_USER, startSmbd } from '../test/helpers/smbd.ts'
import { tempDir } from '../test/helpers/tmp.ts'
import { createShapedLink } from './shaped-link.ts'
import { alternate, cliArg, copyPhaseSeconds, makeHalfFullQcow2, median, onInterrupt, sha256File } from './source.ts'

const GiB = 1024 ** 3
const size = Math.round(Number(cliArg('size', '2')) * GiB)
const reps = Number(cliArg('reps', '3'))
const objects = cliArg('objects', 'qcow2').split(',')
const transports = cliArg('transports', 'http,s3,smb').split(',') as Array<'http' | 's3' | 'smb'>
const links = cliArg('links', 'loopback,shaped').split(',') as Array<'loopback' | 'shaped'>
const KEYS = { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' } // s3rver's built-in account

const t = tempDir('mig-bench-remote-')
const www = path.join(t.dir, 'www')
mkdirSync(www)
mkdirSync(path.join(t.dir, 'imports'))
execFileSync('chmod', ['755', t.dir])
const stops: Array<() => Promise<void> | void> = []
const cleanup = async () => {
  for (const s of stops.reverse()) await s()
  await cleanupDomains('migbench-remote-')
  t.cleanup()
}
onInterrupt(cleanup)
let failed = false

try {
  console.log(`building the objects (${size / GiB} GiB virtual)...`)
  const qcow = makeHalfFullQcow2(www, size, 'src.qcow2').path
  const files: Record<string, { file: string; format: string; member?: string }> = { qcow2: { file: qcow, format: 'qcow2' } }
  if (objects.includes('ova')) {
    const raw = path.join(t.dir, 'src.raw')
    execFileSync('qemu-img', ['convert', '-O', 'raw', qcow, raw])
    files.ova = { file: buildInput('ova_archive', www, 'o', [raw]).path, format: 'vmdk', member: 'o-disk1.vmdk' }
    rmSync(raw)
  }
  // the reference sha256 of each object's disk: qemu-img convert of the local file
  const expect: Record<string, { object: string; disk: string; bytes: number }> = {}
  for (const name of objects) {
    const f = files[name]!
    let src = f.file
    if (f.member) {
      const x = path.join(t.dir, `x-${name}`)
      mkdirSync(x)
      execFileSync('tar', ['-xf', f.file, '-C', x])
      src = path.join(x, f.member)
    }
    const out = path.join(t.dir, `ref-${name}.raw`)
    execFileSync('qemu-img', ['convert', '-f', f.format, '-O', 'raw', src, out])
    expect[name] = { object: sha256File(f.file), disk: sha256File(out), bytes: statSync(f.file).size }
    rmSync(out)
  }

  /** The servers of one link: nginx, s3rver (its own process, the objects PUT), smbd. */
  interface Servers {
    web: string
    s3: string
    smb: { base: string; host: string; port: number }
  }
  const aws = new AwsClient({ ...KEYS, service: 's3', region: 'us-east-1' })
  const rel = (name: string) => path.relative(www, files[name]!.file)
  const startServers = async (link: string, host: string, netns?: string): Promise<Servers> => {
    const web = await startNginx(www, path.join(t.dir, `nginx-${link}`), { host, netns })
    stops.push(() => web.stop())
    const s3port = await freePort()
    const argv = [process.execPath, path.join(import.meta.dir, 's3-server.ts'), path.join(t.dir, `s3-${link}`), host, String(s3port)]
    if (netns) argv.unshift('ip', 'netns', 'exec', netns)
    const s3 = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] })
    const s3exited = new Promise<void>((r) => s3.once('exit', () => r()))
    stops.push(async () => {
      if (s3.exitCode === null) s3.kill('SIGTERM')
      await s3exited
    })
    await new Promise<void>((resolve, reject) => {
      s3.stdout!.on('data', (d) => String(d).includes('listening') && resolve())
      s3.once('exit', (c) => reject(new Error(`s3-server exited with ${c}`)))
    })
    const endpoint = `http://${host}:${s3port}`
    if (transports.includes('s3'))
      for (const name of objects) {
        const r = await aws.fetch(`${endpoint}/bench/${rel(name)}`, { method: 'PUT', body: new Uint8Array(readFileSync(files[name]!.file)) })
        if (r.status !== 200) throw new Error(`PUT ${name}: ${r.status}`)
      }
    const smbd = await startSmbd(www, path.join(t.dir, `smbd-${link}`), { host, netns })
    stops.push(() => smbd.stop())
    return { web: web.base, s3: endpoint, smb: { base: smbd.base, host, port: smbd.port } }
  }
  const servers: Partial<Record<string, Servers>> = {}
  let shape = ''
  if (links.includes('loopback')) servers.loopback = await startServers('loopback', '127.0.0.1')
  if (links.includes('shaped')) {
    const link = await createShapedLink(t.dir)
    stops.push(() => link.remove())
    shape = link.shape
    servers.shaped = await startServers('shaped', link.nsAddr, link.netns)
  }

  await ensureLibvirt()
  const srv = await startServer('bun', t.dir, { MIGRATOR_DOMAIN_TYPE: 'qemu' })
  stops.push(async () => {
    await srv.stop()
  })
  const s3cred = (
    await call(srv.base, 'POST', '/remote-credentials', { name: 's3', kind: 's3', access_key_id: KEYS.accessKeyId, secret_access_key: KEYS.secretAccessKey })
  ).body.id
  const smbcred = (await call(srv.base, 'POST', '/remote-credentials', { name: 'smb', kind: 'smb', ...SMBD_USER })).body.id
  const refOf = (sv: Servers, tr: string, name: string): Record<string, unknown> =>
    tr === 'http'
      ? { kind: 'offline_url', url: `${sv.web}/${rel(name)}` }
      : tr === 's3'
        ? { kind: 'offline_url', url: `s3://bench/${rel(name)}`, s3: { endpoint: sv.s3 }, credential_id: s3cred }
        : { kind: 'offline_url', url: `${sv.smb.base}/${rel(name)}`, credential_id: smbcred }

  const dl = path.join(t.dir, 'download.bin')
  const converted = path.join(t.dir, 'converted.raw')
  /**
   * The administrator's way without the migrator, after the download: `qemu-img convert` of the
   * downloaded image to a raw volume (`-t writeback`: flushed at its end, as the job's volume
   * is). Seconds; null for an object whose disk is a member of an archive.
   */
  const convertDownload = (name: string): number | null => {
    const f = files[name]!
    if (f.member) return null
    const t0 = performance.now()
    execFileSync('qemu-img', ['convert', '-t', 'writeback', '-f', f.format, '-O', 'raw', dl, converted])
    const sec = (performance.now() - t0) / 1000
    if (sha256File(converted) !== expect[name]!.disk) {
      failed = true
      console.log(`MISMATCH: qemu-img convert of the ${name} download`)
    }
    return sec
  }
  /** The transport's own client downloads the object to a file; returns seconds. */
  const download = (sv: Servers, tr: string, name: string): number => {
    const t0 = performance.now()
    const r =
      tr === 'http'
        ? spawnSync('curl', ['-sSf', '-o', dl, `${sv.web}/${rel(name)}`], { encoding: 'utf8' })
        : tr === 's3'
          ? spawnSync(
              'curl',
              // S3 (and s3rver) require x-amz-content-sha256 on a SigV4 request; curl 7.88 does not add it
              [
                '-sSf',
                '--aws-sigv4',
                'aws:amz:us-east-1:s3',
                '--user',
                `${KEYS.accessKeyId}:${KEYS.secretAccessKey}`,
                '-H',
                'x-amz-content-sha256: UNSIGNED-PAYLOAD',
                '-o',
                dl,
                `${sv.s3}/bench/${rel(name)}`,
              ],
              { encoding: 'utf8' },
            )
          : spawnSync(
              'smbclient',
              ['-p', String(sv.smb.port), '-U', `${SMBD_USER.username}%${SMBD_USER.password}`, `//${sv.smb.host}/exports`, '-c', `get "${rel(name)}" "${dl}"`],
              { encoding: 'utf8' },
            )
    const sec = (performance.now() - t0) / 1000
    if (r.status !== 0) throw new Error(`${tr} download: ${r.stderr}${r.stdout}`)
    if (sha256File(dl) !== expect[name]!.object) {
      failed = true
      console.log(`MISMATCH: ${tr} download of ${name}`)
    }
    return sec
  }
  let runNo = 0
  /** A job imports the object over `tr`; returns its copy phase in seconds. */
  const job = async (sv: Servers, tr: string, name: string): Promise<number> => {
    const stream = openStream(srv.base)
    await stream.ready
    const kind = name === 'ova' ? 'ova_archive' : 'qcow2'
    const j = await submit(srv.base, {
      source: { Offline: kind },
      source_ref: refOf(sv, tr, name),
      mode: 'Cold',
      name: `migbench-remote-${++runNo}`,
      start: false,
    })
    const done = await waitJob(srv.base, j.id, undefined, 900_000)
    stream.close()
    if (done.state !== 'Completed') throw new Error(`${tr} ${name}: job ended ${done.state}: ${JSON.stringify(done.last_error)}`)
    const sec = copyPhaseSeconds(stream.events, j.id)
    const vol = volumePath(t.dir, j.id, done.progress.disks[0].label)
    if (sha256File(vol) !== expect[name]!.disk) {
      failed = true
      console.log(`MISMATCH: ${tr} job of ${name}`)
    }
    return sec
  }
  /** Removes every job's volume and the download: each timed run starts without the other side's output. */
  const clearOutputs = async () => {
    rmSync(dl, { force: true })
    rmSync(converted, { force: true })
    rmSync(path.join(t.dir, 'volumes', 'migrations'), { recursive: true, force: true })
    await cleanupDomains('migbench-remote-')
  }

  const rows: string[] = []
  const load = () =>
    execFileSync('uptime', { encoding: 'utf8' })
      .trim()
      .replace(/^.*load average: /, '')
  const mbps = (bytes: number, s: number) => (bytes / s / 1e6).toFixed(0)
  console.log(`load average before: ${load()}`)
  for (const link of links)
    for (const name of objects)
      for (const tr of transports) {
        const sv = servers[link]!
        const ours: number[] = []
        const theirs: number[] = []
        const fetchConvert: number[] = []
        const before = load()
        const settle = async () => {
          await clearOutputs()
          execFileSync('sync')
          await new Promise((r) => setTimeout(r, 500))
        }
        await alternate(
          reps,
          async () => {
            await settle()
            const d = download(sv, tr, name)
            theirs.push(d)
            const c = convertDownload(name)
            if (c !== null) fetchConvert.push(d + c)
          },
          async () => {
            await settle()
            ours.push(await job(sv, tr, name))
          },
        )
        await clearOutputs()
        const b = expect[name]!.bytes
        const ref = tr === 'http' ? 'curl -o' : tr === 's3' ? 'curl --aws-sigv4' : 'smbclient get'
        const ratio = (a: number, z: number) => (z / a).toFixed(2)
        rows.push(
          `${link.padEnd(8)} ${name.padEnd(6)} ${tr.padEnd(5)} ${b.toLocaleString('en-US').padStart(15)}  migrator best ${mbps(b, Math.min(...ours)).padStart(5)} median ${mbps(b, median(ours)).padStart(5)} MB/s   ${ref.padEnd(16)} best ${mbps(b, Math.min(...theirs)).padStart(5)} median ${mbps(b, median(theirs)).padStart(5)} MB/s   ratio best ${ratio(Math.min(...ours), Math.min(...theirs))} median ${ratio(median(ours), median(theirs))}   load ${before} -> ${load()}`,
        )
        if (fetchConvert.length)
          rows.push(
            `${''.padEnd(8)} ${''.padEnd(6)} ${''.padEnd(5)} ${''.padStart(15)}  ${'download + qemu-img convert'.padEnd(45)} best ${mbps(b, Math.min(...fetchConvert)).padStart(5)} median ${mbps(b, median(fetchConvert)).padStart(5)} MB/s   ratio best ${ratio(Math.min(...ours), Math.min(...fetchConvert))} median ${ratio(median(ours), median(fetchConvert))}`,
          )
        console.log(rows.slice(fetchConvert.length ? -2 : -1).join('\n'))
        console.log(
          `  seconds: migrator ${ours.map((x) => x.toFixed(2)).join(' ')}; reference ${theirs.map((x) => x.toFixed(2)).join(' ')}; download + convert ${fetchConvert.map((x) => x.toFixed(2)).join(' ')}`,
        )
      }
  console.log(`\nload average after: ${load()}`)
  console.log(`object sizes in bytes on the server; ${reps} runs a side, interleaved; MB/s = object bytes / seconds (10^6); ratio = migrator / reference`)
  if (shape) console.log(`shaped: servers in a network namespace over a veth pair, each end ${shape}`)
  for (const r of rows) console.log(r)
  console.log(failed ? 'bytes: MISMATCH' : 'bytes: every download equals the object, every job volume equals qemu-img convert of the local object')
} finally {
  await cleanup()
}
if (failed) process.exitCode = 1
