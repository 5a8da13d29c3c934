/**
 * Disk reader for images qemu decodes (qcow2, vmdk sparse/streamOptimized, vhdx, vpc, vdi;
 * DESIGN.md section 5 reader 3): starts `qemu-nbd` over the image (or over a tar member in place)
 * and reads it with the NBD client. Extents come from `NBD_CMD_BLOCK_STATUS` on
 * `base:allocation`, so unallocated and zero areas are reported as zero extents and never read.
 * `qemuNode` is the block node qemu-nbd serves, and `preferQemuImg` is set: an `auto` copy lets
 * qemu-img read it directly.
 */
import { open } from 'node:fs/promises'
import { pinnedPath } from '../../hostpath.ts'
import { MigError } from '../../errors.ts'
import { sleep } from '../../retry.ts'
import type { DiskFormat } from '../../manifest.ts'
import { QCOW2_HEADER, QCOW_MAGIC } from '../../formats/qcow2.ts'
import { VMDK_SPARSE_MAGIC } from '../../formats/vmdk/hosted-sparse.ts'
import { NbdClient, NBD_STATE_ZERO } from '../../nbd/client.ts'
import { qemuBlockSpec, startQemuNbd, type QemuNbdServer } from '../qemu-nbd.ts'
import { pinnedProcPath } from '../../hostpath.ts'
import type { DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'

/** Options of {@link openNbdReader}. Bytes. */
export interface NbdReaderOptions {
  /** Absolute path of the image, or of the archive holding it. */
  path: string
  /** qemu block driver. */
  format: DiskFormat
  /** Tar member data offset of the image inside `path`. */
  offset?: number
  /** Tar member size. */
  length?: number
  /** Validated parent images, nearest first; none means the image's own backing reference is ignored. */
  backingChain?: string[]
  /** Name used in messages. */
  label?: string
  /** Aborting kills qemu-nbd, failing reads in flight. */
  signal?: AbortSignal
  /** qemu-nbd binary (default from PATH). */
  qemuNbdPath?: string
}

/** Span asked per block-status request, bytes (1 GiB). */
const STATUS_SPAN = 1024 * 1024 * 1024

/**
 * Refuses images that would make qemu open files the importer never validated:
 * - qcow2 v3 with the "external data file" incompatible feature (bit 2 of `incompatible_features`
 *   at header byte 72; qemu `docs/interop/qcow2.txt`): `E_MIG_UNSUPPORTED_FORMAT`;
 * - a VMDK inside an archive that is not a hosted sparse extent (`KDMV` magic, VMDK spec 5.0
 *   section "Hosted Sparse Extent Header"): a text descriptor there could name arbitrary extent
 *   files: `E_MIG_UNSUPPORTED_FORMAT`.
 * Throws `E_MIG_DISK_READ_FAILED` when the header cannot be read.
 */
export async function checkImageHeader(opts: Pick<NbdReaderOptions, 'path' | 'format' | 'offset' | 'label'>): Promise<void> {
  if (opts.format !== 'qcow2' && !(opts.format === 'vmdk' && opts.offset !== undefined)) return
  const label = opts.label ?? opts.path
  const head = Buffer.alloc(80)
  let n = 0
  try {
    const fh = await open(pinnedPath(opts.path), 'r')
    try {
      n = (await fh.read(head, 0, head.length, opts.offset ?? 0)).bytesRead
    } finally {
      await fh.close()
    }
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: cannot read the image header: ${(e as Error).message}`, { cause: e })
  }
  if (opts.format === 'vmdk') {
    if (n < 4 || head.subarray(0, 4).toString('latin1') !== VMDK_SPARSE_MAGIC) {
      throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: a VMDK inside an archive must be a sparse extent (${VMDK_SPARSE_MAGIC} magic)`)
    }
    return
  }
  const Q = QCOW2_HEADER
  if (
    n >= Q.incompatible_features + 8 &&
    head.readUInt32BE(Q.magic) === QCOW_MAGIC &&
    head.readUInt32BE(Q.version) >= 3 &&
    (head.readBigUInt64BE(Q.incompatible_features) & 4n) !== 0n
  ) {
    throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: qcow2 images with an external data file are not supported`)
  }
}

/**
 * Opens an NBD-backed reader (after {@link checkImageHeader}). `size` is the virtual size qemu reports.
 * Throws `E_MIG_UNSUPPORTED_FORMAT` (see {@link checkImageHeader}), `E_MIG_DISK_READ_FAILED` (qemu-nbd refuses the image: its stderr is in the message;
 * handshake failure), `E_MIG_CANCELLED` when `signal` aborts while starting.
 */
export async function openNbdReader(opts: NbdReaderOptions): Promise<DiskReader> {
  const label = opts.label ?? opts.path
  await checkImageHeader(opts)
  const server: QemuNbdServer = await startQemuNbd({ ...opts, label })
  let client: NbdClient
  try {
    // qemu-nbd opens its socket before the image: one that then refuses the image leaves the
    // socket file behind, and the client stops trying once the process is gone.
    client = await NbdClient.connect(server.socketPath, { label, signal: opts.signal, serverGone: server.exited })
  } catch (e) {
    await sleep(20)
    const tail = server.stderr()
    await server.close()
    if (e instanceof MigError && e.code === 'E_MIG_CANCELLED') throw e
    throw new MigError('E_MIG_DISK_READ_FAILED', `${(e as Error).message}${tail ? ` (qemu-nbd: ${tail})` : ''}`, { cause: e })
  }
  const withStderr = (e: unknown): unknown => {
    const tail = server.stderr()
    if (e instanceof MigError && tail && server.exited()) return new MigError(e.code, `${e.message} (qemu-nbd: ${tail})`, { cause: e })
    return e
  }
  const size = client.size
  let closed = false
  // The same node qemu-nbd serves, for the qemu-img copy engine (read-only, shared with qemu-nbd).
  // Files by this worker's pinned descriptors (/proc/<pid>/fd/N), never by name again.
  const qemuNode = { ...(await qemuBlockSpec(opts, pinnedProcPath)), 'force-share': true }

  return {
    size,
    qemuNode,
    preferQemuImg: true,
    async *extents(from: number): AsyncIterable<DiskExtent> {
      let pos = Math.max(0, from)
      let run: DiskExtent | null = null
      while (pos < size) {
        let ext
        try {
          ext = await client.blockStatus(pos, Math.min(STATUS_SPAN, size - pos))
        } catch (e) {
          throw withStderr(e)
        }
        for (const x of ext) {
          const zero = (x.flags & NBD_STATE_ZERO) !== 0
          if (run && run.zero === zero && run.offset + run.length === x.offset) run.length += x.length
          else {
            if (run) yield run
            run = { offset: x.offset, length: x.length, zero }
          }
          pos = x.offset + x.length
        }
      }
      if (run) yield run
    },
    async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
      if (closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read at offset ${offset} after close`)
      if (length === 0) return Buffer.alloc(0)
      try {
        if (length <= client.maxRequest) return await client.read(offset, length, into)
        const buf = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
        const parts: Promise<Buffer>[] = []
        for (let o = 0; o < length; o += client.maxRequest) {
          const n = Math.min(client.maxRequest, length - o)
          parts.push(client.read(offset + o, n, buf.subarray(o, o + n)))
        }
        await Promise.all(parts)
        return buf
      } catch (e) {
        throw withStderr(e)
      }
    },
    async close(): Promise<void> {
      if (closed) return
      closed = true
      await client.disconnect()
      await server.close()
    },
  }
}
