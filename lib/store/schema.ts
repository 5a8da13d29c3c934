/**
 * The typed kysely schema of the migrator's SQLite store (spec 1.5 `migrator.db`).
 * Timestamps are ISO-8601 UTC strings; sizes are bytes; JSON columns hold serialized objects.
 */
import type { Generated } from 'kysely'

/** Registered live sources (spec 2.2). `secret` is the sealed password (AES-256-GCM, base64). */
export interface SourcesTable {
  id: string
  name: string
  kind: string
  endpoint: string
  username: string
  secret: string
  tls: string
  created_at: string
  updated_at: string
}

/** Multipart uploads (spec 2.4). `status`: `receiving` while streaming, then `ready`. */
export interface UploadsTable {
  id: string
  filename: string
  size_bytes: number
  sha256: string | null
  status: string
  created_at: string
  expires_at: string
}

/** Migration jobs (spec 2.3; fields of DESIGN.md section 3). JSON columns: plan, progress, last_error. */
export interface JobsTable {
  id: string
  plan: string
  state: string
  status: string
  strategy: string
  effective_mode: string
  progress: string
  last_error: string | null
  cancel_requested: number
  attempts: number
  lease_owner: string | null
  lease_expires_at: string | null
  created_at: string
  updated_at: string
  started_at: string | null
  finished_at: string | null
  /** JSON `RestorePointRecord` when the plan asked for a restore point (migration 0002). */
  restore_point: string | null
  /** Name of the libvirt domain the job defined (migration 0003). */
  domain: string | null
  /** JSON `CutoverStatus` of a warm live job (migration 0005). */
  cutover: string | null
  /** When the operator asked this job (or its bulk plan) to cut over (migration 0005). */
  cutover_requested_at: string | null
  /** JSON `SourceVmRecord` (migration 0005). */
  source_vm: string | null
  /** The bulk plan of the job, and the JSON list of job ids it waits for (migration 0005). */
  bulk_plan_id: string | null
  /** The job's key in its bulk plan (`vms[].key`). */
  bulk_key: string | null
  depends_on: string | null
  /** At most this many jobs of the same live source run at once (the bulk plan's `max_per_source`). */
  source_limit: number | null
  /** JSON `HardwareRecord`: the destination's disk bus, NIC model and boot evidence (migration 0006). */
  hardware: string | null
  /** JSON `{key, bytes}`: the space the job's pre-copy check reserved on file system or pool `key`. */
  space_reserved: string | null
  /** The identity (validator and size) of a remote input at the job's first attempt (lib/remote/). */
  input_identity: string | null
  /** JSON `TestBootRecord`: the latest test boot of the job (migration 0009). */
  test_boot: string | null
}

/** Bulk plans (roadmap v0.5): many jobs submitted together (migration 0005). */
export interface BulkPlansTable {
  id: string
  name: string | null
  max_per_source: number | null
  cutover_requested_at: string | null
  created_at: string
  updated_at: string
}

/** Job events kept for SSE replay; `seq` is the SSE event id. */
export interface JobEventsTable {
  seq: Generated<number>
  job_id: string
  event: string
  data: string
  created_at: string
}

/** Per-disk watermarks: bytes from the start of the disk durably written to the destination. */
export interface WatermarksTable {
  job_id: string
  disk_label: string
  watermark_bytes: number
  capacity_bytes: number
  updated_at: string
}

/**
 * Credentials of remote offline inputs (roadmap v0.3, `lib/remote/credentials.ts`): `kind`
 * `http_basic` (with `username`) or `http_bearer`; `secret` is the sealed password or token
 * (AES-256-GCM, base64, bound to the id).
 */
export interface RemoteCredentialsTable {
  id: string
  name: string
  kind: string
  username: string | null
  secret: string
  created_at: string
  updated_at: string
}

/**
 * The audit log (migration 0010, lib/store/audit.ts): one row per state-changing request.
 * `seq` orders the rows and is the paging cursor; `at` ISO-8601 UTC; `route` the router's path
 * template (`/migrations/:id/cancel`, or the request path when no route matched); `kind`
 * `<resource>.<action>` (`migration.cancel`); `status` the HTTP status answered, `error_code`
 * its `E_MIG_*` code when it was an error.
 */
export interface AuditLogTable {
  seq: Generated<number>
  at: string
  client_address: string | null
  user_agent: string | null
  request_id: string
  method: string
  route: string
  kind: string
  resource_id: string | null
  status: number
  error_code: string | null
}

/** The whole database, for `Kysely<Database>`. */
export interface Database {
  sources: SourcesTable
  remote_credentials: RemoteCredentialsTable
  uploads: UploadsTable
  jobs: JobsTable
  job_events: JobEventsTable
  watermarks: WatermarksTable
  bulk_plans: BulkPlansTable
  audit_log: AuditLogTable
}
