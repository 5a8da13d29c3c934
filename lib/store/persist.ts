/**
 * Maps store failures to `E_MIG_PERSIST_FAILED` (spec 7) so a read-only or full database never
 * takes the server down: the request fails with 503 and the next one is tried afresh.
 */
import { MigError } from '../errors.ts'

/**
 * Runs a store operation; any error that is not already a MigError (SQLITE_FULL, SQLITE_READONLY,
 * SQLITE_IOERR, a closed database) becomes `E_MIG_PERSIST_FAILED` naming `what` and the cause.
 */
export async function persist<T>(what: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn()
  } catch (e) {
    if (e instanceof MigError) throw e
    const reason = e instanceof Error ? e.message : String(e)
    throw new MigError('E_MIG_PERSIST_FAILED', `store: ${what} failed: ${reason}`, { cause: e })
  }
}
