/**
 * `migrator import <path|url>`: brings an offline input in end to end. An `http(s)://`,
 * `s3://bucket/key` or `smb://server/share/file` URL is inspected remotely (`POST /remote-files/inspect`) and imported straight from the server
 * (`source_ref.kind: "offline_url"`, docs/remote-sources.md), with `--credential`, `--ca-file`,
 * `--thumbprint`, `--insecure`. A path the server accepts inside its import root is inspected in
 * place; any other local file is uploaded (progress bar, SHA-256 checked by the server) and
 * inspected as an upload. Then the plan is submitted and followed like `watch`.
 */
import { existsSync, readFileSync, statSync } from 'node:fs'
import { resolve } from 'node:path'
import cliProgress from 'cli-progress'
import type { Command } from 'commander'
import { ApiError, type Api } from '../api.ts'
import { bytes } from '../output.ts'
import { apiOf, globals, run } from './common.ts'
import { watchJob } from './watch.ts'

/**
 * Uploads `file` with its progress: a bar on a terminal; otherwise (pipes, logs) a line
 * `upload: <sent> of <total> (<pct>%)` at every 10 % step and at least every second; nothing but
 * the final NDJSON record with `json`. Returns the upload resource.
 */
async function uploadWithProgress(api: Api, file: string, json: boolean): Promise<any> {
  const total = statSync(file).size
  const tty = process.stdout.isTTY === true && !json
  const bar = tty
    ? new cliProgress.SingleBar({ format: 'upload |{bar}| {percentage}% {value_h}/{total_h} {rate}/s', hideCursor: true }, cliProgress.Presets.shades_classic)
    : null
  const started = Date.now()
  bar?.start(Math.max(total, 1), 0, { total_h: bytes(total), value_h: bytes(0), rate: bytes(0) })
  if (!bar && !json) process.stdout.write(`upload: ${file} (${bytes(total)}) to ${api.baseUrl}\n`)
  let lastLine = 0
  let lastStep = 0
  const upload = await api.upload(file, (sent) => {
    const rate = bytes(Math.round(sent / Math.max(0.001, (Date.now() - started) / 1000)))
    if (bar) return void bar.update(sent, { value_h: bytes(sent), rate })
    if (json) return
    const pct = total === 0 ? 100 : Math.floor((sent * 100) / total)
    const step = Math.floor(pct / 10)
    if (step > lastStep || Date.now() - lastLine >= 1000 || sent === total) {
      lastStep = step
      lastLine = Date.now()
      process.stdout.write(`upload: ${bytes(sent)} of ${bytes(total)} (${pct}%) ${rate}/s\n`)
    }
  })
  bar?.stop()
  if (json) process.stdout.write(JSON.stringify({ event: 'uploaded', upload }) + '\n')
  else process.stdout.write(`uploaded ${upload.filename} as ${upload.id} (${bytes(upload.size_bytes)}, sha256 ${upload.sha256})\n`)
  return upload
}

/** Options of a remote input: a registered credential's id and the TLS trust. */
interface RemoteOptions {
  credential?: string
  caFile?: string
  thumbprint?: string
  insecure?: boolean
}

/** The `offline_url` source_ref of `url` with the command line's credential and TLS trust. */
function remoteRef(url: string, o: RemoteOptions): Record<string, unknown> {
  const tls = {
    ...(o.caFile ? { ca_pem: readFileSync(o.caFile, 'utf8') } : {}),
    ...(o.thumbprint ? { thumbprint: o.thumbprint } : {}),
    ...(o.insecure ? { insecure: true } : {}),
  }
  return { kind: 'offline_url', url, ...(o.credential ? { credential_id: o.credential } : {}), ...(Object.keys(tls).length ? { tls } : {}) }
}

/** Inspects `target` remotely, in place or after uploading it; returns the inspect result and the plan's source_ref. */
async function locate(api: Api, target: string, kind: string | undefined, json: boolean, remote: RemoteOptions): Promise<{ inspected: any; sourceRef: any }> {
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(target)) {
    const { kind: _k, ...ref } = remoteRef(target, remote)
    const inspected = await api.call('POST', '/remote-files/inspect', { ...ref, ...(kind ? { kind } : {}) })
    return { inspected, sourceRef: remoteRef(target, remote) }
  }
  const local = existsSync(target) ? resolve(target) : null
  const asHostPath = local ?? target
  try {
    const inspected = await api.call('POST', '/host-files/inspect', { path: asHostPath, ...(kind ? { kind } : {}) })
    return { inspected, sourceRef: { kind: 'offline_host_path', path: asHostPath } }
  } catch (e) {
    const outsideRoot = e instanceof ApiError && (e.code === 'E_MIG_HOST_PATH_REJECTED' || e.code === 'E_MIG_NOT_FOUND')
    if (!outsideRoot || local === null || !statSync(local).isFile()) throw e
  }
  const upload = await uploadWithProgress(api, local, json)
  const inspected = await api.call('POST', `/uploads/${upload.id}/inspect`)
  return { inspected, sourceRef: { kind: 'upload', upload_id: upload.id } }
}

/** Registers `import`. */
export function register(program: Command): void {
  program
    .command('import <path>')
    .description(
      'inspect (uploading a local file when needed; an http(s)://, s3:// or smb:// URL is read from its server), submit and follow an offline migration',
    )
    .option('--kind <kind>', 'importer kind instead of detection')
    .option('--credential <id>', 'a URL: the registered credential (POST /remote-credentials) to send')
    .option('--ca-file <pem>', 'a https URL: trust this CA (PEM file)')
    .option('--thumbprint <sha256>', "a https URL: trust the server's certificate by its SHA-256 thumbprint")
    .option('--insecure', 'a https URL: do not verify the certificate')
    .option('--name <name>', 'target domain name')
    .option('--no-start', 'define the domain but do not start it')
    .option('--live-import', 'boot the guest here at once from its source while its disks copy (docs/live-import.md)')
    .option('--no-watch', 'return once the plan is submitted')
    .action((target: string, o: { kind?: string; name?: string; start: boolean; watch: boolean; liveImport?: boolean } & RemoteOptions, cmd: Command) =>
      run(async () => {
        const g = globals(cmd)
        const api = apiOf(cmd)
        const { inspected, sourceRef } = await locate(api, target, o.kind, g.json, o)
        const m = inspected.manifest
        if (g.json) process.stdout.write(JSON.stringify({ event: 'inspected', ...inspected }) + '\n')
        else {
          process.stdout.write(
            `${inspected.detected_kind}: ${m.name}, ${m.cpu.count} vCPU, ${bytes(m.memory_bytes)}, ${m.firmware}, guest ${m.guest_os.family}\n`,
          )
          for (const d of m.disks) process.stdout.write(`  disk ${d.label}: ${bytes(d.capacity_bytes)} ${d.disk_format}\n`)
          for (const w of m.warnings) process.stdout.write(`  warning: ${w}\n`)
        }
        const plan = {
          source: { Offline: inspected.detected_kind },
          source_ref: sourceRef,
          mode: 'Cold',
          ...(o.name ? { name: o.name } : {}),
          ...(o.start ? {} : { start: false }),
          ...(o.liveImport ? { live_import: true } : {}),
        }
        const job = await api.call('POST', '/migrations', { plan })
        if (g.json) process.stdout.write(JSON.stringify({ event: 'submitted', id: job.id }) + '\n')
        else process.stdout.write(`migration ${job.id} submitted\n`)
        if (o.watch) process.exit(await watchJob(api, job.id, g.json))
      }),
    )
}
