// Writing files into a real Debian guest (a copy of the fleet's staticip image) with libguestfs
// read-write, reading them back from the disk (debugfs), putting them back (restore), and a write
// that fails half way: the file already written is put back before the error (E_MIG_V2V_FAILED,
// rolled_back). The root file system is given as the inspection would give it (its partition,
// read from the partition table here); the whole path, inspection included, runs in
// test/engine/real-guests.guest.integ.test.ts.
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { execFileSync, spawnSync } from 'node:child_process'
import * as path from 'node:path'
import { copyGuestImage, fleetGuestImages } from '../../fixtures/guest-image.ts'
import { restoreGuestFiles, writeGuestFiles } from '../../lib/domain/guest-files.ts'
import { linkFileFor } from '../../lib/domain/net-identity.ts'
import { migErrorOf } from '../helpers/mig-error.ts'
import { tempDir } from '../helpers/tmp.ts'

const MAC = '00:0c:29:aa:bb:cc'
const tmp = tempDir('mig-guestfiles-')
let disk = ''

/** The root partition (named `root`) of `disk`: its number and byte offset, from the partition table. */
function rootPartition(): { number: number; offset: number } {
  const table = JSON.parse(execFileSync('sfdisk', ['-J', disk], { encoding: 'utf8' })) as {
    partitiontable: { sectorsize?: number; partitions: Array<{ node: string; start: number; name?: string }> }
  }
  const root = table.partitiontable.partitions.find((p) => p.name === 'root')!
  return { number: Number(/(\d+)$/.exec(root.node)![1]), offset: root.start * (table.partitiontable.sectorsize ?? 512) }
}

/**
 * Each guest path's content on `disk`, or `<absent>`: read from the root file system with
 * debugfs, outside libguestfs, so the check does not share the code it checks and costs no
 * appliance boot.
 */
function guestCat(paths: string[]): string[] {
  const fs = `${disk}?offset=${rootPartition().offset}`
  return paths.map((p) => {
    const r = spawnSync('debugfs', ['-R', `cat ${p}`, fs], { encoding: 'utf8' })
    return /File not found|Ext2 inode is not a directory/.test(r.stderr) ? '<absent>' : r.stdout
  })
}

beforeAll(() => {
  const img = fleetGuestImages().staticip.disks[0]!
  disk = copyGuestImage({ variant: 'generic', path: img, sizeBytes: 0, firmware: 'bios' }, path.join(tmp.dir, 'guest.raw'))
}, 30 * 60_000)
afterAll(() => tmp.cleanup())

describe('writeGuestFiles / restoreGuestFiles on a real guest', () => {
  const link = linkFileFor('ens192', MAC)
  const opts = () => ({ mounts: [{ mountpoint: '/', device: `/dev/sda${rootPartition().number}` }], tcg: true })

  test(
    'writes a new file and replaces an existing one; restore removes the new and brings the old back',
    async () => {
      const undo = await writeGuestFiles([disk], [link, { path: '/etc/hostname', content: 'changed-by-test\n', mode: 0o600 }], opts())
      expect(undo.before.map((b) => [b.path, b.content])).toEqual([
        [link.path, null],
        ['/etc/hostname', 'migrator-guest\n'],
      ])
      // the fixture's /etc/hostname is 0755 (written by the image build): the mode read is the file's, not a default
      expect(undo.before[1]!.mode! & 0o777).toBe(0o755)
      expect(guestCat([link.path, '/etc/hostname'])).toEqual([link.content, 'changed-by-test\n'])
      await restoreGuestFiles([disk], undo, opts())
      expect(guestCat([link.path, '/etc/hostname'])).toEqual(['<absent>', 'migrator-guest\n'])
    },
    20 * 60_000,
  )

  test('no root file system among the mounts: E_MIG_V2V_FAILED before any libguestfs session', async () => {
    const err = await migErrorOf(writeGuestFiles([disk], [link], { mounts: [{ mountpoint: '/boot', device: '/dev/sda1' }], tcg: true }))
    expect([err.code, err.message]).toEqual(['E_MIG_V2V_FAILED', 'the inspection found no root file system to write the guest files into'])
    expect(guestCat([link.path])).toEqual(['<absent>'])
  })

  test(
    'a write that fails after another succeeded: E_MIG_V2V_FAILED, rolled back, the first file gone from the disk',
    async () => {
      const bad = { path: '/etc/hostname/not-a-dir/x.link', content: 'x\n', mode: 0o644 }
      const err = await migErrorOf(writeGuestFiles([disk], [link, bad], opts()))
      expect(err.code).toBe('E_MIG_V2V_FAILED')
      expect(err.message).toContain('the files were put back')
      expect(err.details?.rolled_back).toBe(true)
      expect(guestCat([link.path, '/etc/hostname'])).toEqual(['<absent>', 'migrator-guest\n'])
    },
    20 * 60_000,
  )
})
