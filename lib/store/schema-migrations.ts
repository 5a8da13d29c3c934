/**
 * Schema migrations of the store, applied in order at open (kysely `Migrator`).
 * Never edit a shipped migration: add a new one.
 */
import { sql, type Kysely, type Migration, type MigrationProvider } from 'kysely'

const migrations: Record<string, Migration> = {
  '0001_initial': {
    async up(db: Kysely<any>) {
      await db.schema
        .createTable('sources')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('name', 'text', (c) => c.notNull().unique())
        .addColumn('kind', 'text', (c) => c.notNull())
        .addColumn('endpoint', 'text', (c) => c.notNull())
        .addColumn('username', 'text', (c) => c.notNull())
        .addColumn('secret', 'text', (c) => c.notNull())
        .addColumn('tls', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('updated_at', 'text', (c) => c.notNull())
        .execute()
      await db.schema
        .createTable('uploads')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('filename', 'text', (c) => c.notNull())
        .addColumn('size_bytes', 'integer', (c) => c.notNull())
        .addColumn('sha256', 'text')
        .addColumn('status', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('expires_at', 'text', (c) => c.notNull())
        .execute()
      await db.schema
        .createTable('jobs')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('plan', 'text', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull())
        .addColumn('status', 'text', (c) => c.notNull())
        .addColumn('strategy', 'text', (c) => c.notNull())
        .addColumn('effective_mode', 'text', (c) => c.notNull())
        .addColumn('progress', 'text', (c) => c.notNull())
        .addColumn('last_error', 'text')
        .addColumn('cancel_requested', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('lease_owner', 'text')
        .addColumn('lease_expires_at', 'text')
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('updated_at', 'text', (c) => c.notNull())
        .addColumn('started_at', 'text')
        .addColumn('finished_at', 'text')
        .execute()
      await db.schema.createIndex('jobs_status').on('jobs').columns(['status', 'created_at']).execute()
      await db.schema
        .createTable('job_events')
        .addColumn('seq', 'integer', (c) => c.primaryKey().autoIncrement())
        .addColumn('job_id', 'text', (c) => c.notNull())
        .addColumn('event', 'text', (c) => c.notNull())
        .addColumn('data', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .execute()
      await db.schema.createIndex('job_events_job').on('job_events').columns(['job_id', 'seq']).execute()
      await db.schema
        .createTable('watermarks')
        .addColumn('job_id', 'text', (c) => c.notNull())
        .addColumn('disk_label', 'text', (c) => c.notNull())
        .addColumn('watermark_bytes', 'integer', (c) => c.notNull())
        .addColumn('capacity_bytes', 'integer', (c) => c.notNull())
        .addColumn('updated_at', 'text', (c) => c.notNull())
        .addPrimaryKeyConstraint('watermarks_pk', ['job_id', 'disk_label'])
        .execute()
      await sql`select 1`.execute(db)
    },
  },
  '0002_job_restore_point': {
    async up(db: Kysely<any>) {
      await db.schema.alterTable('jobs').addColumn('restore_point', 'text').execute()
    },
  },
  '0003_job_domain': {
    async up(db: Kysely<any>) {
      await db.schema.alterTable('jobs').addColumn('domain', 'text').execute()
    },
  },
  '0004_job_domain_reservation': {
    async up(db: Kysely<any>) {
      // A domain name is held by at most one job that has not ended.
      await sql`create unique index jobs_active_domain on jobs(domain) where domain is not null and status not in ('completed', 'failed', 'cancelled')`.execute(
        db,
      )
    },
  },
  '0005_warm_cutover_and_bulk_plans': {
    async up(db: Kysely<any>) {
      // warm cutover (roadmap v0.6): the pass record and the command; the source VM's power
      for (const col of ['cutover', 'cutover_requested_at', 'source_vm', 'bulk_plan_id', 'bulk_key', 'depends_on']) {
        await db.schema.alterTable('jobs').addColumn(col, 'text').execute()
      }
      await db.schema.alterTable('jobs').addColumn('source_limit', 'integer').execute()
      await db.schema.createIndex('jobs_bulk_plan').on('jobs').columns(['bulk_plan_id']).execute()
      // bulk plans (roadmap v0.5)
      await db.schema
        .createTable('bulk_plans')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('name', 'text')
        .addColumn('max_per_source', 'integer')
        .addColumn('cutover_requested_at', 'text')
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('updated_at', 'text', (c) => c.notNull())
        .execute()
    },
  },
  '0006_job_hardware': {
    async up(db: Kysely<any>) {
      await db.schema.alterTable('jobs').addColumn('hardware', 'text').execute()
    },
  },
  '0007_space_reservation': {
    async up(db: Kysely<any>) {
      // what a job's pre-copy check counted for its disks (lib/host/precopy.ts): {key, bytes}
      await db.schema.alterTable('jobs').addColumn('space_reserved', 'text').execute()
    },
  },
  '0008_remote_inputs': {
    async up(db: Kysely<any>) {
      // credentials of remote offline inputs (roadmap v0.3); `secret` sealed like a source's password
      await db.schema
        .createTable('remote_credentials')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('name', 'text', (c) => c.notNull().unique())
        .addColumn('kind', 'text', (c) => c.notNull())
        .addColumn('username', 'text')
        .addColumn('secret', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('updated_at', 'text', (c) => c.notNull())
        .execute()
      // a retried job resumes only on the version of the remote object its first attempt read
      await db.schema.alterTable('jobs').addColumn('input_identity', 'text').execute()
    },
  },
  '0009_job_test_boot': {
    async up(db: Kysely<any>) {
      // JSON TestBootRecord: the latest test boot of the job (lib/domain/test-boot.ts)
      await db.schema.alterTable('jobs').addColumn('test_boot', 'text').execute()
    },
  },
  '0010_audit_log': {
    async up(db: Kysely<any>) {
      // the audit log of state-changing requests (lib/store/audit.ts); never bodies nor credentials
      await db.schema
        .createTable('audit_log')
        .addColumn('seq', 'integer', (c) => c.primaryKey().autoIncrement())
        .addColumn('at', 'text', (c) => c.notNull())
        .addColumn('client_address', 'text')
        .addColumn('user_agent', 'text')
        .addColumn('request_id', 'text', (c) => c.notNull())
        .addColumn('method', 'text', (c) => c.notNull())
        .addColumn('route', 'text', (c) => c.notNull())
        .addColumn('kind', 'text', (c) => c.notNull())
        .addColumn('resource_id', 'text')
        .addColumn('status', 'integer', (c) => c.notNull())
        .addColumn('error_code', 'text')
        .execute()
      await db.schema.createIndex('audit_log_at').on('audit_log').columns(['at']).execute()
    },
  },
}

/** The in-code migration list for kysely's `Migrator`. */
export const migrationProvider: MigrationProvider = {
  async getMigrations() {
    return migrations
  },
}
