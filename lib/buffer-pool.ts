/**
 * Buffers reused from read to read: a format reader's scratch space (VMDK grain table windows,
 * requests spanning several grains). A new buffer per read is garbage the collector returns
 * late, and a copy's memory then grows with the disk.
 */

/**
 * At most `kept` buffers of at most `maxKept` bytes each are kept for reuse; a new buffer is at
 * least `minBytes` long, so reads of varying lengths share it.
 */
export class BufferPool {
  private readonly free: Buffer[] = []

  constructor(private readonly o: { kept: number; maxKept: number; minBytes: number }) {}

  /** A buffer of at least `length` bytes, to hand back with {@link give} when done with it. */
  take(length: number): Buffer {
    const i = this.free.findIndex((b) => b.length >= length)
    if (i >= 0) return this.free.splice(i, 1)[0]!
    return Buffer.allocUnsafe(length <= this.o.maxKept ? Math.max(length, this.o.minBytes) : length)
  }

  /** Hands back a buffer of {@link take}: kept unless it is too large or enough are kept. */
  give(b: Buffer): void {
    if (b.length <= this.o.maxKept && this.free.length < this.o.kept) this.free.push(b)
  }
}
