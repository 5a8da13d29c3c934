/**
 * The list of handler modules the router is built from: one file per endpoint of spec 4.
 * Order matters where paths overlap: `/migrations/stream` precedes `/migrations/:id`.
 */
import type { HandlerModule } from './router.ts'
import * as sourcesList from '../handlers/sources/list.ts'
import * as sourcesCreate from '../handlers/sources/create.ts'
import * as sourcesGet from '../handlers/sources/get.ts'
import * as sourcesDelete from '../handlers/sources/delete.ts'
import * as sourcesTest from '../handlers/sources/test.ts'
import * as sourceVmsList from '../handlers/sources/vms/list.ts'
import * as sourceVmsGet from '../handlers/sources/vms/get.ts'
import * as migrationsList from '../handlers/migrations/list.ts'
import * as migrationsCreate from '../handlers/migrations/create.ts'
import * as migrationsStream from '../handlers/migrations/stream.ts'
import * as migrationsGet from '../handlers/migrations/get.ts'
import * as migrationsCancel from '../handlers/migrations/cancel.ts'
import * as migrationsSerialLog from '../handlers/migrations/serial-log.ts'
import * as migrationsCutover from '../handlers/migrations/cutover.ts'
import * as migrationsTestBoot from '../handlers/migrations/test-boot.ts'
import * as plansCreate from '../handlers/plans/create.ts'
import * as plansList from '../handlers/plans/list.ts'
import * as plansGet from '../handlers/plans/get.ts'
import * as plansCutover from '../handlers/plans/cutover.ts'
import * as uploadsList from '../handlers/uploads/list.ts'
import * as uploadsCreate from '../handlers/uploads/create.ts'
import * as uploadsGet from '../handlers/uploads/get.ts'
import * as uploadsDelete from '../handlers/uploads/delete.ts'
import * as uploadsInspect from '../handlers/uploads/inspect.ts'
import * as hostFilesBrowse from '../handlers/host-files/browse.ts'
import * as hostFilesInspect from '../handlers/host-files/inspect.ts'
import * as remoteFilesInspect from '../handlers/remote-files/inspect.ts'
import * as remoteCredentialsCreate from '../handlers/remote-credentials/create.ts'
import * as remoteCredentialsList from '../handlers/remote-credentials/list.ts'
import * as remoteCredentialsDelete from '../handlers/remote-credentials/delete.ts'
import * as doctorGet from '../handlers/doctor/get.ts'
import * as openapiGet from '../handlers/openapi/get.ts'
import * as metricsGet from '../handlers/metrics/get.ts'
import * as auditList from '../handlers/audit/list.ts'
import * as uiStatic from '../handlers/ui/static.ts'

/** Every endpoint of spec section 4, `GET /doctor` (the pre-flight checks), the serial-log tail and the web console. */
export const HANDLERS: readonly HandlerModule[] = [
  sourcesList,
  sourcesCreate,
  sourcesGet,
  sourcesDelete,
  sourcesTest,
  sourceVmsList,
  sourceVmsGet,
  migrationsList,
  migrationsCreate,
  migrationsStream,
  migrationsGet,
  migrationsCancel,
  migrationsSerialLog,
  migrationsCutover,
  migrationsTestBoot,
  plansCreate,
  plansList,
  plansGet,
  plansCutover,
  uploadsList,
  uploadsCreate,
  uploadsGet,
  uploadsDelete,
  uploadsInspect,
  hostFilesBrowse,
  hostFilesInspect,
  // remote offline inputs (roadmap v0.3, docs/remote-sources.md)
  remoteFilesInspect,
  remoteCredentialsCreate,
  remoteCredentialsList,
  remoteCredentialsDelete,
  doctorGet,
  // the metrics for Prometheus (not in spec 4; docs/operations.md)
  metricsGet,
  // the audit log of state-changing requests (not in spec 4; docs/operations.md)
  auditList,
  // the OpenAPI 3.1 description of this API (not in spec 4)
  openapiGet,
  // the web console (not in spec 4): GET /ui/* serves ui/dist
  uiStatic,
] as HandlerModule[]
