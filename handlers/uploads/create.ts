// POST /uploads: multipart upload, 20 GiB cap (spec 4, 8).
import { randomUUID } from 'node:crypto'
import { join } from 'node:path'
import { json, query } from '../../runtime/http.ts'
import type { Ctx } from '../../runtime/context.ts'
import { receiveUpload } from '../../lib/uploads/receive.ts'

export const method = 'POST'
export const path = '/uploads'
/** The one state-changing route whose body is not JSON (runtime/router.ts checks it). */
export const accepts = 'multipart/form-data'

/**
 * `multipart/form-data` with the field `file` and an optional `sha256` (form field or query
 * parameter); streamed to `imports/.uploads/<upload-id>`. 201 with the upload. Throws
 * `E_MIG_UPLOAD_REJECTED` (413 over the cap, 422 sha256 mismatch, 400 aborted body),
 * `E_MIG_BAD_REQUEST`, `E_MIG_DISK_WRITE_FAILED`, `E_MIG_PERSIST_FAILED`. A failed upload leaves
 * no file and no record.
 */
export async function handle(request: Request, ctx: Ctx): Promise<Response> {
  const id = randomUUID()
  const now = ctx.now()
  const expires = new Date(now.getTime() + ctx.config.uploadTtlSeconds * 1000)
  const length = request.headers.get('content-length')
  await ctx.store.uploads.begin({ id, filename: '', now: now.toISOString(), expires_at: expires.toISOString() })
  try {
    const got = await receiveUpload({
      body: request.body,
      contentType: request.headers.get('content-type'),
      contentLength: length === null ? null : Number(length),
      dest: join(ctx.paths.uploads, id),
      capBytes: ctx.config.uploadCapBytes,
      expectedSha256: query(request).get('sha256'),
    })
    const upload = await ctx.store.uploads.finish(id, got.size_bytes, got.sha256, got.filename)
    ctx.logger.info({ upload: id, size_bytes: got.size_bytes }, 'upload received')
    return json(upload, 201)
  } catch (e) {
    await ctx.store.uploads.remove(id).catch(() => {})
    throw e
  }
}
