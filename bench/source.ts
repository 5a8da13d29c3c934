/**
 * The benchmark source disk of DESIGN.md section 8 / issue 4: a qcow2 of `size` bytes (64 KiB
 * clusters) whose every other cluster holds random data, so half the clusters are allocated.
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { closeSync, openSync, writeSync } from 'node:fs'
import * as path from 'node:path'

/** Cluster size of the benchmark qcow2, bytes. */
export const CLUSTER = 64 * 1024

/**
 * Writes `<dir>/<name>` (qcow2, virtual size `size` bytes, half the clusters random data) and
 * warms the page cache with it. Returns its path and the bytes of data it holds.
 */
export function makeHalfFullQcow2(dir: string, size: number, name = 'src.qcow2'): { path: string; dataBytes: number } {
  const raw = path.join(dir, 'src.raw')
  const fd = openSync(raw, 'w')
  const rnd = randomBytes(CLUSTER * 256)
  let dataBytes = 0
  for (let o = 0; o < size; o += 2 * CLUSTER) {
    writeSync(fd, rnd, ((o / (2 * CLUSTER)) % 256) * CLUSTER, CLUSTER, o)
    dataBytes += CLUSTER
  }
  closeSync(fd)
  spawnSync('truncate', ['-s', String(size), raw])
  const qcow = path.join(dir, name)
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', raw, qcow])
  execFileSync('rm', ['-f', raw])
  execFileSync('cat', [qcow], { stdio: ['ignore', 'ignore', 'inherit'] })
  return { path: qcow, dataBytes }
}
