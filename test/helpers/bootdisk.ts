/** The boot-sector disks live in fixtures/bootdisk.ts (shared with the demo and benchmarks). */
import { randomBytes } from 'node:crypto'
import { closeSync, openSync, writeSync } from 'node:fs'
import { makeBootDisk } from '../../fixtures/bootdisk.ts'

export * from '../../fixtures/bootdisk.ts'

const MiB = 1024 * 1024

/**
 * A 64 MiB boot-sector disk at `file` printing `marker` (see `makeBootDisk`) with `dataMiB` MiB
 * (at most 56) of unique random data from 8 MiB on: a copy capped at 1 MiB/s takes about `dataMiB`
 * seconds. Returns its path.
 */
export function makeDataBootDisk(file: string, marker: string, dataMiB = 48): string {
  if (dataMiB > 56) throw new Error(`makeDataBootDisk: ${dataMiB} MiB of data do not fit behind 8 MiB of a 64 MiB disk`)
  const boot = makeBootDisk(file, marker, 64 * MiB).path
  const fd = openSync(boot, 'r+')
  try {
    for (let off = 8 * MiB; off < (8 + dataMiB) * MiB; off += MiB) writeSync(fd, randomBytes(MiB), 0, MiB, off)
  } finally {
    closeSync(fd)
  }
  return boot
}
