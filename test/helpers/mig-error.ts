/** The MigError a rejected promise carries, for tests that check codes and messages. */
import { expect } from 'bun:test'
import { MigError } from '../../lib/errors.ts'
import { thrown } from './tmp.ts'

/** The MigError `p` rejects with (the test fails when it resolves, or rejects with anything else). */
export async function migErrorOf(p: Promise<unknown>): Promise<MigError> {
  const e = await thrown(() => p)
  expect(e).toBeInstanceOf(MigError)
  return e as MigError
}

/** What `fn` throws when called, undefined when it returns (a synchronous parser's error, say). */
export function caught(fn: () => unknown): unknown {
  try {
    fn()
  } catch (e) {
    return e
  }
  return undefined
}

/** Checks that `err` (a value thrown) is a MigError whose code is `code`. */
export function expectMig(err: unknown, code: MigError['code']): void {
  expect(err).toBeInstanceOf(MigError)
  expect((err as MigError).code).toBe(code)
}

/** Runs `fn`, checks that it throws a MigError whose code is `code` and whose message holds each of `fragments`; returns the error. */
export async function expectMigThrown(fn: () => unknown, code: MigError['code'], ...fragments: string[]): Promise<MigError> {
  const err = await thrown(fn)
  expectMig(err, code)
  for (const f of fragments) expect(err.message).toContain(f)
  return err
}
