/**
 * Repository of multipart uploads (spec 2.4). A row is `receiving` while its body streams in and
 * `ready` once complete and verified; only `ready`, unexpired uploads are visible.
 */
import type { Kysely, Selectable } from 'kysely'
import { MigError } from '../errors.ts'
import { persist } from './persist.ts'
import type { Database, UploadsTable } from './schema.ts'

/** The upload resource: `size_bytes` in bytes, `sha256` lower-case hex. */
export interface Upload {
  id: string
  filename: string
  size_bytes: number
  sha256: string | null
  status: 'receiving' | 'ready'
  created_at: string
  expires_at: string
}

function toUpload(r: Selectable<UploadsTable>): Upload {
  return { ...r, status: r.status as Upload['status'] }
}

/** Uploads table access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class UploadsRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** Records an upload that starts streaming. */
  begin(u: { id: string; filename: string; now: string; expires_at: string }): Promise<void> {
    return persist('record upload', async () => {
      await this.db
        .insertInto('uploads')
        .values({ id: u.id, filename: u.filename, size_bytes: 0, sha256: null, status: 'receiving', created_at: u.now, expires_at: u.expires_at })
        .execute()
    })
  }

  /** Marks an upload complete with its size (bytes), digest and client file name (cut to 255 characters). */
  finish(id: string, size: number, sha256: string, filename: string): Promise<Upload> {
    return persist('complete upload', async () => {
      await this.db
        .updateTable('uploads')
        .set({ filename: filename.slice(0, 255), size_bytes: size, sha256, status: 'ready' })
        .where('id', '=', id)
        .execute()
      return toUpload(await this.db.selectFrom('uploads').selectAll().where('id', '=', id).executeTakeFirstOrThrow())
    })
  }

  /** Ready uploads not yet expired at `now`, oldest first. */
  list(now: string): Promise<Upload[]> {
    return persist('list uploads', async () =>
      (
        await this.db
          .selectFrom('uploads')
          .selectAll()
          .where('status', '=', 'ready')
          .where('expires_at', '>', now)
          .orderBy('created_at')
          .orderBy('id')
          .execute()
      ).map(toUpload),
    )
  }

  /** One ready, unexpired upload; `E_MIG_UPLOAD_NOT_FOUND` otherwise. */
  async get(id: string, now: string): Promise<Upload> {
    const row = await persist('load upload', () => this.db.selectFrom('uploads').selectAll().where('id', '=', id).executeTakeFirst())
    if (row?.status !== 'ready' || row.expires_at <= now) throw new MigError('E_MIG_UPLOAD_NOT_FOUND', `upload ${id} not found (expired or removed)`)
    return toUpload(row)
  }

  /** Deletes the row; returns whether it existed. */
  remove(id: string): Promise<boolean> {
    return persist('delete upload', async () => Number((await this.db.deleteFrom('uploads').where('id', '=', id).executeTakeFirst()).numDeletedRows) > 0)
  }

  /** Ids of uploads expired at `now`, or still `receiving` from before `staleBefore` (a crash mid-upload). */
  expired(now: string, staleBefore: string): Promise<string[]> {
    return persist('list expired uploads', async () =>
      (
        await this.db
          .selectFrom('uploads')
          .select('id')
          .where((eb) => eb.or([eb('expires_at', '<=', now), eb.and([eb('status', '=', 'receiving'), eb('created_at', '<', staleBefore)])]))
          .execute()
      ).map((r) => r.id),
    )
  }
}
