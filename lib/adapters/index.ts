/**
 * The adapter registry: the adapter for each live kind of spec 1.1.
 *
 * In this build no control plane is reachable through any kind: every kind's `connect` fails
 * with `E_MIG_SOURCE_UNREACHABLE` ("control plane not responding", spec 7), which is what the
 * HTTP surface reports for `POST /sources/:id/test` and the VM endpoints. The native `vim_api`
 * SOAP adapter and the five validating stubs replace these entries (issue "Live sources").
 */
import { MigError } from '../errors.ts'
import type { AdapterKind } from '../kinds.ts'
import type { SourceAdapter } from './types.ts'

function unavailable(kind: AdapterKind): SourceAdapter {
  return {
    kind,
    supportsWarm: () => false,
    async connect(conn) {
      throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${kind}: no control-plane client for ${conn.endpoint} in this build`, { details: { kind, endpoint: conn.endpoint } })
    },
  }
}

/** The adapter of `kind`. */
export function adapterFor(kind: AdapterKind): SourceAdapter {
  return unavailable(kind)
}
