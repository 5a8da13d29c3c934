// Fixed-width integers from binary headers (lib/bytes.ts).
import { expect, test } from 'bun:test'
import { u64be, u64le } from '../../lib/bytes.ts'

test('u64le/u64be read exact numbers up to 2^53 - 1 and null beyond', () => {
  const b = Buffer.alloc(16)
  b.writeBigUInt64LE(2n ** 53n - 1n, 0)
  b.writeBigUInt64BE(2n ** 53n, 8)
  expect(u64le(b, 0)).toBe(Number.MAX_SAFE_INTEGER)
  expect(u64be(b, 8)).toBeNull()
  b.writeBigUInt64BE(4096n, 8)
  expect(u64be(b, 8)).toBe(4096)
  expect(u64le(b, 8)).toBe(2 ** 52) // the same bytes (00 .. 10 00) read little-endian
})
