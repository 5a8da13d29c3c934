import { describe, expect, test } from 'bun:test'
import { ERROR_CODES, MigError, httpStatusOf, asMigError } from '../../lib/errors.ts'

describe('error codes (spec 7)', () => {
  test('all 24 codes, exact spellings', () => {
    expect(ERROR_CODES.length).toBe(24)
    expect(new Set(ERROR_CODES).size).toBe(24)
    for (const c of ERROR_CODES) expect(c).toMatch(/^E_MIG_[A-Z0-9_]+$/)
    expect(ERROR_CODES).toContain('E_MIG_CBT_UNSUPPORTED')
    expect(ERROR_CODES).toContain('E_MIG_HOST_PATH_REJECTED')
  })

  test('HTTP statuses of DESIGN.md section 3', () => {
    const expected: Record<string, number> = {
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
      E_MIG_INTERNAL: 500,
      E_MIG_DISK_READ_FAILED: 500,
      E_MIG_CANCELLED: 500,
    }
    for (const [code, status] of Object.entries(expected)) expect(httpStatusOf(code as any)).toBe(status)
  })

  test('body shape and explicit status', () => {
    const e = new MigError('E_MIG_UPLOAD_REJECTED', 'sha256 mismatch', { status: 422, details: { a: 1 } })
    expect(e.status).toBe(422)
    expect(e.toBody()).toEqual({ error: { code: 'E_MIG_UPLOAD_REJECTED', message: 'sha256 mismatch', details: { a: 1 } } })
    expect(new MigError('E_MIG_NOT_FOUND', 'x').toBody()).toEqual({ error: { code: 'E_MIG_NOT_FOUND', message: 'x' } })
  })

  test('asMigError keeps MigErrors and wraps the rest with context', () => {
    const m = new MigError('E_MIG_CONFLICT', 'c')
    expect(asMigError(m, 'E_MIG_INTERNAL', 'ctx')).toBe(m)
    const w = asMigError(new Error('EIO'), 'E_MIG_DISK_READ_FAILED', 'disk0 at 4096')
    expect(w.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(w.message).toBe('disk0 at 4096: EIO')
  })
})
