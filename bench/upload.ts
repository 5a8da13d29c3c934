/**
 * Upload benchmark (issue "Service foundation"): streams a multipart upload of SIZE bytes
 * (default 2 GiB, generated on the fly, never held in memory) to a real server under each
 * runtime, and prints side by side: the server's MB/s and peak RSS (VmHWM), and the reference,
 * the same bytes written straight to a local file with SHA-256 by this process.
 *
 *   bun bench/upload.ts [sizeGiB] [runtimes]     e.g. bun bench/upload.ts 2 bun,node
 */
import { createHash, randomBytes } from 'node:crypto'
import { createWriteStream, readFileSync, rmSync } from 'node:fs'
import { request } from 'node:http'
import * as path from 'node:path'
import { startServer } from '../test/helpers/server.ts'
import { tokenFor } from '../test/helpers/test-auth.ts'
import { tempDir } from '../test/helpers/tmp.ts'

const GiB = 1024 ** 3
const size = Math.round(Number(process.argv[2] ?? 2) * GiB)
const runtimes = (process.argv[3] ?? 'bun,node').split(',') as Array<'bun' | 'node'>
const block = randomBytes(1024 * 1024)

/** Yields `size` bytes as 1 MiB slices of one random block. */
function* payload(): Generator<Buffer> {
  for (let left = size; left > 0; left -= block.length) yield left >= block.length ? block : block.subarray(0, left)
}

function vmHwmBytes(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return m ? Number(m[1]) * 1024 : NaN
}

async function reference(dir: string): Promise<number> {
  const t0 = performance.now()
  const hash = createHash('sha256')
  const out = createWriteStream(path.join(dir, 'ref.bin'))
  for (const b of payload()) {
    hash.update(b)
    if (!out.write(b)) await new Promise((r) => out.once('drain', () => r(undefined)))
  }
  await new Promise((r) => out.end(() => r(undefined)))
  hash.digest('hex')
  const s = (performance.now() - t0) / 1000
  rmSync(path.join(dir, 'ref.bin'))
  return size / s / 1e6
}

async function upload(base: string): Promise<{ mbps: number; status: number; body: string }> {
  const boundary = 'bench' + randomBytes(8).toString('hex')
  const head = Buffer.from(
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="bench.img"\r\nContent-Type: application/octet-stream\r\n\r\n`,
  )
  const tail = Buffer.from(`\r\n--${boundary}--\r\n`)
  const u = new URL(base + '/uploads')
  const t0 = performance.now()
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname,
        method: 'POST',
        headers: {
          'content-type': `multipart/form-data; boundary=${boundary}`,
          'content-length': head.length + size + tail.length,
          authorization: `Bearer ${tokenFor(base)}`,
        },
      },
      (res) => {
        let body = ''
        res.on('data', (d) => (body += d))
        res.on('end', () => resolve({ mbps: size / ((performance.now() - t0) / 1000) / 1e6, status: res.statusCode ?? 0, body }))
      },
    )
    req.on('error', reject)
    ;(async () => {
      req.write(head)
      for (const b of payload()) if (!req.write(b)) await new Promise((r) => req.once('drain', r))
      req.end(tail)
    })()
  })
}

const rows: string[][] = [['runtime', 'size', 'upload MB/s', 'reference MB/s (local write+sha256)', 'server peak RSS (MiB)', 'status']]
for (const runtime of runtimes) {
  const t = tempDir('mig-bench-upload-')
  const srv = await startServer(runtime, t.dir, { MIGRATOR_LOG_LEVEL: 'warn' })
  try {
    const ref = await reference(t.dir)
    const up = await upload(srv.base)
    const rss = vmHwmBytes(srv.child.pid!)
    if (up.status !== 201) throw new Error(`upload failed: ${up.status} ${up.body}`)
    rows.push([runtime, `${(size / GiB).toFixed(2)} GiB`, up.mbps.toFixed(0), ref.toFixed(0), (rss / 1024 / 1024).toFixed(0), String(up.status)])
  } finally {
    await srv.stop()
    t.cleanup()
  }
}
const widths = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)))
for (const r of rows) console.log(r.map((c, i) => c.padEnd(widths[i])).join('  '))
