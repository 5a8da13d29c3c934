/**
 * What each sparse extent format (`hosted-sparse.ts`, `cowd.ts`, `sesparse.ts`) tells the grain
 * table reader (`sparse-extent.ts`): its geometry and how its directory and table entries decode.
 * Types only, so the format modules and the reader depend on it and not on each other.
 */

/** What a grain table entry says of its grain: its file byte offset, `zero`, or `absent` (ask the parent). */
export type Grain = number | 'zero' | 'absent'

/**
 * The geometry of a sparse extent format and the decoding of its entries (bytes and entries).
 * - `gdOffset`/`gdEntries`: the grain directory's file offset and entry count;
 * - `entryBytes`: bytes per directory and table entry (4 or 8);
 * - `tableAt(gd, i)`: file offset of grain table `i`, or -1 when unallocated;
 * - `grainOf(words, k, g)`: entry `k` of a table loaded as 32-bit words (two per 64-bit entry),
 *   `g` the grain's index for messages;
 * - `compressed`: the grains are stored compressed, each behind a grain marker (stream-optimized
 *   hosted sparse): a table entry gives the marker's offset, and the grain takes less than
 *   `grainBytes` of the file.
 */
export interface SparseCodec {
  format: 'hosted' | 'cowd' | 'sesparse'
  capacityBytes: number
  grainBytes: number
  gtEntries: number
  gdOffset: number
  gdEntries: number
  entryBytes: 4 | 8
  tableAt(gd: Buffer, i: number): number
  grainOf(words: Uint32Array, k: number, g: number): Grain
  compressed?: boolean
}
