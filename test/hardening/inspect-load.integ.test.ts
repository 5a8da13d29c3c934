/**
 * Bounded inspects under load: fifty concurrent inspects of 1 MB OVF envelopes (half with 200 000 elements,
 * refused before any tree is built; half with 45 000, parsed in the inspect pool's worker
 * threads) against the real server: its RSS grows by less than 200 MiB, `GET /migrations`
 * answers within 1 s throughout, and every inspect answers 200, 422 or 503 with `Retry-After`
 * (never 500).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { readdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { makeRawImage, buildInput } from '../helpers/inputs.ts'
import { RUNTIMES, startServer, type RunningServer } from '../helpers/server.ts'
import { tempDir } from '../helpers/tmp.ts'

function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return m ? Number(m[1]) * 1024 : 0
}

/** The OVF descriptor of `dir` with `elements` empty elements in an extra section, written as `name`. */
function padOvf(dir: string, name: string, elements: number): void {
  const ovf = 'heavy.ovf'
  const text = readFileSync(path.join(dir, ovf), 'utf8')
  const pad = `<Pad>${'<p/>'.repeat(elements)}</Pad>\n`
  writeFileSync(
    path.join(dir, name),
    text.replace(/<\/(\w+:)?Envelope>\s*$/, (m) => pad + m),
  )
}

for (const runtime of RUNTIMES) {
  describe(`inspect load under ${runtime}`, () => {
    const t = tempDir('mig-i12-load-')
    const root = path.join(t.dir, 'imports')
    let server: RunningServer
    beforeAll(async () => {
      const raw = makeRawImage(path.join(t.dir, 'd.raw'), 1 << 20)
      const built = buildInput('ovf_folder', root, 'heavy', [raw])
      padOvf(built.path, 'huge.ovf', 200_000)
      padOvf(built.path, 'big.ovf', 45_000)
      for (const f of readdirSync(built.path)) if (/^heavy\.(ovf|mf)$/.test(f)) writeFileSync(path.join(built.path, f), '') // keep one descriptor per request
      server = await startServer(runtime, t.dir)
    }, 240_000)
    afterAll(async () => {
      await server?.stop()
      t.cleanup()
    }, 60_000)

    test('fifty concurrent heavy inspects: bounded memory, the API keeps answering, no 500', async () => {
      const pid = server.child.pid!
      const before = rssBytes(pid)
      let peak = before
      let slowest = 0
      let done = false
      const statuses: Record<number, number> = {}
      const probe = (async () => {
        while (!done) {
          const t0 = performance.now()
          const r = await fetch(`${server.base}/migrations`)
          await r.arrayBuffer()
          expect(r.status).toBe(200)
          slowest = Math.max(slowest, performance.now() - t0)
          peak = Math.max(peak, rssBytes(pid))
          await new Promise((r) => setTimeout(r, 50))
        }
      })()
      const inspects = Array.from({ length: 50 }, async (_, i) => {
        const r = await fetch(`${server.base}/host-files/inspect`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ path: `heavy/${i % 2 ? 'huge' : 'big'}.ovf`, kind: 'ovf_folder' }),
        })
        const body = (await r.json()) as any
        statuses[r.status] = (statuses[r.status] ?? 0) + 1
        if (r.status === 503) {
          expect(Number(r.headers.get('retry-after'))).toBeGreaterThan(0)
          expect(body.error.code).toBe('E_MIG_CONFLICT')
        } else if (r.status === 422) {
          expect(body.error.code).toBe('E_MIG_MALFORMED_ARCHIVE')
          expect(i % 2 ? body.error.message : '').toContain(i % 2 ? 'XML elements' : '')
        } else expect(r.status).toBe(200)
      })
      await Promise.all(inspects)
      done = true
      await probe
      peak = Math.max(peak, rssBytes(pid))
      console.log(
        `${runtime}: RSS ${(before / 2 ** 20).toFixed(0)} -> peak ${(peak / 2 ** 20).toFixed(0)} MiB, slowest GET /migrations ${slowest.toFixed(0)} ms, statuses ${JSON.stringify(statuses)}`,
      )
      expect(statuses[500]).toBeUndefined()
      expect(statuses[200] ?? 0).toBeGreaterThan(0)
      expect(peak - before).toBeLessThan(200 * 2 ** 20)
      expect(slowest).toBeLessThan(1000)
    }, 300_000)
  })
}
