/**
 * The qcow2 overlay of a live import (docs/live-import.md): an image on this host whose backing
 * file is the NBD export of a source disk (`nbd+unix:///?socket=<path>`, raw). The guest boots
 * from it: what it writes lands in the overlay (this host's storage, durable), what it reads and
 * never wrote comes from the source through the export. qemu-img(1) `create`.
 */
import { rm } from 'node:fs/promises'
import { MigError } from '../errors.ts'
import { exec } from '../exec.ts'

/** The backing file name of an overlay over the NBD export on `socketPath` (qemu's NBD URI syntax). */
export function exportUri(socketPath: string): string {
  return `nbd+unix:///?socket=${socketPath}`
}

/**
 * Creates (replacing any file there) the qcow2 overlay `path` of `sizeBytes` over the export on
 * `socketPath`. Throws `E_MIG_DISK_WRITE_FAILED` with qemu-img's message.
 */
export async function createOverlay(path: string, socketPath: string, sizeBytes: number): Promise<void> {
  await rm(path, { force: true })
  // `-u`: the size is given, the export need not be opened to make the image.
  const r = await exec('qemu-img', ['create', '-q', '-u', '-f', 'qcow2', '-F', 'raw', '-b', exportUri(socketPath), path, String(sizeBytes)], {
    timeoutMs: 60_000,
  })
  if (r.code !== 0)
    throw new MigError('E_MIG_DISK_WRITE_FAILED', `creating the live-import overlay ${path} failed: ${(r.stderr || r.spawnError?.message || '').trim()}`)
}
