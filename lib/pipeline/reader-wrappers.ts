/**
 * Reader wrappers: decorators around a `DiskReader` (lib/contracts/disk-reader.ts) that change
 * which extents it yields and pass reads (and the caller's buffer) through to the reader they
 * wrap. Used by the live copy (live-copy.ts): `allocatedOnly` for a full pass over the areas
 * changed block tracking reports allocated, `restrictTo` for a delta pass's changed areas.
 */
import type { DiskArea, DiskReader } from '../contracts/disk-reader.ts'

/** A reader that yields only `areas` (changed extents) of `inner`, in order. */
export function restrictTo(inner: DiskReader, areas: DiskArea[]): DiskReader {
  const sorted = [...areas].sort((a, b) => a.offset - b.offset)
  return {
    size: inner.size,
    readAhead: inner.readAhead,
    async *extents(from: number) {
      for (const a of sorted) {
        const end = Math.min(a.offset + a.length, inner.size)
        const start = Math.max(a.offset, from)
        if (end > start) yield { offset: start, length: end - start, zero: false }
      }
    },
    read: (offset: number, length: number, into?: Buffer) => inner.read(offset, length, into),
    close: () => inner.close(),
  }
}

/**
 * A reader of `inner` whose only data extents are `areas` (the disk's allocated areas, as
 * `QueryChangedDiskAreas` with changeId `*` reports them); the rest of the disk is zero extents,
 * never read: a thin disk's unallocated space reads as zeros.
 */
export function allocatedOnly(inner: DiskReader, areas: DiskArea[]): DiskReader {
  const sorted = [...areas].sort((a, b) => a.offset - b.offset)
  return {
    size: inner.size,
    readAhead: inner.readAhead,
    async *extents(from: number) {
      let at = from
      for (const a of sorted) {
        const start = Math.max(a.offset, at)
        const end = Math.min(a.offset + a.length, inner.size)
        if (end <= start) continue
        if (start > at) yield { offset: at, length: start - at, zero: true }
        yield { offset: start, length: end - start, zero: false }
        at = end
      }
      if (at < inner.size) yield { offset: at, length: inner.size - at, zero: true }
    },
    read: (offset: number, length: number, into?: Buffer) => inner.read(offset, length, into),
    close: () => inner.close(),
  }
}
