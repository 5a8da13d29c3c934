/**
 * Request and name guards: JSON bodies with a duplicate key, ZFS dataset names in
 * `destination.pool`, the import root itself as a plan path, an OVF without disks, and error
 * messages that name paths relative to the import root.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { redactHostPaths } from '../../lib/hostpath.ts'
import { inspectInput } from '../../lib/importers/index.ts'
import { checkPlanRefs } from '../../lib/jobs/submit.ts'
import { parseSubmitBody } from '../../lib/plan.ts'
import { duplicateJsonKey, readJson } from '../../runtime/http.ts'
import { buildInput, makeRawImage } from '../helpers/inputs.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const t = tempDir('mig-i12-small-')
const root = path.join(t.dir, 'imports')
mkdirSync(root, { recursive: true })
afterAll(() => t.cleanup())

const plan = (extra: Record<string, unknown> = {}) => ({
  plan: { source: { Offline: 'qcow2' }, source_ref: { kind: 'offline_host_path', path: 'x.qcow2' }, mode: 'Cold', ...extra },
})

describe('JSON bodies', () => {
  test('a duplicate key at any depth is refused with 400 E_MIG_BAD_REQUEST', async () => {
    expect(duplicateJsonKey('{"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]}')).toBeNull()
    expect(duplicateJsonKey('{"a":1,"a":2}')).toBe('a')
    expect(duplicateJsonKey('{"p":{"mode":"Cold","m\\u006fde":"Warm"}}')).toBe('mode')
    expect(duplicateJsonKey('{"s":"a\\"b","t":["{\\"x\\":1,\\"x\\":2}"]}')).toBeNull()
    const body = '{"plan":{"source":{"Offline":"qcow2"},"mode":"Cold","mode":"Warm"}}'
    const e = await thrown(() => readJson(new Request('http://x/', { method: 'POST', body })))
    expect(e.code).toBe('E_MIG_BAD_REQUEST')
    expect(e.status).toBe(400)
    expect(e.message).toContain('"mode" twice')
  })
})

describe('destination.pool by the ZFS naming rules', () => {
  test('valid dataset names pass', () => {
    for (const pool of ['tank', 'tank/vm', 'tank/a_b.c:d-e', 'Pool1/x/y']) expect(parseSubmitBody(plan({ destination: { pool } })).destination!.pool).toBe(pool)
  })
  test('traversal, empty components, snapshots and reserved pool names are refused', async () => {
    for (const pool of ['tank/../../x', 'tank/./x', 'tank//x', '/tank', 'tank/', 'tank@snap', 'tank#b', '1tank', 'mirror/x', 'c0t0d0', 'tank/x y', '-o']) {
      const e = await thrown(() => parseSubmitBody(plan({ destination: { pool } })))
      expect([pool, e.code]).toEqual([pool, 'E_MIG_INVALID_PLAN'])
      expect(JSON.stringify(e.details)).toContain('plan.destination.pool')
    }
  })
})

describe('plan paths', () => {
  test('the import root itself is not a plan path', async () => {
    for (const p of ['.', root, `${root}/`, 'a/..']) {
      const e = await thrown(() =>
        checkPlanRefs(parseSubmitBody({ plan: { ...plan().plan, source_ref: { kind: 'offline_host_path', path: p } } }), null as never, root, new Date()),
      )
      expect([p, e.code]).toEqual([p, 'E_MIG_HOST_PATH_REJECTED'])
    }
  })
})

describe('inspect', () => {
  test('an OVF with no disks is refused at inspect, not by the job', async () => {
    const raw = makeRawImage(path.join(t.dir, 'd.raw'), 1 << 20)
    const built = buildInput('ovf_folder', root, 'nodisk', [raw])
    for (const f of readdirSync(built.path)) if (f.endsWith('.mf') || f.endsWith('.vmdk')) rmSync(path.join(built.path, f))
    const ovf = path.join(built.path, readdirSync(built.path).find((f) => f.endsWith('.ovf'))!)
    const text = readFileSync(ovf, 'utf8')
    const stripped = text
      .replace(/<File [^>]*\/>/g, '')
      .replace(/<Disk [^>]*\/>/g, '')
      .replace(/<Item>(?:(?!<\/Item>)[\s\S])*?<rasd:ResourceType>17<\/rasd:ResourceType>[\s\S]*?<\/Item>/g, '')
    expect(stripped).not.toContain('<Disk ')
    writeFileSync(ovf, stripped)
    const e = await thrown(() => inspectInput(built.path, { importRoot: root }, 'ovf_folder'))
    expect(e.code).toBe('E_MIG_MALFORMED_ARCHIVE')
    expect(e.message).toContain('no disks')
  })

  test('messages name paths relative to the import root, never the absolute server paths', () => {
    const data = t.dir
    expect(redactHostPaths(`${root}/vms/a.ovf: bad header; import root ${root}`, root, data)).toBe('vms/a.ovf: bad header; import root .')
    expect(redactHostPaths(`${data}/volumes/j/x.img: write failed`, root, data)).toBe('<data dir>/volumes/j/x.img: write failed')
  })
})
