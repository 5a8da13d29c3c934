/**
 * A full or read-only store gives E_MIG_PERSIST_FAILED (503) and the server keeps answering.
 * The store directory is a real 8 MiB ext4 filesystem on a loop device (mounted as root with
 * errors=remount-ro): filled up for the full case, and switched to read-only at runtime through
 * ext4's `trigger_fs_error` for the read-only case (what a failing disk does to a live server).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync } from 'node:child_process'
import { mkdirSync, openSync, writeSync, closeSync, rmSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { testApp, req, errorOf, tempDir } from '../helpers/env.ts'
import type { App } from '../../runtime/app.ts'

const t = tempDir('mig-persist-')
const dbDir = path.join(t.dir, 'data', 'migrator.db')
let app: App
let appCleanup: () => Promise<void>

function fill(dir: string): void {
  const fd = openSync(path.join(dir, 'filler'), 'w')
  const block = Buffer.alloc(64 * 1024, 1)
  try {
    for (;;) writeSync(fd, block)
  } catch {
    // ENOSPC: the filesystem is full
  } finally {
    closeSync(fd)
  }
}

beforeAll(async () => {
  mkdirSync(dbDir, { recursive: true })
  const image = path.join(t.dir, 'store.img')
  execFileSync('truncate', ['-s', '8M', image])
  execFileSync('mkfs.ext4', ['-q', image])
  execFileSync('mount', ['-o', 'loop,errors=remount-ro', image, dbDir])
  const a = await testApp({ MIGRATOR_DATA_DIR: path.join(t.dir, 'data') })
  app = a.app
  appCleanup = a.cleanup
})
afterAll(async () => {
  await appCleanup?.() // closes the app and removes testApp's own temp dir
  try {
    execFileSync('umount', ['-l', dbDir])
  } catch {}
  rmSync(t.dir, { recursive: true, force: true })
})

const source = (name: string) => ({ name, kind: 'vim_api', endpoint: 'vc.example.test', username: 'u', password: 'p' })

describe('store failures (E_MIG_PERSIST_FAILED)', () => {
  test('full filesystem: writes fail with 503, reads and other endpoints keep answering, recovery after space returns', async () => {
    expect((await app.fetch(req('POST', '/sources', source('before')))).status).toBe(201)
    fill(dbDir)
    let failed = false
    for (let i = 0; i < 200 && !failed; i++) {
      const res = await app.fetch(req('POST', '/sources', { ...source(`s${i}`), endpoint: `h${i}.example.test`, username: 'x'.repeat(200) }))
      if (res.status !== 201) {
        const e = await errorOf(res)
        expect([e.status, e.code]).toEqual([503, 'E_MIG_PERSIST_FAILED'])
        expect(e.message).toMatch(/store: create source failed/)
        failed = true
      }
    }
    expect(failed).toBe(true)
    expect((await app.fetch(req('GET', '/host-files'))).status).toBe(200)
    expect((await app.fetch(req('GET', '/migrations'))).status).toBe(200)
    rmSync(path.join(dbDir, 'filler'))
    expect((await app.fetch(req('POST', '/sources', source('after')))).status).toBe(201)
  })

  test('filesystem turned read-only at runtime: writes fail with 503, the server keeps answering', async () => {
    const dev = path.basename(execFileSync('findmnt', ['-n', '-o', 'SOURCE', dbDir], { encoding: 'utf8' }).trim())
    writeFileSync(`/sys/fs/ext4/${dev}/trigger_fs_error`, '1')
    expect(execFileSync('findmnt', ['-n', '-o', 'OPTIONS', dbDir], { encoding: 'utf8' })).toMatch(/emergency_ro|^ro,/)
    for (const name of ['ro1', 'ro2']) {
      const e = await errorOf(await app.fetch(req('POST', '/sources', source(name))))
      expect([e.status, e.code]).toEqual([503, 'E_MIG_PERSIST_FAILED'])
    }
    expect((await app.fetch(req('GET', '/host-files'))).status).toBe(200)
    const list = await app.fetch(req('GET', '/sources'))
    expect([200, 503]).toContain(list.status)
  })
})
