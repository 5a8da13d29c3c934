/**
 * A remote input file (an export on an HTTP(S) server, roadmap v0.3 "remote offline inputs") as
 * the format readers see it: a size and positioned reads. Lives in `lib/contracts/` because the
 * input scope (`lib/hostpath.ts`), the format helpers (`lib/formats/io.ts`) and the remote
 * transports (`lib/remote/`) all depend on it.
 */

/**
 * One remote object, opened once per inspect or job (its identity, ETag or Last-Modified and
 * size, is taken at open and checked on every read).
 * - `name`: how messages and the manifest name it (the URL, never with credentials).
 * - `size`: bytes; `identity`: the version read (see the field).
 * - `read(into, pos)`: fills `into` with the bytes at `pos`; returns how many (short only at the
 *   end of the object). Throws `E_MIG_DISK_READ_FAILED` naming the object and offset (the object
 *   changed, the connection kept failing), `E_MIG_AUTH_FAILED`, `E_MIG_NOT_FOUND`.
 * - `readAhead(on)` (optional): turns sequential read-ahead on for a copy (lib/remote/read-ahead.ts;
 *   off by default, and for an inspection).
 * - `close()`: closes its connections; idempotent, never throws.
 */
export interface RemoteFile {
  readonly name: string
  readonly size: number
  /**
   * The version read, as text (`ETag "..." , <size> bytes`): equal for the same object, different
   * once it was replaced (when the server gives a validator; else by size only).
   */
  readonly identity: string
  read(into: Buffer, pos: number): Promise<number>
  readAhead?(on: boolean): void
  close(): void
}
