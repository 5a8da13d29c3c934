/**
 * Repository of the credentials of remote offline inputs (roadmap v0.3). The sealed secret never
 * leaves this module except through {@link RemoteCredentialsRepo.getSealed}, for the job or
 * inspect that opens the remote input.
 */
import type { Kysely, Selectable } from 'kysely'
import { MigError } from '../errors.ts'
import { persist } from './persist.ts'
import type { Database, RemoteCredentialsTable } from './schema.ts'

/** A credential as the API returns it: never the secret or its ciphertext. */
export interface RemoteCredential {
  id: string
  name: string
  kind: string
  username: string | null
  created_at: string
  updated_at: string
}

function toPublic(r: Selectable<RemoteCredentialsTable>): RemoteCredential {
  return { id: r.id, name: r.name, kind: r.kind, username: r.username, created_at: r.created_at, updated_at: r.updated_at }
}

/** `remote_credentials` table access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class RemoteCredentialsRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** All credentials, oldest first. */
  list(): Promise<RemoteCredential[]> {
    return persist('list remote credentials', async () =>
      (await this.db.selectFrom('remote_credentials').selectAll().orderBy('created_at').orderBy('id').execute()).map(toPublic),
    )
  }

  /** One credential; `E_MIG_NOT_FOUND` when absent. */
  async get(id: string): Promise<RemoteCredential> {
    return toPublic(await this.row(id))
  }

  /** The credential with its sealed secret (AES-256-GCM envelope bound to the id, lib/crypto/seal.ts). */
  async getSealed(id: string): Promise<RemoteCredential & { secret: string }> {
    const r = await this.row(id)
    return { ...toPublic(r), secret: r.secret }
  }

  private async row(id: string): Promise<Selectable<RemoteCredentialsTable>> {
    const row = await persist('load remote credential', () => this.db.selectFrom('remote_credentials').selectAll().where('id', '=', id).executeTakeFirst())
    if (!row) throw new MigError('E_MIG_NOT_FOUND', `remote credential ${id} not found`)
    return row
  }

  /** Inserts a credential; `E_MIG_CONFLICT` when the name is taken. */
  async create(c: { id: string; name: string; kind: string; username: string | null; secret: string; now: string }): Promise<RemoteCredential> {
    return persist('create remote credential', async () => {
      const taken = await this.db.selectFrom('remote_credentials').select('id').where('name', '=', c.name).executeTakeFirst()
      if (taken) throw new MigError('E_MIG_CONFLICT', `a remote credential named ${JSON.stringify(c.name)} already exists (${taken.id})`)
      const row = { id: c.id, name: c.name, kind: c.kind, username: c.username, secret: c.secret, created_at: c.now, updated_at: c.now }
      await this.db.insertInto('remote_credentials').values(row).execute()
      return toPublic(row)
    })
  }

  /** Deletes a credential; `E_MIG_NOT_FOUND` when absent. */
  async delete(id: string): Promise<void> {
    const r = await persist('delete remote credential', () => this.db.deleteFrom('remote_credentials').where('id', '=', id).executeTakeFirst())
    if (Number(r.numDeletedRows) === 0) throw new MigError('E_MIG_NOT_FOUND', `remote credential ${id} not found`)
  }
}
