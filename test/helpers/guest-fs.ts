/**
 * Reads a shut-down guest's ext4 file system straight from its raw disk image, without mounting it
 * or booting an appliance: the GPT partition found by name (`sfdisk --json`), attached read-only
 * by a loop device over its byte range, then `dumpe2fs -h`, `e2fsck -f -n` and `debugfs -R cat`.
 * For a file system unmounted cleanly (no `needs_recovery`): debugfs does not replay a journal.
 */
import { execFileSync, spawnSync } from 'node:child_process'

/** What {@link checkExt4} finds: the superblock's state and features, e2fsck's exit status and output. */
export interface Ext4Check {
  /** `Filesystem state:` of the superblock (`clean` after a clean unmount). */
  state: string
  /** `Filesystem features:` (`needs_recovery` while mounted or after a crash). */
  features: string[]
  /** `e2fsck -f -n` exit status: 0 when it found nothing to fix. */
  fsckCode: number
  fsckOutput: string
  /** `debugfs -R "cat <file>"` of each file asked for (empty when absent). */
  files: Record<string, string>
}

/**
 * Checks the ext4 file system of the GPT partition named `partition` of raw image `image` (read
 * only) and reads `files` from it. Throws when the image has no such partition.
 */
export function checkExt4(image: string, partition: string, files: string[] = []): Ext4Check {
  const table = JSON.parse(execFileSync('sfdisk', ['--json', image], { encoding: 'utf8' })) as {
    partitiontable: { sectorsize?: number; partitions: Array<{ start: number; size: number; name?: string }> }
  }
  const sector = table.partitiontable.sectorsize ?? 512
  const p = table.partitiontable.partitions.find((x) => x.name === partition)
  if (!p) throw new Error(`${image}: no GPT partition named ${partition}`)
  const dev = execFileSync('losetup', ['-r', '--find', '--show', '-o', String(p.start * sector), '--sizelimit', String(p.size * sector), image], {
    encoding: 'utf8',
  }).trim()
  try {
    const header = execFileSync('dumpe2fs', ['-h', dev], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })
    const field = (name: string) => new RegExp(`^${name}:\\s*(.*)$`, 'm').exec(header)?.[1]?.trim() ?? ''
    const fsck = spawnSync('e2fsck', ['-f', '-n', dev], { encoding: 'utf8' })
    const read = (f: string) => spawnSync('debugfs', ['-R', `cat ${f}`, dev], { encoding: 'utf8' }).stdout ?? ''
    return {
      state: field('Filesystem state'),
      features: field('Filesystem features').split(/\s+/).filter(Boolean),
      fsckCode: fsck.status ?? -1,
      fsckOutput: `${fsck.stdout}${fsck.stderr}`,
      files: Object.fromEntries(files.map((f) => [f, read(f)])),
    }
  } finally {
    spawnSync('losetup', ['-d', dev])
  }
}
