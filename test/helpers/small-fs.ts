/** A small file system of its own for a server's volumes, to run the destination out of space. */
import { execFileSync } from 'node:child_process'
import { mkdirSync } from 'node:fs'
import * as path from 'node:path'

/**
 * A data directory `<root>/<name>` whose `volumes/` is a fresh ext4 of `size` bytes (image
 * `<root>/<name>-ext4.img`, `mkfsArgs` given to mkfs.ext4, e.g. `-m 0`: no blocks reserved for
 * root, the worker's user) mounted through a loop device. Returns the directory and its unmount
 * (lazy, so a server still ending does not hold it), which the test must call.
 */
export function dataDirOnExt4(root: string, name: string, size: number, mkfsArgs: string[] = []): { dir: string; unmount(): void } {
  const dir = path.join(root, name)
  const volumes = path.join(dir, 'volumes')
  mkdirSync(volumes, { recursive: true })
  const fsImage = path.join(root, `${name}-ext4.img`)
  execFileSync('truncate', ['-s', String(size), fsImage])
  execFileSync('mkfs.ext4', ['-q', ...mkfsArgs, fsImage])
  execFileSync('mount', ['-o', 'loop', fsImage, volumes])
  return { dir, unmount: () => execFileSync('umount', ['-l', volumes]) }
}
