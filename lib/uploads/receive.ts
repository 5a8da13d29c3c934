/**
 * Streaming receipt of a multipart upload (spec 4 `POST /uploads`, 8: 20 GiB cap, sha256).
 *
 * The multipart body is parsed as it arrives (busboy); the `file` part is hashed (SHA-256) and
 * written to its destination with backpressure, so memory stays flat whatever the size. The cap
 * is enforced on the bytes actually received, whatever `Content-Length` claims. On any failure
 * (cap breach, digest mismatch, malformed body, client abort) the partial file is removed.
 */
import { createHash } from 'node:crypto'
import { createWriteStream } from 'node:fs'
import { open, unlink } from 'node:fs/promises'
import { Readable, Transform } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import busboy from 'busboy'
import { MigError } from '../errors.ts'

/** What a completed upload produced: bytes written, SHA-256 hex, client file name. */
export interface ReceivedUpload {
  size_bytes: number
  sha256: string
  filename: string
}

/** Options of {@link receiveUpload}. */
export interface ReceiveOptions {
  /** The request body. */
  body: ReadableStream<Uint8Array> | null
  /** The request's `Content-Type` (must be `multipart/form-data` with a boundary). */
  contentType: string | null
  /** `Content-Length` as claimed, or null; only used to refuse early. */
  contentLength: number | null
  /** File to create (must not exist). */
  dest: string
  /** Size cap of the file part, bytes. */
  capBytes: number
  /** Expected SHA-256 (hex) from the query; a `sha256` form field may also give it. */
  expectedSha256?: string | null
}

const SHA256_HEX = /^[0-9a-f]{64}$/

/**
 * The chunks of a WHATWG stream, pulled one at a time (so backpressure holds). Works for the
 * runtime's own streams and for ponyfilled ones (@whatwg-node under Node), unlike `Readable.fromWeb`.
 */
async function* chunksOf(body: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const reader = body.getReader()
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) return
      yield value
    }
  } finally {
    reader.releaseLock()
  }
}

function rejected(message: string, status: number): MigError {
  return new MigError('E_MIG_UPLOAD_REJECTED', message, { status })
}

/**
 * Receives the multipart field `file` into `opts.dest`.
 * Throws `E_MIG_UPLOAD_REJECTED` (413: over the cap; 422: sha256 mismatch or malformed digest;
 * 400: body aborted), `E_MIG_BAD_REQUEST` (not multipart, no `file` field, several files),
 * `E_MIG_DISK_WRITE_FAILED` (the destination cannot be written). Nothing is left at `dest` on
 * failure.
 */
export async function receiveUpload(opts: ReceiveOptions): Promise<ReceivedUpload> {
  if (!opts.body) throw new MigError('E_MIG_BAD_REQUEST', 'upload needs a multipart/form-data body with a "file" field')
  if (!opts.contentType || !/^multipart\/form-data\b/i.test(opts.contentType)) {
    throw new MigError('E_MIG_BAD_REQUEST', 'upload must be multipart/form-data with a "file" field')
  }
  if (opts.contentLength !== null && opts.contentLength > opts.capBytes + 1024 * 1024) {
    throw rejected(`upload of ${opts.contentLength} bytes exceeds the cap of ${opts.capBytes} bytes`, 413)
  }
  let expected = opts.expectedSha256?.toLowerCase() ?? null
  if (expected !== null && !SHA256_HEX.test(expected)) throw rejected('sha256 must be 64 hexadecimal digits', 422)

  let bb: busboy.Busboy
  try {
    // defParamCharset utf8: browsers and curl send the filename parameter's bytes as UTF-8.
    bb = busboy({
      headers: { 'content-type': opts.contentType },
      defParamCharset: 'utf8',
      limits: { files: 1, fields: 8, fieldSize: 1024, parts: 16, headerPairs: 64 },
    })
  } catch (e) {
    throw new MigError('E_MIG_BAD_REQUEST', `malformed multipart body: ${(e as Error).message}`)
  }

  const hash = createHash('sha256')
  let size = 0
  let filename = ''
  let created = false
  let failure: MigError | null = null
  let fileDone: Promise<void> | null = null
  const source = Readable.from(chunksOf(opts.body), { objectMode: false })

  const fail = (e: MigError) => {
    if (failure === null) failure = e
    source.destroy(e)
  }

  bb.on('field', (name, value) => {
    if (name !== 'sha256') return
    const v = value.trim().toLowerCase()
    if (!SHA256_HEX.test(v)) fail(rejected('sha256 must be 64 hexadecimal digits', 422))
    else if (expected !== null && expected !== v) fail(rejected('sha256 given twice with different values', 422))
    else expected = v
  })
  // Past `limits.files`, busboy drops further file parts silently: a second one is refused.
  bb.on('filesLimit', () => fail(new MigError('E_MIG_BAD_REQUEST', 'only one "file" part is accepted')))
  bb.on('file', (name, stream, info) => {
    if (name !== 'file' || fileDone !== null) {
      stream.resume()
      if (name === 'file') fail(new MigError('E_MIG_BAD_REQUEST', 'only one "file" part is accepted'))
      return
    }
    filename = info.filename ?? ''
    const meter = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        size += chunk.length
        if (size > opts.capBytes) {
          cb(rejected(`upload exceeds the cap of ${opts.capBytes} bytes`, 413))
          return
        }
        hash.update(chunk)
        cb(null, chunk)
      },
    })
    created = true
    fileDone = pipeline(stream, meter, createWriteStream(opts.dest, { flags: 'wx', mode: 0o640 })).catch((e) => {
      fail(e instanceof MigError ? e : new MigError('E_MIG_DISK_WRITE_FAILED', `upload ${opts.dest}: ${(e as Error).message}`))
    })
  })

  try {
    await pipeline(source, bb).catch((e) => {
      if (failure === null) failure = e instanceof MigError ? e : rejected(`upload aborted: ${(e as Error).message}`, 400)
    })
    if (fileDone) await fileDone
    if (failure) throw failure
    if (!fileDone) throw new MigError('E_MIG_BAD_REQUEST', 'multipart body has no "file" field')
    const digest = hash.digest('hex')
    if (expected !== null && digest !== expected) throw rejected(`sha256 mismatch: expected ${expected}, received ${digest}`, 422)
    const fh = await open(opts.dest, 'r')
    try {
      await fh.sync()
    } finally {
      await fh.close()
    }
    return { size_bytes: size, sha256: digest, filename }
  } catch (e) {
    if (created) await unlink(opts.dest).catch(() => {})
    throw e
  }
}
