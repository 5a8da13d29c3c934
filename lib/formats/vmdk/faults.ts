/**
 * The faults of the VMDK parsers, one policy for every reader: a file whose structure is wrong
 * (a bad field, a truncated table, a hostile name or chain) is `E_MIG_MALFORMED_ARCHIVE`
 * ({@link malformed}); a well-formed file using a feature the project does not read is
 * `E_MIG_UNSUPPORTED_FORMAT` ({@link unsupported}). A caller whose context gives the fault
 * another meaning maps the code at its own boundary (the `vim_api` adapter reports a live
 * snapshot's bad files as `E_MIG_DISK_READ_FAILED`, `lib/adapters/vim/vmdk-chain.ts`).
 */
import { MigError } from '../../errors.ts'
export { malformed } from '../io.ts'

/** `MigError('E_MIG_UNSUPPORTED_FORMAT', '<file>: <reason>')`. */
export function unsupported(label: string, reason: string): MigError {
  return new MigError('E_MIG_UNSUPPORTED_FORMAT', `${label}: ${reason}`)
}
