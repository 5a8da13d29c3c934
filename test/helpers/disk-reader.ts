/**
 * Reading a whole {@link DiskReader} the way the copy loop does (its extents in order, data
 * extents read in pieces), checking that the extents cover the disk without gaps or overlaps.
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
