/**
 * Remote-input benchmark (docs/remote-sources.md): the migrator importing the same object over
 * HTTP (nginx), S3 (s3rver) and SMB (smbd), beside a plain download of that object by the
 * transport's own client: `curl -o` (HTTP), one signed `GET` by `aws4fetch`'s `AwsClient`
 * streamed to a file (S3), `smbclient -c get` (SMB). All servers run here on 127.0.0.1
 * (test/helpers/nginx.ts, s3rver, test/helpers/smbd.ts), serving one directory.
 *
 * Objects: a qcow2 of SIZE GiB virtual with half its 64 KiB clusters random data
 * ({@link makeHalfFullQcow2}), and a one-disk OVA of the same disk (stream-optimized VMDK,
 * `fixtures/inputs.ts`). Ours: a job (`offline_url`, `start: false`) of the real server (Bun)
 * and its worker into the file sink; its time is the job's `CopyingFull` phase from the SSE
 * stream. Theirs: the download's wall time. MB/s are of the object's size on the server. Each
 * side runs `--reps` times (default 3), the order alternating; best and median printed.
 * Bytes equal: every download's sha256 is the object's, every job's volume the sha256 of
 * `qemu-img convert` of the local object (a mismatch sets a failing exit code).
 *
 *   ./node_modules/.bin/bun bench/remote.ts [--size 2] [--reps 3] [--objects qcow2,ova] [--transports http,s3,smb]
 * Needs root, qemu-utils, nginx-light, samba, smbclient, curl and libvirt (started when not running).
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { createWriteStream, mkdirSync, readFileSync, rmSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { AwsClient } from 'aws4fetch'
import S3rver from 's3rver'
import { buildInput } from '../fixtures/inputs.ts'
import { call, openStream, submit, volumePath, waitJob } from '../test/helpers/jobs.ts'
import { cleanupDomains, ensureLibvirt } from '../test/helpers/libvirt.ts'
import { startNginx } from '../test/helpers/nginx.ts'
import { freePort, startServer } from '../test/helpers/server.ts'
import { SMBD_USER, startSmbd } from '../test/helpers/smbd.ts'
import { tempDir } from '../test/helpers/tmp.ts'
import { alternate, cliArg, copyPhaseSeconds, makeHalfFullQcow2, median, onInterrupt, sha256File } from './source.ts'

const GiB = 1024 ** 3
const size = Math.round(Number(cliArg('size', '2')) * GiB)
const reps = Number(cliArg('reps', '3'))
const objects = cliArg('objects', 'qcow2,ova').split(',')
const transports = cliArg('transports', 'http,s3,smb').split(',') as Array<'http' | 's3' | 'smb'>
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

  const web = await startNginx(www, path.join(t.dir, 'nginx'))
  stops.push(() => web.stop())
  const s3port = await freePort()
  const s3 = new S3rver({
    address: '127.0.0.1',
    port: s3port,
    directory: path.join(t.dir, 's3'),
    silent: true,
    vhostBuckets: false,
    configureBuckets: [{ name: 'bench' }],
  })
  await s3.run()
  stops.push(async () => {
    await s3.close()
  })
  const endpoint = `http://127.0.0.1:${s3port}`
  const aws = new AwsClient({ ...KEYS, service: 's3', region: 'us-east-1' })
  const smbd = await startSmbd(www, path.join(t.dir, 'smbd'))
  stops.push(() => smbd.stop())
  const rel = (name: string) => path.relative(www, files[name]!.file)
  if (transports.includes('s3'))
    for (const name of objects) {
      const r = await aws.fetch(`${endpoint}/bench/${rel(name)}`, { method: 'PUT', body: new Uint8Array(readFileSync(files[name]!.file)) })
      if (r.status !== 200) throw new Error(`PUT ${name}: ${r.status}`)
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
  const refOf = (tr: string, name: string): Record<string, unknown> =>
    tr === 'http'
      ? { kind: 'offline_url', url: `${web.base}/${rel(name)}` }
      : tr === 's3'
        ? { kind: 'offline_url', url: `s3://bench/${rel(name)}`, s3: { endpoint }, credential_id: s3cred }
        : { kind: 'offline_url', url: `${smbd.base}/${rel(name)}`, credential_id: smbcred }

  const dl = path.join(t.dir, 'download.bin')
  /** The transport's own client downloads the object to a file; returns seconds. */
  const download = async (tr: string, name: string): Promise<number> => {
    rmSync(dl, { force: true })
    const t0 = performance.now()
    if (tr === 'http') execFileSync('curl', ['-sSf', '-o', dl, `${web.base}/${rel(name)}`])
    else if (tr === 's3') {
      const r = await aws.fetch(`${endpoint}/bench/${rel(name)}`)
      if (r.status !== 200 || !r.body) throw new Error(`GET ${name}: ${r.status}`)
      await pipeline(Readable.fromWeb(r.body as never), createWriteStream(dl))
    } else {
      const r = spawnSync(
        'smbclient',
        ['-p', String(smbd.port), '-U', `${SMBD_USER.username}%${SMBD_USER.password}`, '//127.0.0.1/exports', '-c', `get "${rel(name)}" "${dl}"`],
        { encoding: 'utf8' },
      )
      if (r.status !== 0) throw new Error(`smbclient get: ${r.stderr}${r.stdout}`)
    }
    const sec = (performance.now() - t0) / 1000
    if (sha256File(dl) !== expect[name]!.object) {
      failed = true
      console.log(`MISMATCH: ${tr} download of ${name}`)
    }
    rmSync(dl)
    return sec
  }
  let runNo = 0
  /** A job imports the object over `tr`; returns its copy phase in seconds. */
  const job = async (tr: string, name: string): Promise<number> => {
    const stream = openStream(srv.base)
    await stream.ready
    const kind = name === 'ova' ? 'ova_archive' : 'qcow2'
    const j = await submit(srv.base, { source: { Offline: kind }, source_ref: refOf(tr, name), mode: 'Cold', name: `migbench-remote-${++runNo}`, start: false })
    const done = await waitJob(srv.base, j.id, undefined, 900_000)
    stream.close()
    if (done.state !== 'Completed') throw new Error(`${tr} ${name}: job ended ${done.state}: ${JSON.stringify(done.last_error)}`)
    const sec = copyPhaseSeconds(stream.events, j.id)
    const vol = volumePath(t.dir, j.id, done.progress.disks[0].label)
    if (sha256File(vol) !== expect[name]!.disk) {
      failed = true
      console.log(`MISMATCH: ${tr} job of ${name}`)
    }
    rmSync(path.join(t.dir, 'volumes', 'migrations', j.id), { recursive: true, force: true })
    await cleanupDomains('migbench-remote-')
    return sec
  }

  const rows: string[] = []
  const mbps = (bytes: number, s: number) => (bytes / s / 1e6).toFixed(0)
  for (const name of objects)
    for (const tr of transports) {
      const ours: number[] = []
      const theirs: number[] = []
      const settle = async () => {
        execFileSync('sync')
        await new Promise((r) => setTimeout(r, 500))
      }
      await alternate(
        reps,
        async () => {
          await settle()
          theirs.push(await download(tr, name))
        },
        async () => {
          await settle()
          ours.push(await job(tr, name))
        },
      )
      const b = expect[name]!.bytes
      const ref = tr === 'http' ? 'curl -o' : tr === 's3' ? 'aws4fetch GET' : 'smbclient get'
      rows.push(
        `${name.padEnd(6)} ${tr.padEnd(5)} ${b.toLocaleString('en-US').padStart(15)}  migrator best ${mbps(b, Math.min(...ours)).padStart(5)} median ${mbps(b, median(ours)).padStart(5)} MB/s   ${ref.padEnd(14)} best ${mbps(b, Math.min(...theirs)).padStart(5)} median ${mbps(b, median(theirs)).padStart(5)} MB/s`,
      )
      console.log(rows.at(-1))
    }
  console.log(`\nobject sizes in bytes on the server; ${reps} runs a side, interleaved; MB/s = object bytes / seconds (10^6)`)
  for (const r of rows) console.log(r)
  console.log(failed ? 'bytes: MISMATCH' : 'bytes: every download equals the object, every job volume equals qemu-img convert of the local object')
} finally {
  await cleanup()
}
if (failed) process.exitCode = 1
