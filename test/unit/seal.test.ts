import { afterAll, describe, expect, test } from 'bun:test'
import { chmodSync, statSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { Sealer } from '../../lib/crypto/seal.ts'
import { KeyringError, loadOrCreateKey } from '../../lib/crypto/keyring.ts'
import { tempDir, thrown } from '../helpers/tmp.ts'

const t = tempDir()
afterAll(() => t.cleanup())

describe('AES-256-GCM sealing (spec 5.3)', () => {
  const key = Buffer.alloc(32, 7)
  const s = new Sealer(key)

  test('round trip, bound to its owner', () => {
    const env = s.seal('hunter2', 'src-1')
    expect(env).not.toContain('hunter2')
    expect(s.open(env, 'src-1')).toBe('hunter2')
    expect(thrown(() => s.open(env, 'src-2'))).resolves.toMatchObject({ code: 'E_MIG_INTERNAL' })
  })

  test('a fresh 96-bit nonce per seal', () => {
    const a = Buffer.from(s.seal('same', 'x'), 'base64')
    const b = Buffer.from(s.seal('same', 'x'), 'base64')
    expect(a[0]).toBe(1)
    expect(a.length).toBe(1 + 12 + 4 + 16)
    expect(a.subarray(1, 13).equals(b.subarray(1, 13))).toBe(false)
  })

  test('tampering and another key are refused', async () => {
    const raw = Buffer.from(s.seal('secret', 'x'), 'base64')
    raw[14] ^= 1
    expect((await thrown(() => s.open(raw.toString('base64'), 'x'))).code).toBe('E_MIG_INTERNAL')
    const other = new Sealer(Buffer.alloc(32, 8))
    expect((await thrown(() => other.open(s.seal('secret', 'x'), 'x'))).code).toBe('E_MIG_INTERNAL')
    expect((await thrown(() => s.open('AAAA', 'x'))).code).toBe('E_MIG_INTERNAL')
  })
})

describe('key file (spec 1.5)', () => {
  test('created on first use: 32 bytes, 0600, in a 0700 directory; then reloaded', () => {
    const file = path.join(t.dir, 'k1', 'keyring', 'migrator.key')
    const k = loadOrCreateKey(file)
    expect(k.length).toBe(32)
    expect(statSync(file).mode & 0o777).toBe(0o600)
    expect(statSync(path.dirname(file)).mode & 0o777).toBe(0o700)
    expect(loadOrCreateKey(file).equals(k)).toBe(true)
  })

  test('refuses a key readable by group or others', () => {
    const file = path.join(t.dir, 'k2.key')
    writeFileSync(file, Buffer.alloc(32, 1), { mode: 0o644 })
    chmodSync(file, 0o644)
    expect(() => loadOrCreateKey(file)).toThrow(KeyringError)
    expect(() => loadOrCreateKey(file)).toThrow(/mode 644/)
  })

  test('refuses a key of the wrong size', () => {
    const file = path.join(t.dir, 'k3.key')
    writeFileSync(file, Buffer.alloc(31, 1), { mode: 0o600 })
    expect(() => loadOrCreateKey(file)).toThrow(/holds 31 bytes/)
  })
})
