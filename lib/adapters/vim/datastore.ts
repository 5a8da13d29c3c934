/**
 * Reading a VMDK on a vSphere datastore through the datastore HTTP interface
 * (`GET https://<vcenter>/folder/<path>?dcPath=<datacenter>&dsName=<datastore>` with `Range`,
 * authenticated by the SOAP login cookie; vSphere Web Services SDK Programming Guide,
 * "Datastore file access over HTTP"): each file of a disk (descriptor, extents, the parents of a
 * snapshot delta chain) becomes a {@link RemoteFile} of range reads, and `vmdk-chain.ts` decodes
 * them into a {@link DiskReader}. Unallocated and zeroed grains are never fetched; allocated
 * grains contiguous in a file are fetched with one range request.
 *
 * Missing files (HTTP 404), servers that do not honour `Range`, short or failed reads are
 * `E_MIG_DISK_READ_FAILED`; an expired login is renewed once per request (HTTP 401/403).
 */
import { MigError } from '../../errors.ts'
import { sleep } from '../../retry.ts'
import type { DiskReader } from '../../contracts/disk-reader.ts'
import type { RangeAnswer } from '../../http/range-http.ts'
import { x, type VimClient } from './soap.ts'
import { MAX_RANGE, openVmdkChain, type RemoteFile } from './vmdk-chain.ts'

export type { RemoteFile } from './vmdk-chain.ts'

/**
 * Reads longer than this go out as parallel range requests of this many bytes over the client's
 * connection pool (1 MiB), so one read of a copy keeps several connections busy.
 */
const FAN_OUT_BYTES = 1024 * 1024

/**
 * Reads the copy loop keeps in flight for a datastore disk: each read fans out over the pool
 * itself ({@link FAN_OUT_BYTES}), so one at a time keeps the connections busy; more reads in
 * flight, each of one request, take the worker's peak RSS over the 200 MiB a job may take
 * (bench/vim-job.ts; docs/benchmarks.md).
 */
const DATASTORE_READ_AHEAD = 1

/** A datastore path `[datastore] dir/file.vmdk` split into its parts. */
export interface DatastorePath {
  datastore: string
  path: string
}

/** Parses `[ds] dir/file`; `E_MIG_DISK_READ_FAILED` when it is not one. */
export function parseDatastorePath(s: string): DatastorePath {
  const m = /^\[([^\]]+)\]\s*(.*)$/.exec(s.trim())
  if (!m || m[2] === '' || m[2].split('/').some((p) => p === '..'))
    throw new MigError('E_MIG_DISK_READ_FAILED', `${JSON.stringify(s)} is not a datastore file path`)
  return { datastore: m[1], path: m[2] }
}

/**
 * Files of one datacenter's datastores over `/folder`, through the client's connection pool and
 * login cookie. `dcPath` is the datacenter's inventory path (e.g. `DC0` or `Folder/DC1`).
 */
export class DatastoreHttp {
  constructor(
    private readonly client: VimClient,
    private readonly dcPath: string,
    private readonly timeoutMs = 120_000,
  ) {}

  /** The path and query of a datastore file's `/folder` URL. */
  private target(f: DatastorePath): string {
    const p = f.path.split('/').map(encodeURIComponent).join('/')
    return `/folder/${p}?dcPath=${encodeURIComponent(this.dcPath)}&dsName=${encodeURIComponent(f.datastore)}`
  }

  /**
   * GET of `range` of `f`, at most `max` body bytes: written into `into` when given (at least
   * `max` bytes), so a copy's range reads allocate nothing per read; the body is then a view of
   * it. Transport failures are retried twice (250, 500 ms), an expired login (HTTP 401/403)
   * is renewed once, a busy server (HTTP 503) waited for twice.
   */
  private async get(f: DatastorePath, range: string, max: number, into?: Buffer): Promise<{ status: number; contentRange: string | null; body: Buffer }> {
    for (let attempt = 0; ; attempt++) {
      const headers: Record<string, string> = { range }
      const cookie = this.client.loginCookie
      if (cookie) headers.cookie = cookie
      let res: RangeAnswer
      try {
        res = await this.client.ranges.get(this.target(f), headers, { max, into, timeoutMs: this.timeoutMs })
      } catch (e) {
        if (e instanceof MigError) throw new MigError(e.code, `[${f.datastore}] ${f.path}: ${e.message}`)
        if (attempt < 2) {
          await sleep(250 * 2 ** attempt)
          continue
        }
        throw new MigError('E_MIG_DISK_READ_FAILED', `[${f.datastore}] ${f.path}: ${(e as Error).message}`, { cause: e })
      }
      if ((res.status === 401 || res.status === 403) && attempt === 0) {
        // The login may have expired: any SOAP call logs in again on NotAuthenticated.
        await this.client.call('CurrentTime', x.ref('_this', { type: 'ServiceInstance', value: 'ServiceInstance' })).catch(() => {})
        continue
      }
      if (res.status === 503 && attempt < 2) {
        await sleep(250 * 2 ** attempt)
        continue
      }
      return { status: res.status, contentRange: res.headers['content-range'] ?? null, body: res.body }
    }
  }

  /**
   * Opens a datastore file for range reads; its size comes from the `Content-Range` of a one-byte
   * read. `E_MIG_DISK_READ_FAILED` (missing file: HTTP 404, no range support, errors).
   */
  async open(f: DatastorePath): Promise<RemoteFile> {
    const name = `[${f.datastore}] ${f.path}`
    const probe = await this.get(f, 'bytes=0-0', 1)
    if (probe.status === 416)
      return {
        name,
        size: 0,
        read: async (o, l) =>
          l === 0 ? Buffer.alloc(0) : Promise.reject(new MigError('E_MIG_DISK_READ_FAILED', `${name}: read of ${l} bytes at ${o} beyond the end (0 bytes)`)),
      }
    if (probe.status === 404) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: not found on the datastore (HTTP 404)`)
    const m = probe.contentRange ? /^bytes\s+0-0\/(\d+)$/.exec(probe.contentRange.trim()) : null
    if (probe.status !== 206 || !m) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: the datastore did not answer a range request (HTTP ${probe.status})`)
    const size = Number(m[1])
    if (!Number.isSafeInteger(size)) throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: implausible size ${m[1]}`)
    return {
      name,
      size,
      read: async (offset: number, length: number, into?: Buffer) => {
        if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0 || offset + length > size || length > MAX_RANGE) {
          throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: read of ${length} bytes at ${offset} is outside the file (${size} bytes) or too large`)
        }
        if (length === 0) return Buffer.alloc(0)
        if (length <= FAN_OUT_BYTES) return this.readRange(f, name, size, offset, length, into && into.length >= length ? into : undefined)
        const out = into && into.length >= length ? into.subarray(0, length) : Buffer.allocUnsafe(length)
        const parts: Promise<Buffer>[] = []
        for (let at = 0; at < length; at += FAN_OUT_BYTES) {
          const l = Math.min(FAN_OUT_BYTES, length - at)
          parts.push(this.readRange(f, name, size, offset + at, l, out.subarray(at, at + l)))
        }
        // Every part settles before the read answers: none writes into `out` after a failure.
        const failed = (await Promise.allSettled(parts)).find((r) => r.status === 'rejected')
        if (failed) throw failed.reason
        return out
      },
    }
  }

  /**
   * One range request of `length` bytes at `offset` of `f` (`size` bytes, named `name` in
   * messages), its answer checked (206 with the matching `Content-Range`, or 200 for the whole
   * file), its body written into `into` when given (then a view of it). `E_MIG_DISK_READ_FAILED`
   * otherwise.
   */
  private async readRange(f: DatastorePath, name: string, size: number, offset: number, length: number, into?: Buffer): Promise<Buffer> {
    const r = await this.get(f, `bytes=${offset}-${offset + length - 1}`, length, into)
    const ok = r.status === 206 && r.contentRange !== null && r.contentRange.trim().startsWith(`bytes ${offset}-${offset + length - 1}/`)
    const whole = r.status === 200 && offset === 0 && length === size
    if (!(ok || whole) || r.body.length !== length) {
      throw new MigError('E_MIG_DISK_READ_FAILED', `${name}: range read of ${length} bytes at ${offset} answered HTTP ${r.status} with ${r.body.length} bytes`)
    }
    return r.body
  }
}

/** The directory part of a datastore path, with its trailing slash (`''` at the datastore's root). */
function dirOf(f: DatastorePath): string {
  return f.path.includes('/') ? f.path.slice(0, f.path.lastIndexOf('/') + 1) : ''
}

/**
 * Where the parent of the delta disk `child` lies. `fromVsphere` is the parent's datastore path
 * from the disk's backing chain (`VirtualDiskFlatVer2BackingInfo.parent.fileName`) and wins when
 * given; otherwise the descriptor's `parentFileNameHint`: a name relative to the child's
 * directory, or an ESXi absolute path `/vmfs/volumes/<datastore>/<path>` on the child's own
 * datastore. `E_MIG_DISK_READ_FAILED` for a hint leaving the datastore (`..`, backslashes),
 * `E_MIG_UNSUPPORTED_FORMAT` for an absolute hint on another datastore without a vSphere chain.
 */
export function resolveParent(child: DatastorePath, hint: string, fromVsphere?: string): DatastorePath {
  if (fromVsphere) return parseDatastorePath(fromVsphere)
  const bad = () =>
    new MigError(
      'E_MIG_DISK_READ_FAILED',
      `[${child.datastore}] ${child.path}: parentFileNameHint ${JSON.stringify(hint.slice(0, 200))} is not a file of the datastore`,
    )
  if (hint.includes('\\') || hint.split('/').some((p) => p === '..' || p === '.') || hint.includes('\0')) throw bad()
  if (!hint.startsWith('/')) return { datastore: child.datastore, path: dirOf(child) + hint }
  const m = /^\/vmfs\/volumes\/([^/]+)\/(.+)$/.exec(hint)
  if (!m) throw bad()
  if (m[1] !== child.datastore) {
    throw new MigError(
      'E_MIG_UNSUPPORTED_FORMAT',
      `[${child.datastore}] ${child.path}: the parent disk ${hint} lies on another datastore and vSphere did not name it in the disk's backing chain`,
    )
  }
  return { datastore: m[1], path: m[2] }
}

/**
 * Opens `[ds] dir/disk.vmdk` of the datacenter `http` serves, with its snapshot delta chain, as a
 * {@link DiskReader} (see {@link openVmdkChain}). `opts.parents` is the disk's backing chain as
 * vSphere reports it (parent first, then its parent...), used before the descriptors' hints.
 */
export async function openDatastoreVmdk(
  http: DatastoreHttp,
  fileName: string,
  opts: { label: string; capacity: number; parents?: string[] },
): Promise<DiskReader> {
  const f = parseDatastorePath(fileName)
  const siblingsOf = (at: DatastorePath) => (name: string) => http.open({ datastore: at.datastore, path: dirOf(at) + name })
  const layers: DatastorePath[] = [f]
  const reader = await openVmdkChain(
    await http.open(f),
    siblingsOf(f),
    async (hint, depth) => {
      const p = resolveParent(layers[depth], hint, opts.parents?.[depth])
      layers[depth + 1] = p
      return { file: await http.open(p), openSibling: siblingsOf(p) }
    },
    opts,
  )
  return Object.assign(reader, { readAhead: DATASTORE_READ_AHEAD })
}
