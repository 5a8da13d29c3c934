/**
 * Repository of registered live sources (spec 2.2). The sealed password never leaves this module
 * except through {@link SourcesRepo.getSealedSecret}, for the adapter that connects.
 */
import type { Kysely, Selectable } from 'kysely'
import { MigError } from '../errors.ts'
import { persist } from './persist.ts'
import type { Database, SourcesTable } from './schema.ts'
import type { SourceTls } from '../contracts/source-tls.ts'

/** A source as the API returns it: never the password or its ciphertext. */
export interface Source {
  id: string
  name: string
  kind: string
  endpoint: string
  username: string
  tls: { insecure: boolean; thumbprint: string | null; has_ca: boolean }
  /** `libvirt_remote` over SSH: the pinned host key lines; null otherwise. */
  known_hosts?: string | null
  created_at: string
  updated_at: string
}

/** A source with its TLS material, for the adapter (still without the password). */
export interface SourceWithTls extends Source {
  tls_config: SourceTls
}

function toSource(r: Selectable<SourcesTable>): SourceWithTls {
  const tls = JSON.parse(r.tls) as SourceTls
  return {
    id: r.id,
    name: r.name,
    kind: r.kind,
    endpoint: r.endpoint,
    username: r.username,
    tls: { insecure: tls.insecure === true, thumbprint: tls.thumbprint ?? null, has_ca: typeof tls.ca_pem === 'string' },
    ...(r.kind === 'libvirt_remote' ? { known_hosts: tls.known_hosts ?? null } : {}),
    created_at: r.created_at,
    updated_at: r.updated_at,
    tls_config: tls,
  }
}

/** Drops the TLS material so the record can be returned to a client. */
export function publicSource(s: SourceWithTls): Source {
  const { tls_config: _ignored, ...pub } = s
  return pub
}

/** Sources table access. Every method throws `E_MIG_PERSIST_FAILED` on store failure. */
export class SourcesRepo {
  constructor(private readonly db: Kysely<Database>) {}

  /** All sources, oldest first. */
  list(): Promise<SourceWithTls[]> {
    return persist('list sources', async () => (await this.db.selectFrom('sources').selectAll().orderBy('created_at').orderBy('id').execute()).map(toSource))
  }

  /** One source; `E_MIG_NOT_FOUND` when absent. */
  async get(id: string): Promise<SourceWithTls> {
    const row = await persist('load source', () => this.db.selectFrom('sources').selectAll().where('id', '=', id).executeTakeFirst())
    if (!row) throw new MigError('E_MIG_NOT_FOUND', `source ${id} not found`)
    return toSource(row)
  }

  /** The sealed password of a source (AES-256-GCM envelope, see lib/crypto/seal.ts). */
  async getSealedSecret(id: string): Promise<string> {
    const row = await persist('load source secret', () => this.db.selectFrom('sources').select('secret').where('id', '=', id).executeTakeFirst())
    if (!row) throw new MigError('E_MIG_NOT_FOUND', `source ${id} not found`)
    return row.secret
  }

  /** Inserts a source; `E_MIG_CONFLICT` when the name is taken. */
  async create(s: {
    id: string
    name: string
    kind: string
    endpoint: string
    username: string
    secret: string
    tls: SourceTls
    now: string
  }): Promise<SourceWithTls> {
    return persist('create source', async () => {
      const taken = await this.db.selectFrom('sources').select('id').where('name', '=', s.name).executeTakeFirst()
      if (taken) throw new MigError('E_MIG_CONFLICT', `a source named ${JSON.stringify(s.name)} already exists (${taken.id})`)
      const row = {
        id: s.id,
        name: s.name,
        kind: s.kind,
        endpoint: s.endpoint,
        username: s.username,
        secret: s.secret,
        tls: JSON.stringify(s.tls),
        created_at: s.now,
        updated_at: s.now,
      }
      await this.db.insertInto('sources').values(row).execute()
      return toSource(row)
    })
  }

  /** Deletes a source; `E_MIG_NOT_FOUND` when absent. */
  async delete(id: string): Promise<void> {
    const r = await persist('delete source', () => this.db.deleteFrom('sources').where('id', '=', id).executeTakeFirst())
    if (Number(r.numDeletedRows) === 0) throw new MigError('E_MIG_NOT_FOUND', `source ${id} not found`)
  }
}
