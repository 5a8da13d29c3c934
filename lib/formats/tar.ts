/**
 * Tar walking without extraction (OVA, XVA): lists members with their data offsets by hopping
 * from header to header with positioned reads, so listing a 20 GiB OVA costs a few KiB of I/O.
 *
 * Format followed: POSIX.1-2017 `pax` utility, "ustar Interchange Format" and "pax Interchange
 * Format" (extended headers `x`, global headers `g`, records `"<len> <key>=<value>\n"`), plus the
 * GNU extensions found in practice: old GNU magic (`"ustar  \0"`), long names `L` / long link
 * names `K`, and base-256 (binary) numeric fields for sizes of 8 GiB and more.
 *
 * The header codec is our own rather than a library's: tar-stream (a streaming extractor) cannot
 * list members by positioned reads, its `headers.js` codec is not importable under Node (its
 * `exports` map only exposes the root module), and its decoder does not bound PAX records.
 * Every numeric field is checked, every declared size is checked against the file, nothing is allocated from a declared size without a
 * cap.
 */
import { createHash } from 'node:crypto'
import type { FileHandle } from 'node:fs/promises'
import { MigError } from '../errors.ts'
import { currentInputScope } from '../hostpath.ts'
import { isRemoteHandle, malformed, openRead, readAt, readAtSync } from './io.ts'

/** Size of a tar block (header or data padding unit), bytes. */
export const TAR_BLOCK = 512
/** Default bound on the number of members {@link listTarMembers} returns. */
export const DEFAULT_MAX_MEMBERS = 100_000
/** Largest PAX extended header or GNU long name/link record accepted, bytes (1 MiB). */
export const MAX_META_RECORD = 1024 * 1024

/** Kind of a tar member (typeflag `0`/`\0`/`7` file, `5` directory, `2` symlink, `1` hard link). */
export type TarMemberType = 'file' | 'directory' | 'symlink' | 'hardlink' | 'other'

/**
 * One member of a tar archive.
 * - `name`: full path as stored (PAX `path` or GNU long name win over the ustar `prefix/name`).
 * - `size`: bytes of member data (PAX `size` wins over the header field).
 * - `offset`: byte offset of the member's data in the archive (always a multiple of 512).
 * - `linkname`: target of a symlink or hard link.
 */
export interface TarMember {
  name: string
  size: number
  offset: number
  type: TarMemberType
  linkname?: string
}

/** Hash algorithms of the OVF `.mf` manifest (DSP0243 5.3: SHA1, SHA256, SHA512). */
export type HashAlgorithm = 'sha1' | 'sha256' | 'sha512'

/** Magic of compressed streams a tar may be wrapped in, for a precise `E_MIG_UNSUPPORTED_FORMAT`. */
export function sniffCompression(head: Uint8Array): 'gzip' | 'bzip2' | 'xz' | 'zstd' | 'zip' | null {
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'gzip'
  if (head.length >= 3 && head[0] === 0x42 && head[1] === 0x5a && head[2] === 0x68) return 'bzip2'
  if (head.length >= 6 && head[0] === 0xfd && head[1] === 0x37 && head[2] === 0x7a && head[3] === 0x58 && head[4] === 0x5a && head[5] === 0x00) return 'xz'
  if (head.length >= 4 && head[0] === 0x28 && head[1] === 0xb5 && head[2] === 0x2f && head[3] === 0xfd) return 'zstd'
  if (head.length >= 4 && head[0] === 0x50 && head[1] === 0x4b && head[2] === 0x03 && head[3] === 0x04) return 'zip'
  return null
}

/** NUL-terminated field as UTF-8 (names) or latin1 (magic). */
function cstr(buf: Buffer, start: number, len: number, enc: BufferEncoding = 'utf8'): string {
  let end = start
  const stop = start + len
  while (end < stop && buf[end] !== 0) end++
  return buf.toString(enc, start, end)
}

/**
 * Numeric header field: octal ASCII (leading spaces/NULs allowed, terminated by space or NUL), or
 * GNU base-256 when the high bit of the first byte is set. Returns null when the field is not a
 * valid non-negative number that fits a JS safe integer.
 */
function numField(buf: Buffer, start: number, len: number): number | null {
  const first = buf[start]!
  if (first & 0x80) {
    if (first === 0xff) return null // negative base-256
    let v = first & 0x7f
    for (let i = 1; i < len; i++) {
      v = v * 256 + buf[start + i]!
      if (v > Number.MAX_SAFE_INTEGER) return null
    }
    return v
  }
  let i = start
  const end = start + len
  while (i < end && (buf[i] === 0x20 || buf[i] === 0)) i++
  let v = 0
  let digits = 0
  for (; i < end; i++) {
    const c = buf[i]!
    if (c === 0x20 || c === 0) break
    if (c < 0x30 || c > 0x37) return null
    v = v * 8 + (c - 0x30)
    digits++
  }
  for (; i < end; i++) if (buf[i] !== 0x20 && buf[i] !== 0) return null
  return digits === 0 ? 0 : v
}

/** Header checksum (POSIX: sum of the 512 bytes with the chksum field as spaces); unsigned and signed (historic) sums. */
function checksums(h: Buffer): [number, number] {
  let u = 0
  let s = 0
  for (let i = 0; i < TAR_BLOCK; i++) {
    const b = i >= 148 && i < 156 ? 0x20 : h[i]!
    u += b
    s += b >= 0x80 ? b - 256 : b
  }
  return [u, s]
}

function isZeroBlock(h: Buffer): boolean {
  for (let i = 0; i < h.length; i++) if (h[i] !== 0) return false
  return true
}

const padTo = (n: number) => Math.ceil(n / TAR_BLOCK) * TAR_BLOCK

/**
 * Parses PAX extended header records (`"<len> <key>=<value>\n"`, POSIX pax "pax Extended Header").
 * Returns a null-prototype map; throws `E_MIG_MALFORMED_ARCHIVE` on a malformed record.
 */
function parsePax(data: Buffer, archive: string, where: string): Record<string, string> {
  const out: Record<string, string> = Object.create(null)
  let pos = 0
  while (pos < data.length) {
    if (data[pos] === 0) break // trailing NUL padding (some writers)
    let sp = pos
    while (sp < data.length && sp - pos < 20 && data[sp] !== 0x20) sp++
    const lenText = data.toString('latin1', pos, sp)
    if (sp >= data.length || data[sp] !== 0x20 || !/^[0-9]+$/.test(lenText)) throw malformed(archive, `${where}: bad PAX record length`)
    const len = Number(lenText)
    if (len <= sp - pos + 1 || pos + len > data.length || data[pos + len - 1] !== 0x0a) throw malformed(archive, `${where}: bad PAX record`)
    const rec = data.toString('utf8', sp + 1, pos + len - 1)
    const eq = rec.indexOf('=')
    if (eq <= 0) throw malformed(archive, `${where}: PAX record without key`)
    out[rec.slice(0, eq)] = rec.slice(eq + 1)
    pos += len
  }
  return out
}

function paxSize(v: string | undefined, archive: string, where: string): number | undefined {
  if (v === undefined) return undefined
  if (!/^[0-9]{1,16}$/.test(v) || Number(v) > Number.MAX_SAFE_INTEGER) throw malformed(archive, `${where}: bad PAX size ${JSON.stringify(v.slice(0, 32))}`)
  return Number(v)
}

/**
 * Lists the members of the tar archive at `path` without reading member data.
 *
 * Walks 512-byte headers with positioned reads (ustar, old GNU and v7 headers; GNU `L`/`K` long
 * names; PAX `x` extended and `g` global headers, keys `path`, `linkpath`, `size`; base-256 sizes),
 * checking each header's checksum. The walk ends at a zero block (end-of-archive marker, POSIX
 * requires two; like GNU tar and Python's tarfile the first one ends the listing) or at a clean
 * EOF on a block boundary (a missing end marker is tolerated). Meta headers (`L`, `K`, `x`, `g`)
 * are consumed, not returned.
 *
 * Each header is one blocking `pread` (an async read per header cost more than the walk: an XVA
 * has two members per MiB of disk), and the walk yields to the event loop every 256 headers.
 *
 * @param opts.offset byte offset of the first header (default 0; must be a multiple of 512).
 * @param opts.maxMembers bound on members returned (default 100 000).
 * @returns members in archive order. Inside an input scope the walk is done once per file, offset and
 *   bound, and every caller gets the same (read-only) list.
 * @throws E_MIG_MALFORMED_ARCHIVE "not a tar archive" (bad checksum on the first header), a bad
 *   header later on, a header cut short by EOF, "truncated member <name>: declares N bytes,
 *   archive holds M", too many members, PAX/long-name records over 1 MiB.
 * @throws E_MIG_UNSUPPORTED_FORMAT the file is a gzip/bzip2/xz/zstd/zip stream, not a plain tar.
 * @throws E_MIG_DISK_READ_FAILED the file cannot be opened or read.
 */
export function listTarMembers(path: string, opts: { offset?: number; maxMembers?: number } = {}): Promise<readonly TarMember[]> {
  const maxMembers = opts.maxMembers ?? DEFAULT_MAX_MEMBERS
  const offset = opts.offset ?? 0
  if (!Number.isSafeInteger(offset) || offset < 0 || offset % TAR_BLOCK !== 0) throw new MigError('E_MIG_INTERNAL', `listTarMembers: bad offset ${offset}`)
  // One walk per pinned file and job: the inspection and the disk reader list the same archive.
  const scope = currentInputScope()
  if (scope?.remote(path) || scope?.pin(path)) return scope.memo(path, `tar:${offset}:${maxMembers}`, () => walkTar(path, offset, maxMembers))
  return walkTar(path, offset, maxMembers)
}

/** Headers read between two yields to the event loop: the walk blocks it for about a millisecond at a time. */
const HEADERS_PER_TURN = 256

/** How many headers {@link HeaderReadAhead} reads ahead of the walk. */
const HEADERS_AHEAD = 64

/**
 * Reads tar headers ahead of the walk, so that an archive not in the page cache is not walked at
 * one disk round trip per member: each header's place depends on the size in the one before, so
 * the walk itself cannot ask for two at once. While the gaps between headers repeat with a
 * period of two (an XVA alternates a 1 MiB block and its checksum member; a chunked OVF repeats
 * one size), the next {@link HEADERS_AHEAD} headers are guessed from the last two gaps and read,
 * 512 bytes each, on the thread pool. The reads only bring the pages into the page cache: the
 * walk reads and checks every header itself, so a wrong guess costs a wasted read and nothing
 * else, and once the gaps stop repeating no more are made. A hostile archive whose gaps repeat
 * and then change, over and over, gets at most two reads ahead per header walked (after the first
 * {@link HEADERS_AHEAD}). {@link settle} waits for the reads in flight (the descriptor is closed
 * after it).
 */
class HeaderReadAhead {
  private inFlight = 0
  private idle: (() => void) | null = null
  private furthest = 0
  private gapBefore = -1
  /** Reads still allowed: {@link HEADERS_AHEAD} to start with, two more per header walked. */
  private budget = HEADERS_AHEAD
  private readonly scratch = Buffer.allocUnsafe(TAR_BLOCK)

  constructor(
    private readonly fh: FileHandle,
    private readonly fileSize: number,
  ) {}

  /** The walk found headers at `prev` and `pos` and reads the next at `next` (file offsets, bytes). */
  ahead(prev: number, pos: number, next: number): void {
    this.budget += 2
    const gaps = [pos - prev, next - pos] as const
    const repeats = gaps[1] === this.gapBefore
    this.gapBefore = gaps[0]
    if (!repeats) return
    let at = next
    for (let k = 0; k < HEADERS_AHEAD; k++) {
      at += gaps[k % 2]!
      if (at + TAR_BLOCK > this.fileSize) return
      if (at <= this.furthest) continue
      if (this.budget <= 0) return
      this.budget--
      this.furthest = at
      this.inFlight++
      this.fh
        .read(this.scratch, 0, TAR_BLOCK, at)
        .catch(() => {}) // a wrong guess is harmless: the walk reads and checks every header itself
        .finally(() => {
          if (--this.inFlight === 0) this.idle?.()
        })
    }
  }

  /** Resolves once no read is in flight. */
  async settle(): Promise<void> {
    if (this.inFlight > 0) await new Promise<void>((r) => (this.idle = r))
  }
}

/** The walk of {@link listTarMembers}. */
async function walkTar(path: string, first: number, maxMembers: number): Promise<readonly TarMember[]> {
  let pos = first
  let prevHeader = -1
  const fh = await openRead(path)
  let readAhead: HeaderReadAhead | null = null
  try {
    const fileSize = (await fh.stat()).size
    // a remote input: no read-ahead guesses (each is a request), reads awaited
    const remote = isRemoteHandle(fh)
    if (!remote) readAhead = new HeaderReadAhead(fh, fileSize)
    const members: TarMember[] = []
    let global: Record<string, string> = Object.create(null)
    let pending: Record<string, string> = Object.create(null)
    let longName: string | undefined
    let longLink: string | undefined
    let headers = 0
    const maxHeaders = maxMembers * 4 + 16

    while (pos < fileSize) {
      if (headers % HEADERS_PER_TURN === HEADERS_PER_TURN - 1) await new Promise<void>((r) => setImmediate(r))
      const h = remote ? await readAt(fh, path, TAR_BLOCK, pos) : readAtSync(fh, path, TAR_BLOCK, pos)
      if (h.length < TAR_BLOCK) {
        if (isZeroBlock(h)) break // zero padding cut short: still the end
        throw malformed(path, `header at offset ${pos} cut short by end of file (${h.length} of 512 bytes)`, { offset: pos })
      }
      if (isZeroBlock(h)) break
      if (++headers > maxHeaders) throw malformed(path, `more than ${maxHeaders} headers`)

      const stored = numField(h, 148, 8)
      const [u, s] = checksums(h)
      if (stored === null || (stored !== u && stored !== s)) {
        if (pos === first) {
          const comp = sniffCompression(h)
          if (comp) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${path}: ${comp}-compressed archive: decompress it first`)
          throw malformed(path, 'not a tar archive (bad header checksum)')
        }
        const after = members.length ? ` after member ${members[members.length - 1]!.name}` : ''
        throw malformed(path, `bad tar header checksum at offset ${pos}${after}`, { offset: pos })
      }

      const magic = h.toString('latin1', 257, 263)
      const isUstar = magic === 'ustar\0'
      const typeflag = h[156] === 0 ? '0' : String.fromCharCode(h[156]!)
      let name = cstr(h, 0, 100)
      if (isUstar) {
        const prefix = cstr(h, 345, 155)
        if (prefix) name = `${prefix}/${name}`
      }
      const headerName = name
      const rawSize = numField(h, 124, 12)
      if (rawSize === null) throw malformed(path, `bad size field in header of ${JSON.stringify(headerName)} at offset ${pos}`, { offset: pos })
      const dataOffset = pos + TAR_BLOCK

      // Meta headers: their data is a name or PAX records for the next member.
      if (typeflag === 'L' || typeflag === 'K' || typeflag === 'x' || typeflag === 'g' || typeflag === 'X') {
        const what = typeflag === 'L' ? 'GNU long name' : typeflag === 'K' ? 'GNU long link name' : 'PAX header'
        if (rawSize > MAX_META_RECORD) throw malformed(path, `${what} at offset ${pos} declares ${rawSize} bytes (limit ${MAX_META_RECORD})`, { offset: pos })
        if (dataOffset + rawSize > fileSize)
          throw malformed(path, `truncated member ${what}: declares ${rawSize} bytes, archive holds ${Math.max(0, fileSize - dataOffset)}`)
        const data = remote ? await readAt(fh, path, rawSize, dataOffset) : readAtSync(fh, path, rawSize, dataOffset)
        if (typeflag === 'L') longName = cstr(data, 0, data.length)
        else if (typeflag === 'K') longLink = cstr(data, 0, data.length)
        else {
          const recs = parsePax(data, path, `${what} at offset ${pos}`)
          if (typeflag === 'g') global = Object.assign(Object.create(null), global, recs)
          else pending = Object.assign(pending, recs)
        }
        pos = dataOffset + padTo(rawSize)
        continue
      }

      const pax: Record<string, string> = Object.assign(Object.create(null), global, pending)
      if (pax.path !== undefined) name = pax.path
      else if (longName !== undefined) name = longName
      let linkname: string | undefined = cstr(h, 157, 100) || undefined
      if (pax.linkpath !== undefined) linkname = pax.linkpath
      else if (longLink !== undefined) linkname = longLink
      const size = paxSize(pax.size, path, `PAX header of ${JSON.stringify(name)}`) ?? rawSize
      pending = Object.create(null)
      longName = undefined
      longLink = undefined

      let type: TarMemberType
      switch (typeflag) {
        case '0':
        case '7':
          type = name.endsWith('/') ? 'directory' : 'file'
          break
        case '1':
          type = 'hardlink'
          break
        case '2':
          type = 'symlink'
          break
        case '5':
          type = 'directory'
          break
        default:
          type = 'other'
      }
      // Data blocks follow regular files and unknown types (POSIX: size is 0 for links, devices,
      // FIFOs and directories; GNU sparse `S` and vendor types carry data).
      const carriesData = !(typeflag === '1' || typeflag === '2' || typeflag === '3' || typeflag === '4' || typeflag === '5' || typeflag === '6')
      const dataSize = carriesData ? size : 0
      if (dataOffset + dataSize > fileSize) {
        throw malformed(path, `truncated member ${name}: declares ${dataSize} bytes, archive holds ${Math.max(0, fileSize - dataOffset)}`, {
          member: name,
          declared: dataSize,
          held: Math.max(0, fileSize - dataOffset),
        })
      }
      if (members.length >= maxMembers) throw malformed(path, `more than ${maxMembers} members`)
      const m: TarMember = { name, size: dataSize, offset: dataOffset, type }
      if (linkname !== undefined && (type === 'symlink' || type === 'hardlink')) m.linkname = linkname
      members.push(m)
      const next = dataOffset + padTo(dataSize)
      if (prevHeader >= 0) readAhead?.ahead(prevHeader, pos, next)
      prevHeader = pos
      pos = next
    }
    if (longName !== undefined || Object.keys(pending).length > 0) throw malformed(path, 'archive ends after a long-name or PAX header without its member')
    return members
  } finally {
    await readAhead?.settle()
    await fh.close()
  }
}

/**
 * Why a tar member name (or link target) is unsafe, or null when it is a plain relative path.
 * Unsafe: empty, a NUL byte, an absolute path (`/x`, `C:/x`, `\x`), or a `..` segment anywhere
 * (with `/` or `\` separators). Such names would land outside the extraction folder
 * (CVE-2007-4559 class "tar slip"); the migrator never extracts, but an archive carrying them is
 * hostile and is refused whole.
 */
export function unsafeMemberReason(name: string): string | null {
  if (name === '' || name.includes('\0')) return 'empty name or NUL byte'
  const n = name.replace(/\\/g, '/')
  if (n.startsWith('/') || /^[A-Za-z]:/.test(n)) return 'absolute path'
  if (n.split('/').some((seg) => seg === '..')) return '".." path segment'
  return null
}

/**
 * Refuses an archive any of whose members is named outside the archive root (see
 * {@link unsafeMemberReason}); symlink and hard-link targets are checked the same way.
 *
 * @param label archive name for the message.
 * @throws E_MIG_HOST_PATH_REJECTED naming the first such member and the reason (`details.member`).
 */
export function assertSafeMemberNames(members: readonly TarMember[], label: string): void {
  for (const m of members) {
    const why = unsafeMemberReason(m.name)
    if (why)
      throw new MigError('E_MIG_HOST_PATH_REJECTED', `${label}: member ${JSON.stringify(m.name.slice(0, 200))} rejected: ${why} (outside the archive)`, {
        details: { member: m.name.slice(0, 200) },
      })
    if (m.linkname !== undefined) {
      const lw = unsafeMemberReason(m.linkname)
      if (lw)
        throw new MigError(
          'E_MIG_HOST_PATH_REJECTED',
          `${label}: ${m.type} member ${JSON.stringify(m.name.slice(0, 200))} points to ${JSON.stringify(m.linkname.slice(0, 200))}: ${lw} (outside the archive)`,
          { details: { member: m.name.slice(0, 200) } },
        )
    }
  }
}

/**
 * Reads a member's data (for descriptors and manifests: `.ovf`, `.mf`, `ova.xml`).
 *
 * @param maxBytes refuse members larger than this many bytes (the caller's descriptor cap).
 * @throws E_MIG_MALFORMED_ARCHIVE the member is larger than `maxBytes` or its data is cut short.
 * @throws E_MIG_DISK_READ_FAILED the archive cannot be read.
 */
export async function readTarMember(path: string, member: TarMember, maxBytes: number): Promise<Buffer> {
  if (member.size > maxBytes)
    throw malformed(path, `member ${member.name} is ${member.size} bytes, larger than the ${maxBytes}-byte limit`, { member: member.name })
  const fh = await openRead(path)
  try {
    const buf = await readAt(fh, path, member.size, member.offset)
    if (buf.length < member.size)
      throw malformed(path, `truncated member ${member.name}: declares ${member.size} bytes, archive holds ${buf.length}`, { member: member.name })
    return buf
  } finally {
    await fh.close()
  }
}

/** Read size of {@link hashRange}, bytes (within the 64 KiB - 4 MiB band). */
const HASH_CHUNK = 1024 * 1024

/**
 * Digest (lower-case hex) of `length` bytes of `path` from byte `offset`, streamed with 1 MiB
 * positioned reads into one reused buffer (never a whole-file buffer). Used for `.mf` manifest
 * digests of tar members (offset = member data offset) and of plain files (offset 0).
 *
 * @throws E_MIG_MALFORMED_ARCHIVE the file ends before `offset + length`.
 * @throws E_MIG_DISK_READ_FAILED the file cannot be opened or read.
 * @throws E_MIG_CANCELLED `signal` aborted (checked before every read).
 */
export async function hashRange(path: string, offset: number, length: number, algorithm: HashAlgorithm, signal?: AbortSignal): Promise<string> {
  const hash = createHash(algorithm)
  const fh = await openRead(path)
  try {
    const buf = Buffer.allocUnsafe(Math.max(1, Math.min(HASH_CHUNK, length)))
    let done = 0
    while (done < length) {
      if (signal?.aborted) throw new MigError('E_MIG_CANCELLED', `${path}: digest cancelled at offset ${offset + done}`)
      const want = Math.min(buf.length, length - done)
      let bytesRead: number
      try {
        ;({ bytesRead } = await fh.read(buf, 0, want, offset + done))
      } catch (e) {
        throw new MigError('E_MIG_DISK_READ_FAILED', `${path}: read at offset ${offset + done} failed: ${(e as Error).message}`, { cause: e })
      }
      if (bytesRead === 0) throw malformed(path, `range of ${length} bytes at offset ${offset} runs past the end of the file (${done} bytes read)`)
      hash.update(buf.subarray(0, bytesRead))
      done += bytesRead
    }
    return hash.digest('hex')
  } finally {
    await fh.close()
  }
}
