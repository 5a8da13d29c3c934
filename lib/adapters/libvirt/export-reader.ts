/**
 * Reading one disk of a libvirt pull-mode backup (https://libvirt.org/kbase/live_full_disk_backup.html,
 * https://libvirt.org/formatbackup.html): the backup's NBD export (named after the disk's target,
 * `vda`) reached through a local forward of its Unix socket, read with the project's NBD client.
 * Extents come from `base:allocation` (holes and zero areas are zero extents, never read); the
 * changed areas of an incremental backup from the `qemu:dirty-bitmap:backup-<target>` context
 * (qemu `docs/interop/nbd.txt`).
 *
 * A lost connection (the SSH forward cut, the socket closed) is retried: the forward is opened
 * again and the request repeated at the same offset, `attempts` times with 1 s, 2 s, 4 s... pauses;
 * then the read fails with `E_MIG_DISK_READ_FAILED` naming the disk and the offset.
 */
import type { DiskArea, DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'
import { MigError } from '../../errors.ts'
import { NbdClient, NBD_STATE_DIRTY, NBD_STATE_ZERO } from '../../nbd/client.ts'
import { sleep } from '../../retry.ts'

/** Where an export is: `socket()` gives a local socket path, opening the forward again when it is down. */
export interface ExportEndpoint {
  socket(): Promise<string>
  /** Export name: the disk's target (`vda`). */
  exportName: string
  /** The disk in messages. */
  label: string
}

/** Span asked per block status request, bytes (1 GiB). */
const STATUS_SPAN = 1024 * 1024 * 1024

async function connectTo(ep: ExportEndpoint, metaContext?: string): Promise<NbdClient> {
  return NbdClient.connect(await ep.socket(), { exportName: ep.exportName, label: ep.label, timeoutMs: 20_000, metaContext })
}

/**
 * Opens a reader over export `ep`. `expectedSize` (bytes): the disk's capacity at inspection; a
 * different export size is `E_MIG_DISK_READ_FAILED` (the disk was resized since). `attempts`:
 * reconnections per request (default 3).
 */
export async function openExportReader(ep: ExportEndpoint, expectedSize: number, opts: { attempts?: number; backoffMs?: number } = {}): Promise<DiskReader> {
  const attempts = opts.attempts ?? 3
  const backoff = opts.backoffMs ?? 1000
  let client: NbdClient | null = await connectTo(ep)
  if (client.size !== expectedSize) {
    await client.disconnect()
    throw new MigError(
      'E_MIG_DISK_READ_FAILED',
      `${ep.label}: the disk is ${client.size} bytes on the source now, ${expectedSize} at inspection: it was resized; inspect the VM again and submit a new plan`,
    )
  }
  let closed = false
  const withRetry = async <T>(what: string, offset: number, op: (c: NbdClient) => Promise<T>): Promise<T> => {
    let last: unknown
    for (let i = 0; i <= attempts; i++) {
      if (closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${ep.label}: reader closed (${what} at offset ${offset})`)
      try {
        client ??= await connectTo(ep)
        return await op(client)
      } catch (e) {
        last = e
        const dead = client
        client = null
        await dead?.disconnect().catch(() => {})
        if (i < attempts) await sleep(backoff * 2 ** i)
      }
    }
    throw new MigError(
      'E_MIG_DISK_READ_FAILED',
      `${ep.label}: ${what} at offset ${offset} failed after ${attempts} reconnections: ${(last as Error)?.message ?? last}`,
      { cause: last, details: { disk: ep.label, offset } },
    )
  }
  const size = expectedSize
  return {
    size,
    async *extents(from: number): AsyncIterable<DiskExtent> {
      let off = from
      let pending: DiskExtent | null = null
      while (off < size) {
        const at = off
        const ds = await withRetry('block status', at, (c) => c.blockStatus(at, Math.min(STATUS_SPAN, size - at)))
        for (const d of ds) {
          const zero = (d.flags & NBD_STATE_ZERO) !== 0
          if (pending && pending.zero === zero && pending.offset + pending.length === d.offset) pending.length += d.length
          else {
            if (pending) yield pending
            pending = { offset: d.offset, length: d.length, zero }
          }
          off = d.offset + d.length
        }
      }
      if (pending) yield pending
    },
    async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
      const buf = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
      let done = 0
      while (done < length) {
        const at = offset + done
        const n = Math.min(length - done, client?.maxRequest ?? 32 * 1024 * 1024)
        const target = buf.subarray(done, done + n)
        const got = await withRetry('read', at, (c) => c.read(at, n, target))
        if (got.buffer !== target.buffer || got.byteOffset !== target.byteOffset) got.copy(target)
        done += n
      }
      return buf
    },
    async close(): Promise<void> {
      if (closed) return
      closed = true
      await client?.disconnect().catch(() => {})
      client = null
    },
  }
}

/**
 * The dirty areas of an incremental backup's export `ep` (`qemu:dirty-bitmap:<bitmap>`), merged
 * and sorted: what the guest wrote since the checkpoint the backup is incremental from.
 * `E_MIG_CBT_RESET` when the export has no such bitmap (the backup is not incremental).
 */
export async function dirtyAreas(ep: ExportEndpoint, bitmap: string): Promise<DiskArea[]> {
  const client = await connectTo(ep, `qemu:dirty-bitmap:${bitmap}`)
  try {
    if (!client.baseAllocation)
      throw new MigError('E_MIG_CBT_RESET', `${ep.label}: the backup export has no dirty bitmap ${bitmap}: it is not incremental from the last checkpoint`)
    const areas: DiskArea[] = []
    let off = 0
    while (off < client.size) {
      const ds = await client.blockStatus(off, Math.min(STATUS_SPAN, client.size - off))
      for (const d of ds) {
        if (d.flags & NBD_STATE_DIRTY) {
          const last = areas[areas.length - 1]
          if (last && last.offset + last.length === d.offset) last.length += d.length
          else areas.push({ offset: d.offset, length: d.length })
        }
        off = d.offset + d.length
      }
    }
    return areas
  } finally {
    await client.disconnect()
  }
}
