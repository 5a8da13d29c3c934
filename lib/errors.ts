/**
 * Error codes of the migrator (spec section 7) and their HTTP statuses (DESIGN.md section 3).
 *
 * Every failure the service reports carries exactly one of these codes. Code paths throw
 * {@link MigError}; the runtime turns it into the error body
 * `{"error": {"code", "message", "details"?}}` with the status of {@link httpStatusOf}.
 */

/** All 24 error codes of spec section 7, in the spec's order. */
export const ERROR_CODES = [
  'E_MIG_SOURCE_UNREACHABLE',
  'E_MIG_AUTH_FAILED',
  'E_MIG_VM_NOT_FOUND',
  'E_MIG_CBT_UNSUPPORTED',
  'E_MIG_CBT_RESET',
  'E_MIG_SNAPSHOT_FAILED',
  'E_MIG_DISK_READ_FAILED',
  'E_MIG_DISK_WRITE_FAILED',
  'E_MIG_V2V_FAILED',
  'E_MIG_DOMAIN_DEFINE_FAILED',
  'E_MIG_GUEST_BOOT_FAILED',
  'E_MIG_DELTA_TOO_LARGE',
  'E_MIG_CANCELLED',
  'E_MIG_INVALID_PLAN',
  'E_MIG_PERSIST_FAILED',
  'E_MIG_UNSUPPORTED_FORMAT',
  'E_MIG_MALFORMED_ARCHIVE',
  'E_MIG_UPLOAD_NOT_FOUND',
  'E_MIG_UPLOAD_REJECTED',
  'E_MIG_HOST_PATH_REJECTED',
  'E_MIG_NOT_FOUND',
  'E_MIG_CONFLICT',
  'E_MIG_BAD_REQUEST',
  'E_MIG_INTERNAL',
] as const

/** One of the spec's `E_MIG_*` codes. */
export type ErrorCode = (typeof ERROR_CODES)[number]

/** Default HTTP status per code (DESIGN.md section 3); codes not listed answer 500. */
const STATUS: Partial<Record<ErrorCode, number>> = {
  E_MIG_NOT_FOUND: 404,
  E_MIG_UPLOAD_NOT_FOUND: 404,
  E_MIG_VM_NOT_FOUND: 404,
  E_MIG_CONFLICT: 409,
  E_MIG_BAD_REQUEST: 400,
  E_MIG_INVALID_PLAN: 400,
  E_MIG_HOST_PATH_REJECTED: 403,
  E_MIG_UNSUPPORTED_FORMAT: 415,
  E_MIG_MALFORMED_ARCHIVE: 422,
  E_MIG_UPLOAD_REJECTED: 413,
  E_MIG_SOURCE_UNREACHABLE: 502,
  E_MIG_AUTH_FAILED: 502,
  E_MIG_PERSIST_FAILED: 503,
}

/** The HTTP status a code answers with when the thrower did not choose one (500 by default). */
export function httpStatusOf(code: ErrorCode): number {
  return STATUS[code] ?? 500
}

/** Structured, JSON-safe extra information of an error (field paths, file names, offsets). */
export type ErrorDetails = Record<string, unknown>

/**
 * The one error type of the migrator.
 *
 * - `code`: the `E_MIG_*` code.
 * - `message`: human text naming the file, field, disk or offset at fault; never a secret.
 * - `details`: optional JSON-safe data returned to the client.
 * - `status`: HTTP status; defaults to {@link httpStatusOf}(code). `E_MIG_UPLOAD_REJECTED` uses 413
 *   for the size cap and 422 for a sha256 mismatch, so the thrower passes it.
 */
export class MigError extends Error {
  readonly code: ErrorCode
  readonly details?: ErrorDetails
  readonly status: number

  constructor(code: ErrorCode, message: string, opts: { details?: ErrorDetails; status?: number; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause })
    this.name = 'MigError'
    this.code = code
    this.details = opts.details
    this.status = opts.status ?? httpStatusOf(code)
  }

  /** The error body of DESIGN.md section 3. */
  toBody(): { error: { code: ErrorCode; message: string; details?: ErrorDetails } } {
    return { error: { code: this.code, message: this.message, ...(this.details ? { details: this.details } : {}) } }
  }
}

/** True when `e` is a {@link MigError}, optionally with the given code. */
export function isMigError(e: unknown, code?: ErrorCode): e is MigError {
  return e instanceof MigError && (code === undefined || e.code === code)
}

/**
 * Wraps any thrown value as a MigError: a MigError passes through unchanged, anything else
 * becomes `code` with `context` prefixed to its message (e.g. the file or disk at fault).
 */
export function asMigError(e: unknown, code: ErrorCode, context: string): MigError {
  if (e instanceof MigError) return e
  const reason = e instanceof Error ? e.message : String(e)
  return new MigError(code, `${context}: ${reason}`, { cause: e })
}

/**
 * True when `e` or an error in its `cause` chain (at most 8 deep) has an errno-style `code` in
 * `codes` or a message `pattern` matches (a string cause counts as its message).
 */
export function causeMatches(e: unknown, codes: readonly string[], pattern: RegExp): boolean {
  for (let c: unknown = e, depth = 0; c && depth < 8; c = (c as { cause?: unknown }).cause, depth++) {
    const code = (c as { code?: unknown }).code
    if (typeof code === 'string' && codes.includes(code)) return true
    const message = c instanceof Error ? c.message : typeof c === 'string' ? c : ''
    if (pattern.test(message)) return true
  }
  return false
}
