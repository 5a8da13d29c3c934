/**
 * Marks a VHDX's log as not replayed: both headers get a LogGuid (MS-VHDX 2.2.2) and a fresh
 * CRC-32C, with no log entries behind it (qemu finds nothing to replay; the migrator's inspection
 * refuses such an image).
 */
import { closeSync, openSync, readSync, writeSync } from 'node:fs'
import { crc32c } from '../../lib/formats/vhdx.ts'

/** Writes a non-zero LogGuid into both headers of the VHDX `file` (64 and 128 KiB). */
export function setVhdxLogGuid(file: string): void {
  const fd = openSync(file, 'r+')
  try {
    for (const off of [64 * 1024, 128 * 1024]) {
      const h = Buffer.alloc(4096)
      readSync(fd, h, 0, 4096, off)
      h.fill(0x5a, 48, 64) // LogGuid
      h.writeUInt32LE(0, 4)
      h.writeUInt32LE(crc32c(h), 4)
      writeSync(fd, h, 0, 4096, off)
    }
  } finally {
    closeSync(fd)
  }
}
