/**
 * The API token of the TCP listener and the console's login tickets and session cookies derived
 * from it (docs/security.md "Local users").
 *
 * - The token: 32 random bytes written base64url (RFC 4648 section 5, no padding: 43 characters)
 *   and a newline, in `<data dir>/api-token`, a regular file of mode 0600 owned by the server's
 *   user. Created at the first start with a TCP listener; replaced atomically by
 *   {@link rotateToken} (`migrator token rotate`). Clients send it as `Authorization: Bearer`.
 * - A login ticket (`?ticket=` of the printed login link): `<expiry>.<nonce>.<mac>`, expiry in
 *   Unix seconds, 16 random bytes of nonce, and an HMAC-SHA256 keyed with the token. The server
 *   accepts each nonce once (runtime/auth.ts). Anyone who can read the token file can mint one.
 * - A session (the console's cookie): the same shape with another MAC label, so a ticket is never
 *   a session and the reverse. Rotating the token ends every session and every ticket.
 *
 * Comparisons are constant-time over SHA-256 digests (`timingSafeEqual` needs equal lengths; the
 * digests hide the length of what was sent).
 */
import { closeSync, constants, fstatSync, fsyncSync, openSync, readSync, renameSync, statSync, unlinkSync, writeSync } from 'node:fs'
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import * as path from 'node:path'

/** Bytes of randomness in a token. */
export const TOKEN_BYTES = 32
/** The token file's name under the data directory. */
export const TOKEN_FILE = 'api-token'
/** Seconds a login ticket is valid. */
export const TICKET_SECONDS = 600
/** Seconds a console session is valid. */
export const SESSION_SECONDS = 12 * 3600

const TOKEN_RE = /^[A-Za-z0-9_-]{43}$/

/** Why a token file cannot be used (names the file, the cause and the fix). */
export class TokenFileError extends Error {
  override name = 'TokenFileError'
}

/** `<dataDir>/api-token`. */
export function tokenPath(dataDir: string): string {
  return path.join(dataDir, TOKEN_FILE)
}

/** A new token: {@link TOKEN_BYTES} random bytes, base64url. */
export function newToken(): string {
  return randomBytes(TOKEN_BYTES).toString('base64url')
}

/**
 * Reads the token of `file`. Returns null when the file does not exist; throws
 * {@link TokenFileError} when it is not a regular file, is accessible by group or others, or
 * does not hold a token.
 */
export function readToken(file: string): string | null {
  let fd: number
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW)
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null
    throw new TokenFileError(`cannot open the API token file ${file}: ${(e as Error).message}`)
  }
  try {
    const st = fstatSync(fd)
    if (!st.isFile()) throw new TokenFileError(`the API token file ${file} is not a regular file`)
    if ((st.mode & 0o077) !== 0) {
      throw new TokenFileError(
        `the API token file ${file} has mode ${(st.mode & 0o777).toString(8)}: it must not be accessible by group or others (chmod 600 ${file})`,
      )
    }
    const buf = Buffer.alloc(128)
    const n = readSync(fd, buf, 0, buf.length, 0)
    const text = buf.subarray(0, n).toString('utf8').trim()
    if (!TOKEN_RE.test(text))
      throw new TokenFileError(`the API token file ${file} does not hold a token (43 base64url characters); remove it and restart the server for a new one`)
    return text
  } finally {
    closeSync(fd)
  }
}

/** Writes `token` to a new 0600 file next to `file` and renames it over `file` (readers see the old or the new token, never a part). */
function writeAtomically(file: string, token: string): void {
  const tmp = `${file}.${randomBytes(6).toString('hex')}.tmp`
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600)
  try {
    writeSync(fd, `${token}\n`)
    fsyncSync(fd)
  } catch (e) {
    closeSync(fd)
    unlinkSync(tmp)
    throw e
  }
  closeSync(fd)
  renameSync(tmp, file)
}

/** The token of `file`, created (mode 0600) when the file does not exist. Throws {@link TokenFileError} as {@link readToken}. */
export function loadOrCreateToken(file: string): string {
  const have = readToken(file)
  if (have !== null) return have
  const token = newToken()
  writeAtomically(file, token)
  return token
}

/** Replaces the token of `file` by a new one and returns it: the old token, its tickets and sessions are refused from then on. */
export function rotateToken(file: string): string {
  const token = newToken()
  writeAtomically(file, token)
  return token
}

/**
 * A reader of the token file that re-reads it only when it changed (inode, size or mtime), so
 * a rotation takes effect on the next request. `current()` is null when the file is missing or
 * unusable (then no token, ticket or session is accepted).
 */
export function tokenWatcher(file: string): { current(): string | null } {
  let key = ''
  let token: string | null = null
  return {
    current() {
      let st: ReturnType<typeof statSync>
      try {
        st = statSync(file)
      } catch {
        key = ''
        token = null
        return null
      }
      const k = `${st.ino}:${st.size}:${st.mtimeMs}`
      if (k !== key) {
        key = k
        try {
          token = readToken(file)
        } catch {
          token = null
        }
      }
      return token
    },
  }
}

const digest = (s: string) => createHash('sha256').update(s).digest()

/** Constant-time equality of two strings (over their SHA-256 digests). */
export function sameSecret(a: string, b: string): boolean {
  return timingSafeEqual(digest(a), digest(b))
}

function mac(token: string, label: 'ticket' | 'session', expiry: number, nonce: string): string {
  return createHmac('sha256', token).update(`migrator-${label}\n${expiry}\n${nonce}`).digest('base64url')
}

function mint(token: string, label: 'ticket' | 'session', now: Date, seconds: number): string {
  const expiry = Math.floor(now.getTime() / 1000) + seconds
  const nonce = randomBytes(16).toString('base64url')
  return `${expiry}.${nonce}.${mac(token, label, expiry, nonce)}`
}

/** What {@link verify} found in a valid ticket or session: its expiry (Unix seconds) and nonce. */
export interface Signed {
  expiry: number
  nonce: string
}

function verify(token: string, label: 'ticket' | 'session', value: string, now: Date): Signed | null {
  const m = /^(\d{1,12})\.([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})$/.exec(value)
  if (!m) return null
  const expiry = Number(m[1])
  if (!sameSecret(m[3]!, mac(token, label, expiry, m[2]!))) return null
  if (expiry * 1000 <= now.getTime()) return null
  return { expiry, nonce: m[2]! }
}

/** A login ticket valid {@link TICKET_SECONDS} from `now`. */
export function mintTicket(token: string, now = new Date()): string {
  return mint(token, 'ticket', now, TICKET_SECONDS)
}

/** The ticket's expiry and nonce when `ticket` was made with `token` and has not expired; else null. Single use is the caller's. */
export function verifyTicket(token: string, ticket: string, now = new Date()): Signed | null {
  return verify(token, 'ticket', ticket, now)
}

/** A console session valid {@link SESSION_SECONDS} from `now`. */
export function mintSession(token: string, now = new Date()): string {
  return mint(token, 'session', now, SESSION_SECONDS)
}

/** True when `session` was made with `token` and has not expired. */
export function verifySession(token: string, session: string, now = new Date()): boolean {
  return verify(token, 'session', session, now) !== null
}

/** The console's login link on the API base `base` (`http://127.0.0.1:8080/api/v1/migrator`). */
export function loginLink(base: string, ticket: string): string {
  return `${base.replace(/\/+$/, '')}/ui/login?ticket=${encodeURIComponent(ticket)}`
}
