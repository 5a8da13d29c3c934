/**
 * Write transactions of the store that report their own failure. kysely's `transaction()` runs
 * ROLLBACK after a failed statement or COMMIT; when SQLite has already rolled the transaction
 * back (SQLITE_FULL, SQLITE_IOERR end it on their own), that ROLLBACK fails with "cannot
 * rollback - no transaction is active" and its error replaces the one that matters. Here the
 * original error is the one thrown.
 */
import { sql, type Kysely } from 'kysely'
import type { Database } from './schema.ts'

/**
 * Runs `fn` in a `BEGIN IMMEDIATE` transaction (the database's write lock taken at once, so
 * the reads inside see what no other writer changes before the commit) on one connection of
 * `db`. Throws what `fn`, BEGIN or COMMIT threw; a ROLLBACK that fails after it is ignored.
 */
export function writeTransaction<T>(db: Kysely<Database>, fn: (tx: Kysely<Database>) => Promise<T>): Promise<T> {
  return db.connection().execute(async (conn) => {
    await sql`begin immediate`.execute(conn)
    let result: T
    try {
      result = await fn(conn)
      await sql`commit`.execute(conn)
    } catch (e) {
      await sql`rollback`.execute(conn).catch(() => {})
      throw e
    }
    return result
  })
}
