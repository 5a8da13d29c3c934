/**
 * Logs in to the control plane of a registered source: loads it, opens its sealed password
 * (bound to the source id) and connects through the adapter of its kind.
 */
import type { Sealer } from '../crypto/seal.ts'
import type { AdapterKind } from '../kinds.ts'
import type { SourcesRepo } from '../store/sources.ts'
import { adapterFor } from './index.ts'
import { isLiveSession, type AdapterSession } from './types.ts'

/**
 * Connects to source `id` (`opts` are passed to the adapter's `connect`). Throws `E_MIG_NOT_FOUND` (no such source), and whatever the adapter's
 * `connect` throws (`E_MIG_SOURCE_UNREACHABLE`, `E_MIG_AUTH_FAILED`, `E_MIG_BAD_REQUEST`).
 */
export async function openSourceSession(
  sources: SourcesRepo,
  sealer: Sealer,
  id: string,
  opts: { guestShutdownTimeoutMs?: number } = {},
): Promise<AdapterSession> {
  const source = await sources.get(id)
  const password = sealer.open(await sources.getSealedSecret(id), id)
  return adapterFor(source.kind as AdapterKind).connect({ endpoint: source.endpoint, username: source.username, password, tls: source.tls_config, ...opts })
}

/** Runs `fn` on a logged-in connection to source `id` and always closes it (logout). */
export async function withSourceSession<T>(sources: SourcesRepo, sealer: Sealer, id: string, fn: (s: AdapterSession) => Promise<T>): Promise<T> {
  const conn = await openSourceSession(sources, sealer, id)
  try {
    return await fn(conn)
  } finally {
    await conn.close()
  }
}

/**
 * Removes every snapshot the migrator made on VM `vmId` of source `sourceId` (the connection's
 * `cleanup`), for a job that ended without its worker doing it (the worker died on the last
 * attempt); with `opts.powerOn`, then powers the VM on again (the job had shut it down).
 * Throws what {@link openSourceSession} throws, and `E_MIG_INTERNAL` when the power-on fails;
 * `cleanup` itself never does.
 */
export async function releaseLiveVm(sources: SourcesRepo, sealer: Sealer, sourceId: string, vmId: string, opts: { powerOn?: boolean } = {}): Promise<void> {
  await withSourceSession(sources, sealer, sourceId, async (s) => {
    if (!isLiveSession(s)) return
    await s.cleanup(vmId)
    if (opts.powerOn) await s.powerOn(vmId)
  })
}
