/**
 * Block digests off the job's event loop: the XVA reader checks every 1 MiB block
 * against its `.checksum` (SHA-1) or `.xxhash` (XXH64) companion. The SHA-1 does not run on the
 * event loop: WebCrypto there needs a copy of a `SharedArrayBuffer` view, and the copy and its
 * garbage slow the whole job (by about a third on an 8 GiB archive: docs/benchmarks.md). Here a view on a `SharedArrayBuffer` (the copy
 * loop's buffers) is SHA-1-hashed in place on one of a few {@link ScriptThread}s with
 * `node:crypto`. XXH64 stays on the calling thread: `Bun.hash.xxHash64` hashes such a view in
 * place at several GB/s (docs/benchmarks.md), less than a thread's round trip costs.
 */
import { createXXHash64, type IHasher } from 'hash-wasm'
import { availableParallelism } from 'node:os'
import { isSharedView, ScriptThread } from '../script-thread.ts'

/** The handler: the SHA-1 of the view, lower-case hex. */
const HANDLER = `(() => {
  const { createHash } = require('node:crypto')
  return (m) => createHash('sha1').update(m.data).digest('hex')
})()`

/** Hashing threads: one per core, at most 4 (a block is 1 MiB; more threads only wait). */
const THREADS = Math.max(1, Math.min(4, availableParallelism()))

let threads: Array<ScriptThread<{ data: Uint8Array }, string>> | null = null

/** SHA-1 of `data` (a `SharedArrayBuffer` view) in place on the hashing thread with the fewest calls pending. */
function onThread(data: Uint8Array): Promise<string> {
  threads ??= Array.from({ length: THREADS }, (_, i) => new ScriptThread(HANDLER, `hashing thread ${i + 1}`))
  let best = threads[0]!
  for (const t of threads) if (t.pending < best.pending) best = t
  return best.call({ data })
}

/**
 * SHA-1 (FIPS 180-4) of `data` as 40 lower-case hex digits. A view on a `SharedArrayBuffer` is
 * hashed in place on a hashing thread: the caller keeps those bytes unchanged until the promise
 * settles. Any other view is copied at the call (WebCrypto), so its buffer may be reused at once.
 * Rejects only if a hashing thread died (`ScriptThreadError`).
 */
export function sha1Hex(data: Uint8Array): Promise<string> {
  if (isSharedView(data)) return onThread(data)
  return crypto.subtle.digest('SHA-1', data as Uint8Array<ArrayBuffer>).then((d) => Buffer.from(d).toString('hex'))
}

/** Under Node, the XXH64 hasher (seed 0), loaded on first use: hash-wasm's WebAssembly build. */
let wasmXxh64: Promise<IHasher> | null = null

/**
 * XXH64 (seed 0) of `data` as 16 lower-case hex digits, on the calling thread: under Bun with
 * `Bun.hash.xxHash64` at the call (any view, a `SharedArrayBuffer`'s too; about 8 GB/s here).
 * Node has no native XXH64: hash-wasm's (7 GB/s, and a copy into its memory), loaded at the first
 * call (the caller keeps `data` unchanged until the promise settles, so the bytes are read after
 * the load). Rejects only if hash-wasm's module cannot be loaded (Node).
 */
export async function xxh64Hex(data: Uint8Array): Promise<string> {
  if (typeof Bun !== 'undefined') return Bun.hash.xxHash64(data).toString(16).padStart(16, '0')
  wasmXxh64 ??= createXXHash64(0, 0)
  const h = await wasmXxh64
  h.init()
  h.update(data)
  return h.digest('hex')
}
