/**
 * Start-up failure reporting shared by both servers: a clear one-line message on stderr and
 * exit status 1 (a bad key file, a malformed variable, a store that cannot open).
 */

/** Prints why the server cannot start and exits with status 1. */
export function fatalStartup(e: unknown): never {
  const message = e instanceof Error ? e.message : String(e)
  process.stderr.write(`migrator: cannot start: ${message}\n`)
  process.exit(1)
}
