/**
 * Disk reader over an XVA (XenServer/XCP-ng export) VDI stored as 1 MiB blocks (xapi
 * `stream_vdi` format): the tar holds members `Ref:<n>/NNNNNNNN` (eight decimal digits), each
 * the disk bytes at `N * 1 MiB`, usually followed by a `Ref:<n>/NNNNNNNN.xxhash` (XXH64, xapi
 * today) or `.checksum` (SHA-1, older xapi) member. Blocks the exporter left out read as zeros.
 * The blocks are read in place with positioned reads at their tar member data offsets (DESIGN.md
 * section 5 reader 2), the blocks of one read side by side. Every block read whole is checked
 * against its companion ({@link checkXvaBlock}; SHA-1 on the thread pool) before `read` returns
 * it, so a damaged block fails the copy (`E_MIG_MALFORMED_ARCHIVE` naming the member) before it
 * reaches the volume.
 */
import { open, type FileHandle } from 'node:fs/promises'
import { pinnedPath } from '../../hostpath.ts'
import { MigError } from '../../errors.ts'
import { readAt, readAtSync } from '../../formats/io.ts'
import { listTarMembers } from '../../formats/tar.ts'
import { checkXvaBlock, indexXvaBlocks, XVA_BLOCK_SIZE, XVA_MAX_MEMBERS, type XvaBlock } from '../../formats/xva-chunks.ts'
import type { DiskExtent, DiskReader } from '../../contracts/disk-reader.ts'

/** Options of {@link openXvaBlocksReader}. */
export interface XvaBlocksReaderOptions {
  /** The VDI directory inside the tar, e.g. `Ref:5` (no trailing slash). */
  member: string
  /** Virtual size of the disk, bytes (from the XVA `ova.xml` VDI `virtual_size`). */
  capacity: number
  /** Name used in messages. */
  label?: string
}

/**
 * Lists the blocks of `opts.member` in the archive `path` and opens a reader of `capacity` bytes.
 * The block structure is checked as at inspect ({@link indexXvaBlocks}; inside the job's input
 * scope the archive is walked once for both). Throws `E_MIG_MALFORMED_ARCHIVE` (what
 * {@link indexXvaBlocks} refuses: a block larger than 1 MiB, of the wrong size, beyond the
 * capacity, present twice, not a regular file), `E_MIG_DISK_READ_FAILED` (unreadable archive,
 * read errors), and whatever {@link listTarMembers} throws for a broken tar.
 */
export async function openXvaBlocksReader(path: string, opts: XvaBlocksReaderOptions): Promise<DiskReader> {
  const label = opts.label ?? `${opts.member} in ${path}`
  const size = opts.capacity
  if (!Number.isSafeInteger(size) || size < 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: invalid capacity ${size}`)
  const dir = opts.member.replace(/\/+$/, '')
  const members = await listTarMembers(path, { maxMembers: XVA_MAX_MEMBERS })
  // In index order, each with its member (data offset and size in the archive) and checksum companion.
  const blocks = indexXvaBlocks(members, new Map([[dir, size]]), label).dirs.get(dir)!.blocks

  let fh: FileHandle
  try {
    fh = await open(pinnedPath(path), 'r')
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: cannot open: ${(e as Error).message}`, { cause: e })
  }
  let closed = false

  /**
   * Checks a block read whole against its checksum companion (the inspection checked the first
   * 64 MiB; every block is checked here, before its bytes are handed to the copy). Blocks without
   * a companion, and a block cut by the start of a resumed copy, are not.
   */
  const verifyBlock = async (b: XvaBlock, data: Buffer): Promise<void> => {
    const c = b.checksum
    if (!c) return
    const companion = readAtSync(fh, label, c.member.size, c.member.offset) // at most 128 bytes (indexXvaBlocks)
    if (companion.length !== c.member.size) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: ${c.member.name} is cut short (archive truncated?)`)
    await checkXvaBlock(label, b, data, companion.toString('latin1'))
  }

  /** Reads disk bytes `[s, e)` of block `b` into `into` (`e - s` bytes), and checks the block if that is all of it. */
  const readBlock = async (b: XvaBlock, s: number, e: number, into: Buffer): Promise<void> => {
    const bStart = b.index * XVA_BLOCK_SIZE
    const got = (await readAt(fh, `${label} block ${b.index}`, e - s, b.member.offset + (s - bStart), into)).length
    if (got !== e - s) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: short read of block ${b.index} at disk offset ${s + got} (archive truncated?)`)
    if (s === bStart && e === bStart + b.member.size) await verifyBlock(b, into)
  }

  /** Index in `blocks` of the first block whose data ends after `offset`. */
  const firstAfter = (offset: number): number => {
    let lo = 0
    let hi = blocks.length
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (blocks[mid].index * XVA_BLOCK_SIZE + blocks[mid].member.size <= offset) lo = mid + 1
      else hi = mid
    }
    return lo
  }

  return {
    size,
    async *extents(from: number): AsyncIterable<DiskExtent> {
      let pos = Math.max(0, from)
      let run: DiskExtent | null = null
      const emit = function* (offset: number, length: number, zero: boolean): Generator<DiskExtent> {
        if (length <= 0) return
        if (run && run.zero === zero && run.offset + run.length === offset) {
          run.length += length
          return
        }
        if (run) yield run
        run = { offset, length, zero }
      }
      for (let i = firstAfter(pos); i < blocks.length; i++) {
        const start = Math.max(pos, blocks[i].index * XVA_BLOCK_SIZE)
        const end = blocks[i].index * XVA_BLOCK_SIZE + blocks[i].member.size
        yield* emit(pos, start - pos, true)
        yield* emit(start, end - start, false)
        pos = end
      }
      yield* emit(pos, size - pos, true)
      if (run) yield run
    },
    async read(offset: number, length: number, into?: Buffer): Promise<Buffer> {
      if (closed) throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read at offset ${offset} after close`)
      if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > size) {
        throw new MigError('E_MIG_DISK_READ_FAILED', `${label}: read of ${length} bytes at offset ${offset} is outside the disk (${size} bytes)`)
      }
      const buf = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
      const end = offset + length
      let pos = offset
      // The blocks of one read are read, and their digests computed, side by side; the first
      // failure in disk order is reported once all have settled (none writes into `buf` later).
      const parts: Promise<void>[] = []
      for (let i = firstAfter(offset); i < blocks.length && pos < end; i++) {
        const b = blocks[i]
        const bStart = b.index * XVA_BLOCK_SIZE
        if (bStart >= end) break
        const s = Math.max(pos, bStart)
        if (s > pos) buf.fill(0, pos - offset, s - offset)
        const e = Math.min(end, bStart + b.member.size)
        parts.push(readBlock(b, s, e, buf.subarray(s - offset, e - offset)))
        pos = e
      }
      if (pos < end) buf.fill(0, pos - offset, length)
      for (const r of await Promise.allSettled(parts)) if (r.status === 'rejected') throw r.reason
      return buf
    },
    async close(): Promise<void> {
      if (closed) return
      closed = true
      await fh.close().catch(() => {})
    },
  }
}
