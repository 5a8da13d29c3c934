/**
 * The live source adapter contract (spec 1.1: connect, list VMs, inspect, enable CBT, snapshot,
 * shutdown, mark, cleanup; DESIGN.md section 7). This file holds the control-plane part the
 * HTTP surface uses; the data-plane methods join it with the live adapters.
 */
import type { AdapterKind } from '../kinds.ts'
import type { VmManifest } from '../manifest.ts'
import type { SourceTls } from '../store/sources.ts'

/** What an adapter needs to reach a source. `password` is the opened (unsealed) secret. */
export interface SourceConnection {
  endpoint: string
  username: string
  password: string
  tls: SourceTls
}

/** One VM as listed by a source (`GET /sources/:id/vms`). Memory in bytes. */
export interface VmSummary {
  vm_id: string
  name: string
  power_state: 'on' | 'off' | 'suspended' | 'unknown'
  guest_id: string | null
  cpu_count: number | null
  memory_bytes: number | null
}

/** An open control-plane session. */
export interface AdapterSession {
  /** Probes the control plane; returns what it reports about itself (product, version). */
  describe(): Promise<{ product: string; version: string | null }>
  /** Lists VMs. `E_MIG_SOURCE_UNREACHABLE`, `E_MIG_AUTH_FAILED`. */
  listVms(): Promise<VmSummary[]>
  /** Inspects one VM into a manifest. `E_MIG_VM_NOT_FOUND` when the source has no such VM. */
  inspect(vmId: string): Promise<VmManifest>
  /** Ends the session (logout); never throws. */
  close(): Promise<void>
}

/**
 * A live source adapter of one kind.
 * - `supportsWarm()`: false makes the orchestrator downgrade warm plans (spec 1.4).
 * - `connect()`: validates the endpoint for the kind (`E_MIG_BAD_REQUEST`) and logs in;
 *   throws `E_MIG_SOURCE_UNREACHABLE` when nothing answers and `E_MIG_AUTH_FAILED` on a login
 *   the source rejects.
 */
export interface SourceAdapter {
  kind: AdapterKind
  supportsWarm(): boolean
  connect(conn: SourceConnection): Promise<AdapterSession>
}
