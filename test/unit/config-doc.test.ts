/**
 * docs/configuration.md documents the configuration once: its table is the one
 * scripts/config-doc.ts generates from `VARIABLES` in runtime/config.ts. When a variable is added,
 * removed or its doc or default changes, this fails until `bun scripts/config-doc.ts` is run.
 */
import { describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { VARIABLES } from '../../runtime/config.ts'
import { CONFIG_DOC, configTable, renderConfigDoc } from '../../scripts/config-doc.ts'

describe('docs/configuration.md', () => {
  const doc = readFileSync(CONFIG_DOC, 'utf8')

  test('its table is the one generated from VARIABLES (run `bun scripts/config-doc.ts` when this fails)', () => {
    expect(doc).toContain(configTable())
    expect(renderConfigDoc(doc)).toBe(doc)
  })

  test('the table has one row per variable, each with a default and a meaning', () => {
    const rows = configTable()
      .split('\n')
      .filter((l) => l.startsWith('| `'))
    expect(rows.map((r) => /^\| `([A-Z0-9_]+)`/.exec(r)?.[1])).toEqual(Object.keys(VARIABLES))
    for (const r of rows) expect(r).toMatch(/^\| `[A-Z0-9_]+` \| [^|]+ \| .{3,} \|$/)
  })

  test('a host-dependent default is taken from the doc, a fixed one from the schema', () => {
    expect(configTable()).toContain('| `MIGRATOR_DOMAIN_TYPE` | kvm when /dev/kvm exists, else qemu |')
    expect(configTable()).toContain('| `MIGRATOR_FLUSH_EVERY_BYTES` | `268435456` (256 MiB) |')
    expect(configTable()).toContain('| `MIGRATOR_SOCKET` | /run/\\<appliance>/api.sock |')
  })

  test('no variable is documented that the schema does not define', () => {
    const documented = new Set([...doc.matchAll(/`(MIGRATOR_[A-Z0-9_]+)`/g)].map((m) => m[1]))
    const extra = [...documented].filter((v) => !(v in VARIABLES) && v !== 'MIGRATOR_GUEST_CACHE')
    expect(extra).toEqual([])
  })
})
