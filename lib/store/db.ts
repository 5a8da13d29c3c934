/**
 * Opens the SQLite store with the dialect of the running runtime: `bun:sqlite` through
 * kysely-bun-sqlite under Bun, better-sqlite3 under Node (DESIGN.md section 2). This is the only
 * place of the store that knows which runtime runs; the query code is the same for both.
 */
import { mkdirSync } from 'node:fs'
import * as path from 'node:path'
import { Kysely, Migrator, SqliteDialect, type Dialect } from 'kysely'
import { MigError } from '../errors.ts'
import { migrationProvider } from './schema-migrations.ts'
import type { Database } from './schema.ts'

const isBun = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined'

/** Pragmas of every connection: WAL journal, 5 s busy wait, durable commits in WAL mode. */
const PRAGMAS = ['journal_mode = WAL', 'synchronous = NORMAL', 'busy_timeout = 5000', 'foreign_keys = ON']

async function dialectFor(file: string): Promise<Dialect> {
  if (isBun) {
    const { Database: BunDatabase } = await import('bun:sqlite')
    const { BunSqliteDialect } = await import('kysely-bun-sqlite')
    const database = new BunDatabase(file, { create: true })
    for (const p of PRAGMAS) database.exec(`PRAGMA ${p}`)
    return new BunSqliteDialect({ database }) as unknown as Dialect
  }
  const { default: BetterSqlite3 } = await import('better-sqlite3')
  const database = new BetterSqlite3(file)
  for (const p of PRAGMAS) database.pragma(p)
  return new SqliteDialect({ database })
}

/**
 * Opens (creating when missing) the database file `file`, whose directory is created mode 0700,
 * and applies pending migrations. Throws `E_MIG_PERSIST_FAILED` when the file cannot be opened
 * or migrated.
 */
export async function openDatabase(file: string): Promise<Kysely<Database>> {
  try {
    mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 })
    const db = new Kysely<Database>({ dialect: await dialectFor(file) })
    const { error } = await new Migrator({ db, provider: migrationProvider }).migrateToLatest()
    if (error) throw error
    return db
  } catch (e) {
    throw new MigError('E_MIG_PERSIST_FAILED', `store: cannot open ${file}: ${e instanceof Error ? e.message : String(e)}`, { cause: e })
  }
}
