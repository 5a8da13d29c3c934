/**
 * A sparse raw disk for the job tests: `dataBytes` of random data from offset 0, then a hole up
 * to `size` (bytes). The data is random bytes spelled as hex digits: no 4 KiB granule of it is
 * zero (the copy writes every data byte, and the bytes read can be counted exactly), and deflate
 * halves it (`qemu-img convert -c` stores every cluster compressed).
 */
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, openSync, writeSync } from 'node:fs'

const MiB = 1024 * 1024

/** Writes the image to `file` (created or truncated) and returns `file`. */
export function randomImage(file: string, size: number, dataBytes: number): string {
  const fd = openSync(file, 'w')
  try {
    for (let at = 0; at < dataBytes; at += 4 * MiB)
      writeSync(fd, Buffer.from(randomBytes(Math.min(4 * MiB, dataBytes - at) / 2).toString('hex')), 0, undefined, at)
  } finally {
    closeSync(fd)
  }
  execFileSync('truncate', ['-s', String(size), file])
  return file
}
