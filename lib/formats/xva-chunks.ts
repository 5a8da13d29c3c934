/**
 * XVA VDI data: the chunk members ("blocks") of each VDI directory of an XVA export, indexed and
 * checked against their checksum companions. The `ova.xml` model is `xva.ts`'s job; the disk
 * reader over these chunks is `lib/pipeline/readers/xva-blocks.ts`.
 *
 * Follows the format xapi writes (`ocaml/xapi/stream_vdi.ml`): for each VDI, a directory named
 * after the VDI's export id (`Ref:5/`) holding members `NNNNNNNN` (decimal chunk number, 8
 * digits) of 1 MiB each with bytes `[N MiB, N+1 MiB)` of the disk (the disk's last chunk is
 * shorter when its size is not a multiple of 1 MiB; chunks that are all zero are omitted, except
 * the first and the last), each followed by a checksum companion: `NNNNNNNN.checksum` (SHA-1,
 * lower or upper-case hex, older xapi) or `NNNNNNNN.xxhash` (XXH64 seed 0 as `%016LX`: what
 * `stream_vdi.ml`'s `write_block` writes today).
 * xapi's keep-alive writes a zero-length chunk that is later re-sent in full under the same name:
 * zero-length chunks are therefore skipped.
 */

import { sha1Hex, xxh64Hex } from '../crypto/hash-threads.ts'
import { malformed, openRead, readAt } from './io.ts'
import type { TarMember } from './tar.ts'

/** Size of an XVA data chunk ("block"), bytes (xapi `chunk_size`). */
export const XVA_BLOCK_SIZE = 1024 * 1024
/**
 * Members listed at most in one archive (inspection and reader: one bound, so the job walks the
 * archive once): a fully allocated 2 TiB VDI has 2 Mi chunks plus as many checksum companions,
 * and xapi's own limit for a VDI is 2 TiB on VHD storage.
 */
export const XVA_MAX_MEMBERS = 8_000_000

/**
 * One data chunk of a VDI: `index` (chunk number N: bytes `[N MiB, N MiB + size)` of the disk),
 * `member` (the tar member), and its checksum companion if any (`sha1` = `.checksum`, `xxh64` =
 * `.xxhash`).
 */
export interface XvaBlock {
  index: number
  member: TarMember
  checksum: { algorithm: 'sha1' | 'xxh64'; member: TarMember } | null
}

/** The chunks of one VDI directory (`Ref:5`), in chunk order, and their total bytes. */
export interface XvaBlockDir {
  dir: string
  blocks: XvaBlock[]
  bytes: number
}

const BLOCK_RE = /^(Ref:[0-9]+)\/([0-9]{8})(\.checksum|\.xxhash)?$/

/**
 * Groups the archive members into VDI block directories and checks the block structure.
 *
 * @param members all members of the archive (from `listTarMembers`).
 * @param vdiSizes virtual size in bytes of each VDI directory expected (`Ref:5` -> bytes).
 * @param label archive name for messages.
 * @returns the directories of `vdiSizes` (a directory without blocks has an empty list) and the
 *   names of members that are neither `ova.xml` nor blocks of a known VDI (`ignored`).
 * @throws E_MIG_MALFORMED_ARCHIVE a block that is not a regular file; a block larger than 1 MiB;
 *   a block shorter than 1 MiB that is not the disk's last (partial) chunk of exactly the
 *   remaining size; a block number at or beyond the VDI's virtual size; a block or companion
 *   present twice with data; a companion over 128 bytes or without its block. Messages name the
 *   member. A companion is its block's when it follows it (the first one after it wins) or, when
 *   no keep-alive chunk of that name exists, when it precedes it.
 */
export function indexXvaBlocks(
  members: readonly TarMember[],
  vdiSizes: Map<string, number>,
  label: string,
): { dirs: Map<string, XvaBlockDir>; ignored: string[] } {
  const dirs = new Map<string, XvaBlockDir>()
  for (const d of vdiSizes.keys()) dirs.set(d, { dir: d, blocks: [], bytes: 0 })
  const blocks = new Map<string, Map<number, XvaBlock>>()
  const companions: Array<{ dir: string; index: number; ext: string; m: TarMember }> = []
  const ignored: string[] = []
  for (const m of members) {
    const name = m.name.replace(/^\.\//, '')
    if (name === 'ova.xml') continue
    const r = BLOCK_RE.exec(name)
    if (!r || !vdiSizes.has(r[1]!)) {
      if (!(m.type === 'directory' && vdiSizes.has(name.replace(/\/$/, '')))) ignored.push(m.name)
      continue
    }
    const dir = r[1]!
    const index = Number(r[2])
    if (m.type !== 'file') throw malformed(label, `member ${m.name} is a ${m.type}, not a regular file`, { member: m.name })
    if (r[3]) {
      companions.push({ dir, index, ext: r[3], m })
      continue
    }
    if (m.size === 0) continue // xapi keep-alive: the chunk is sent again in full.
    const vsize = vdiSizes.get(dir)!
    const start = index * XVA_BLOCK_SIZE
    if (start >= vsize) throw malformed(label, `block ${m.name} lies at byte ${start}, beyond the VDI's virtual size ${vsize}`, { member: m.name })
    if (m.size > XVA_BLOCK_SIZE) throw malformed(label, `block ${m.name} is ${m.size} bytes, larger than 1 MiB`, { member: m.name })
    const expected = Math.min(XVA_BLOCK_SIZE, vsize - start)
    if (m.size !== expected) throw malformed(label, `block ${m.name} is ${m.size} bytes; expected ${expected}`, { member: m.name })
    let map = blocks.get(dir)
    if (!map) blocks.set(dir, (map = new Map()))
    if (map.has(index)) throw malformed(label, `block ${m.name} appears twice`, { member: m.name })
    map.set(index, { index, member: m, checksum: null })
  }
  const keepAlives = new Set(members.filter((m) => m.size === 0).map((m) => m.name.replace(/^\.\//, '')))
  for (const c of companions) {
    if (c.m.size > 128) throw malformed(label, `checksum member ${c.m.name} is ${c.m.size} bytes`, { member: c.m.name })
    const b = blocks.get(c.dir)?.get(c.index)
    const keptAlive = keepAlives.has(`${c.dir}/${String(c.index).padStart(8, '0')}`)
    // xapi writes a block's companion after it; one before it belongs to a keep-alive
    // (zero-length) chunk of the same name, if there is one. Without a keep-alive, a companion
    // before its block is the block's (an archive repacked in directory order).
    if (b && (c.m.offset > b.member.offset || !keptAlive)) {
      const after = (m: TarMember) => m.offset > b.member.offset
      const held = b.checksum?.member
      if (!held || (after(c.m) && (!after(held) || c.m.offset < held.offset))) b.checksum = { algorithm: c.ext === '.checksum' ? 'sha1' : 'xxh64', member: c.m }
      continue
    }
    if (keptAlive) continue
    throw malformed(label, `checksum member ${c.m.name} has no block`, { member: c.m.name })
  }
  for (const [dir, map] of blocks) {
    const d = dirs.get(dir)!
    d.blocks = [...map.values()].sort((a, b) => a.index - b.index)
    d.bytes = d.blocks.reduce((s, b) => s + b.member.size, 0)
  }
  return { dirs, ignored }
}

/** Digest of each companion kind: name for messages, companion extension, hex digits. */
const DIGESTS = {
  sha1: { name: 'SHA-1', ext: '.checksum', hexDigits: 40 },
  xxh64: { name: 'XXH64', ext: '.xxhash', hexDigits: 16 },
} as const

/**
 * Checks one block's bytes (`data`, the whole block) against the text of its checksum companion
 * (xapi `stream_vdi`): a `.checksum` holds a SHA-1 hex digest (older xapi), an `.xxhash` the XXH64
 * (seed 0) as 16 hex digits (xapi writes `%016LX`; either case and surrounding white space are
 * accepted). The caller keeps `data` unchanged until the promise settles: a SHA-1 of a
 * `SharedArrayBuffer` view runs in place on a hashing thread ({@link sha1Hex}), an XXH64 on the
 * calling thread ({@link xxh64Hex}). A block without a companion resolves at once. `label`
 * names the archive in messages. Rejects with `E_MIG_MALFORMED_ARCHIVE` when the companion holds
 * no digest of its kind, or when the digests differ (details: `member`, `expected`, `actual`).
 */
export async function checkXvaBlock(label: string, block: XvaBlock, data: Uint8Array, companion: string): Promise<void> {
  if (!block.checksum) return
  const d = DIGESTS[block.checksum.algorithm]
  const name = block.checksum.member.name
  const want = companion.trim().toLowerCase()
  if (want.length !== d.hexDigits || !/^[0-9a-f]+$/.test(want))
    throw malformed(label, `checksum member ${name} does not hold a ${d.name} hex digest (${d.hexDigits} hex digits)`, { member: name })
  const got = await (block.checksum.algorithm === 'sha1' ? sha1Hex(data) : xxh64Hex(data))
  if (got !== want)
    throw malformed(label, `block ${block.member.name}: ${d.name} ${got} does not match its ${d.ext} ${want}`, {
      member: block.member.name,
      expected: want,
      actual: got,
    })
}

/** Blocks {@link verifyXvaBlocks} reads and checks at once (reads and SHA-1s: thread pool work). */
const BLOCKS_IN_FLIGHT = 4

/** Options of {@link verifyXvaBlocks}: `vdiSizes` as for {@link indexXvaBlocks}; `maxBytes` the budget of block bytes hashed (default unbounded); `dirs` restricts to these directories. */
export interface VerifyXvaOptions {
  vdiSizes: Map<string, number>
  maxBytes?: number
  dirs?: string[]
}

/**
 * Result of {@link verifyXvaBlocks}: `verified` blocks whose SHA-1 or XXH64 matched (and their
 * bytes, `verifiedBytes`); `deferred` blocks with a companion left for the copy (over the byte
 * budget); `unchecked` blocks without any companion; `warnings` summarising the last two.
 */
export interface VerifyXvaResult {
  dirs: Map<string, XvaBlockDir>
  verified: number
  verifiedBytes: number
  deferred: string[]
  unchecked: string[]
  warnings: string[]
}

/**
 * Checks the blocks of an XVA: the structure per {@link indexXvaBlocks}, then each block that has
 * a checksum companion against it ({@link checkXvaBlock}: SHA-1 `.checksum` or XXH64 `.xxhash`),
 * in archive order, until `maxBytes` of block data have been hashed. Reads are positioned (four
 * blocks at once, each into a 1 MiB buffer of its own, reused), never a whole-archive read.
 *
 * @param path the archive. @param members its members (from `listTarMembers`).
 * @throws E_MIG_MALFORMED_ARCHIVE as {@link indexXvaBlocks}; a companion that holds no digest of
 *   its kind; a block whose digest differs from its companion's (message names the block); a
 *   member cut short by the end of the archive.
 * @throws E_MIG_DISK_READ_FAILED the archive cannot be read.
 */
export async function verifyXvaBlocks(path: string, members: readonly TarMember[], opts: VerifyXvaOptions): Promise<VerifyXvaResult> {
  const { dirs } = indexXvaBlocks(members, opts.vdiSizes, path)
  const budget = opts.maxBytes ?? Number.MAX_SAFE_INTEGER
  const res: VerifyXvaResult = { dirs, verified: 0, verifiedBytes: 0, deferred: [], unchecked: [], warnings: [] }
  const selected = [...dirs.values()].filter((d) => !opts.dirs || opts.dirs.includes(d.dir))
  const all = selected.flatMap((d) => d.blocks).sort((a, b) => a.member.offset - b.member.offset)
  const toCheck: XvaBlock[] = []
  for (const b of all) {
    if (!b.checksum) res.unchecked.push(b.member.name)
    else if (res.verifiedBytes + b.member.size > budget) res.deferred.push(b.member.name)
    else {
      toCheck.push(b)
      res.verified++
      res.verifiedBytes += b.member.size
    }
  }
  const fh = await openRead(path)
  // BLOCKS_IN_FLIGHT lanes, each with a buffer of its own, take the blocks in archive order: the
  // reads run side by side on the thread pool, as do the SHA-1 digests. Every lane finishes
  // before the archive is closed; the failure first in archive order is the one reported.
  let next = 0
  const failures: Array<{ offset: number; error: unknown }> = []
  const lane = async (): Promise<void> => {
    const buf = Buffer.allocUnsafe(XVA_BLOCK_SIZE)
    const readExact = async (m: TarMember): Promise<Buffer> => {
      const got = await readAt(fh, `${path} member ${m.name}`, m.size, m.offset, buf)
      if (got.length < m.size) throw malformed(path, `member ${m.name} is cut short by the end of the archive`, { member: m.name })
      return got
    }
    while (next < toCheck.length && failures.length === 0) {
      const b = toCheck[next++]!
      try {
        const want = (await readExact(b.checksum!.member)).toString('latin1')
        await checkXvaBlock(path, b, await readExact(b.member), want)
      } catch (error) {
        failures.push({ offset: b.member.offset, error })
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: Math.min(BLOCKS_IN_FLIGHT, toCheck.length) }, lane))
  } finally {
    await fh.close()
  }
  if (failures.length > 0) throw failures.sort((a, b) => a.offset - b.offset)[0]!.error
  // The XVA reader (lib/pipeline/readers/xva-blocks.ts) checks every block it copies.
  if (res.deferred.length > 0)
    res.warnings.push(`${res.deferred.length} blocks with a checksum are verified while the data is copied (inspect verified ${res.verified})`)
  if (res.unchecked.length > 0) res.warnings.push(`${res.unchecked.length} blocks have no checksum companion`)
  return res
}
