/**
 * Reading a whole {@link DiskReader} the way the copy loop does (its extents in order, data
 * extents read in pieces), checking that the extents cover the disk without gaps or overlaps; and
 * a reader of a disk held in memory.
 */
import { expect } from 'bun:test'
import type { DiskReader } from '../../lib/contracts/disk-reader.ts'

/** The disk's bytes and how many of them its extents call zero. `piece`: bytes per read (default 4 MiB). */
export async function readAll(r: DiskReader, piece = 4 * 1024 * 1024): Promise<{ data: Buffer; zeroBytes: number }> {
  const data = Buffer.alloc(r.size)
  let zeroBytes = 0
  let next = 0
  for await (const e of r.extents(0)) {
    expect(e.offset).toBe(next)
    next = e.offset + e.length
    if (e.zero) zeroBytes += e.length
    else for (let o = e.offset; o < next; o += piece) (await r.read(o, Math.min(piece, next - o))).copy(data, o)
  }
  expect(next).toBe(r.size)
  return { data, zeroBytes }
}

/** A reader of the disk `bytes` held in memory: one data extent from `from` to the end; reads are copies. */
export function memReader(bytes: Buffer): DiskReader {
  return {
    size: bytes.length,
    async *extents(from: number) {
      yield { offset: from, length: bytes.length - from, zero: false }
    },
    async read(offset: number, length: number) {
      return Buffer.from(bytes.subarray(offset, offset + length))
    },
    async close() {},
  }
}
