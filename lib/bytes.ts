/**
 * Fixed-width integers read from binary headers (VMDK, qcow2, VHDX, VMCX, the NBD protocol), as
 * JavaScript numbers: offsets and sizes in bytes or sectors that must stay exact.
 */

const MAX = BigInt(Number.MAX_SAFE_INTEGER)

/** The little-endian uint64 at byte `at` of `buf` as a number, or null when it exceeds 2^53 - 1. */
export function u64le(buf: Buffer, at: number): number | null {
  const v = buf.readBigUInt64LE(at)
  return v > MAX ? null : Number(v)
}

/** The big-endian uint64 at byte `at` of `buf` as a number, or null when it exceeds 2^53 - 1. */
export function u64be(buf: Buffer, at: number): number | null {
  const v = buf.readBigUInt64BE(at)
  return v > MAX ? null : Number(v)
}

/** {@link u64be} of a value that must fit (a protocol's size or offset): throws a RangeError naming it when it exceeds 2^53 - 1. */
export function u64beExact(buf: Buffer, at: number): number {
  const v = u64be(buf, at)
  if (v === null) throw new RangeError(`64-bit value ${buf.readBigUInt64BE(at)} is too large`)
  return v
}
