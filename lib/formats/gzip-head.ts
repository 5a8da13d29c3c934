/**
 * The head of a gzip stream without inflating all of it (RFC 1952), for sniffing the format of a
 * compressed disk (`ovf:compression="gzip"`) from its first bytes.
 */
import { gunzipSync, constants as zconst } from 'node:zlib'

/**
 * First bytes (at most 64 KiB) of a gzip member (`ovf:compression="gzip"`): inflates growing
 * prefixes of the compressed data (512 B .. 64 KiB) until at least 512 bytes come out, each
 * attempt capped at 16 MiB of output (deflate expands at most ~1032:1). Empty when it cannot
 * be inflated.
 */
export function inflateHead(gz: Uint8Array): Buffer {
  let best = Buffer.alloc(0)
  for (const n of [512, 2048, 8192, 32768, 65536]) {
    try {
      const out = gunzipSync(gz.subarray(0, n), { finishFlush: zconst.Z_SYNC_FLUSH, maxOutputLength: 16 * 1024 * 1024 })
      if (out.length > best.length) best = out.subarray(0, 64 * 1024)
      if (out.length >= 512 || n >= gz.length) break
    } catch {
      break
    }
  }
  return best
}
