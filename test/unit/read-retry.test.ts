import { describe, expect, test } from 'bun:test'
import { MigError } from '../../lib/errors.ts'
import { isSourceIoError, ReadRetryWindow } from '../../lib/pipeline/read-retry.ts'
import { migErrorOf } from '../helpers/mig-error.ts'

const eio = () => new MigError('E_MIG_DISK_READ_FAILED', 'd (d.qcow2): read of 4096 bytes at offset 8192 failed: EIO: i/o error, read')

describe('source I/O errors', () => {
  test('only a read failure with EIO is waited out', () => {
    expect(isSourceIoError(eio())).toBe(true)
    const errno = Object.assign(new Error('read failed'), { code: 'EIO' })
    expect(isSourceIoError(new MigError('E_MIG_DISK_READ_FAILED', 'read failed', { cause: errno }))).toBe(true)
    expect(isSourceIoError(new MigError('E_MIG_DISK_READ_FAILED', 'the source changed while it was read'))).toBe(false)
    expect(isSourceIoError(new MigError('E_MIG_DISK_WRITE_FAILED', 'EIO: i/o error, write'))).toBe(false)
    expect(isSourceIoError(new Error('EIO'))).toBe(false)
  })

  test('a notice at every try, then E_MIG_DISK_READ_FAILED once the window has passed; abort is E_MIG_CANCELLED', async () => {
    const w = new ReadRetryWindow({ seconds: 0.3, pollMs: 100 })
    const notes: string[] = []
    const ac = new AbortController()
    const t0 = Date.now()
    for (let i = 0; i < 3; i++) await w.wait(eio(), ac.signal, async (m) => void notes.push(m))
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290)
    expect(notes.length).toBe(3)
    expect(notes[2]).toMatch(
      /^the source returns I\/O errors \(d \(d\.qcow2\): read of 4096 bytes at offset 8192 failed: EIO: i\/o error, read\); trying again .* \(try 3, MIGRATOR_READ_RETRY_SECONDS=0\.3\)/,
    )
    const err = await migErrorOf(w.wait(eio(), ac.signal, async () => {}))
    expect(err.code).toBe('E_MIG_DISK_READ_FAILED')
    expect(err.message).toEndWith('; the source still returned I/O errors after 0.3 s of tries; mend its storage and submit the migration again')
    ac.abort()
    expect((await migErrorOf(new ReadRetryWindow({ seconds: 10, pollMs: 100 }).wait(eio(), ac.signal, async () => {}))).code).toBe('E_MIG_CANCELLED')
  })

  test('failures more than three pauses apart start a new window', async () => {
    const w = new ReadRetryWindow({ seconds: 0.2, pollMs: 10 })
    const ac = new AbortController()
    await w.wait(eio(), ac.signal, async () => {})
    await Bun.sleep(1100) // the source read in between
    const notes: string[] = []
    await w.wait(eio(), ac.signal, async (m) => void notes.push(m))
    expect(notes[0]).toContain('(try 1,')
  })
})
