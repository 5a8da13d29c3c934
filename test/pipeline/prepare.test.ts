/**
 * Manifest digests of disk files too large to hash at inspect (`source.digest`): a packed disk
 * (streamOptimized VMDK, qcow2, a gzip-compressed file) is hashed alongside the copy, in place
 * inside its tar member; a raw disk read in place is left to the copy loop (which hashes what it
 * reads).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { createHash, randomBytes } from 'node:crypto'
import { writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { MigError } from '../../lib/errors.ts'
import type { ManifestDisk } from '../../lib/manifest.ts'
import { verifyPackedDigest } from '../../lib/jobs/prepare.ts'
import { tempDir } from '../helpers/tmp.ts'

const t = tempDir('mig-prepare-')
afterAll(() => t.cleanup())

const member = randomBytes(300_000)
const archive = path.join(t.dir, 'pack.ova')
writeFileSync(archive, Buffer.concat([randomBytes(1536), member, randomBytes(1000)]))
const sha256 = createHash('sha256').update(member).digest('hex')
const disk = (format: ManifestDisk['disk_format'], hex: string): ManifestDisk => ({
  label: 'disk0',
  capacity_bytes: 1 << 20,
  disk_format: format,
  source: { path: archive, offset: 1536, length: member.length, member: 'vm-disk1.vmdk', digest: { algorithm: 'sha256', hex } },
  controller: 'scsi',
  address: '0:0',
})

describe('verifyPackedDigest', () => {
  test('a packed disk whose member matches its .mf digest passes (upper-case hex too)', async () => {
    await verifyPackedDigest(disk('vmdk', sha256))
    await verifyPackedDigest(disk('vmdk', sha256.toUpperCase()))
  })

  test('a mismatch is E_MIG_MALFORMED_ARCHIVE naming the member and both digests', async () => {
    const bad = sha256.replace(/^./, (c) => (c === '0' ? '1' : '0'))
    const err = await verifyPackedDigest(disk('vmdk', bad)).catch((e) => e)
    expect(err).toBeInstanceOf(MigError)
    expect(err.code).toBe('E_MIG_MALFORMED_ARCHIVE')
    expect(err.message).toBe(`vm-disk1.vmdk: SHA256 digest mismatch with the manifest (.mf): expected ${bad}, the file has ${sha256}`)
  })

  test('a raw disk is left to the copy loop; a disk without a deferred digest needs nothing', async () => {
    await verifyPackedDigest(disk('raw', '00'.repeat(32)))
    await verifyPackedDigest({ ...disk('vmdk', sha256), source: { path: archive } })
  })

  test('a gzip-compressed raw disk is checked on its stored (compressed) bytes here, since the copy reads the inflated ones', async () => {
    const gz = disk('raw', sha256)
    gz.source.compression = 'gzip'
    await verifyPackedDigest(gz)
    gz.source.digest = { algorithm: 'sha256', hex: '00'.repeat(32) }
    expect((await verifyPackedDigest(gz).catch((e) => e)).code).toBe('E_MIG_MALFORMED_ARCHIVE')
  })

  test('an aborted check stops reading: E_MIG_CANCELLED', async () => {
    const ac = new AbortController()
    ac.abort()
    expect((await verifyPackedDigest(disk('vmdk', sha256), ac.signal).catch((e) => e)).code).toBe('E_MIG_CANCELLED')
  })

  test('an unreadable file is E_MIG_DISK_READ_FAILED', async () => {
    const d = disk('qcow2', sha256)
    const err = await verifyPackedDigest({ ...d, source: { path: path.join(t.dir, 'gone.qcow2'), digest: d.source.digest } }).catch((e) => e)
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
  })
})
