/**
 * qemu-nbd socket directories left by workers that died with their server are removed at the next
 * server start (removeOrphanSocketDirs); those of live processes stay.
 */
import { expect, test } from 'bun:test'
import { spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import * as path from 'node:path'
import { removeOrphanSocketDirs } from '../../lib/pipeline/qemu-nbd.ts'

test('the socket directory of a dead process is removed, that of a live one kept', () => {
  const dead = spawnSync('true').pid! // exited before this line runs
  const orphan = mkdtempSync(path.join(tmpdir(), `mig-nbd-${dead}-`))
  const mine = mkdtempSync(path.join(tmpdir(), `mig-nbd-${process.pid}-`))
  try {
    expect(removeOrphanSocketDirs()).toBeGreaterThanOrEqual(1)
    expect(existsSync(orphan)).toBe(false)
    expect(existsSync(mine)).toBe(true)
  } finally {
    rmSync(orphan, { recursive: true, force: true })
    rmSync(mine, { recursive: true, force: true })
  }
})
