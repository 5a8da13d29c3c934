/**
 * The migration plan (spec 2.1; optional fields of DESIGN.md section 3), validated with zod.
 * Unknown fields are rejected everywhere. Types come from `z.infer`.
 */
import { z } from 'zod'
import { ADAPTER_KINDS, IMPORTER_KINDS, PASSTHROUGH_IMPORTERS, type ImporterKind } from './kinds.ts'
import { MigError } from './errors.ts'
import { OfflineUrlRef, REMOTE_IMPORTERS, REMOTE_FOLDER_DESCRIPTORS } from './remote/ref.ts'

const uuid = z.string().regex(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i, 'must be a UUID')

/** `source`: externally tagged, exactly one of `{"Live": <adapter kind>}` or `{"Offline": <importer kind>}`. */
export const PlanSource = z.union([z.strictObject({ Live: z.enum(ADAPTER_KINDS) }), z.strictObject({ Offline: z.enum(IMPORTER_KINDS) })])

/** `source_ref`, discriminated by `kind` (`offline_url`: a remote input, `lib/remote/ref.ts`). */
export const SourceRef = z.discriminatedUnion('kind', [
  z.strictObject({ kind: z.literal('live_vm'), source_id: uuid, vm_id: z.string().min(1).max(256) }),
  z.strictObject({ kind: z.literal('offline_host_path'), path: z.string().min(1).max(4096) }),
  z.strictObject({ kind: z.literal('upload'), upload_id: uuid }),
  OfflineUrlRef,
])

/**
 * `cutover` of a warm live plan (roadmap v0.6): `{mode: "auto"}` (the default) cuts over as soon
 * as a delta pass converges; `{mode: "manual"}` keeps the copy warm until
 * `POST /migrations/:id/cutover`; `{at: <RFC 3339 time with offset>}` until that time (or an
 * earlier command). `require_test_boot: true` holds a manual or scheduled cutover until the job's
 * latest test boot passed (docs/test-boot.md).
 */
export const CutoverPlan = z.union([
  z.strictObject({ mode: z.enum(['auto', 'manual']), require_test_boot: z.boolean().optional() }),
  z.strictObject({ at: z.iso.datetime({ offset: true }), require_test_boot: z.boolean().optional() }),
])
export type CutoverPlan = z.infer<typeof CutoverPlan>

/** How a plan's cutover is triggered: `auto` (convergence), `manual` (command), `scheduled` (`at`, or a command). */
export function cutoverModeOf(plan: { cutover?: CutoverPlan }): 'auto' | 'manual' | 'scheduled' {
  const c = plan.cutover
  if (!c) return 'auto'
  return 'at' in c ? 'scheduled' : c.mode
}

const name = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, 'must be 1-63 characters of [A-Za-z0-9._-], starting with a letter or digit')
const bridge = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,14}$/, 'must be a Linux interface name')

/** ZFS pool names that `zpool create` refuses (zpool(8)): vdev type words. */
const ZFS_RESERVED_POOLS = new Set(['mirror', 'raidz', 'raidz1', 'raidz2', 'raidz3', 'draid', 'spare', 'log', 'cache', 'special', 'dedup'])

/**
 * A ZFS dataset name (zfs(8) "ZFS File System Hierarchy", zpool(8) naming):
 * components separated by `/`, none empty, `.` or `..`; each of `[A-Za-z0-9_.:-]`; the pool
 * (first component) starts with a letter, is not a vdev word (`mirror`, `raidz`, `spare`, `log`
 * ...) and not `c<digit>...`; at most 255 bytes; no `@` or `#` (snapshots, bookmarks).
 */
export const zfsDatasetName = z
  .string()
  .max(255)
  .superRefine((s, c) => {
    const parts = s.split('/')
    const why = parts.some((p) => p === '' || p === '.' || p === '..')
      ? 'empty, "." or ".." component'
      : parts.some((p) => !/^[A-Za-z0-9_.:-]+$/.test(p))
        ? 'components may hold only letters, digits and _ . : -'
        : !/^[A-Za-z]/.test(parts[0]!)
          ? 'the pool name must start with a letter'
          : ZFS_RESERVED_POOLS.has(parts[0]!) || /^c[0-9]/.test(parts[0]!)
            ? `"${parts[0]}" is a reserved pool name`
            : null
    if (why) c.addIssue({ code: 'custom', message: `must be a ZFS dataset name: ${why}` })
  })

const port = z.number().int().min(1).max(65535)

/**
 * One service check of `plan.checks` (docs/boot-check.md "Services that answer";
 * lib/domain/service-checks.ts): `name` (unique), exactly one of `tcp: {port}` and
 * `http: {port?, path?, scheme?, expect_status?}` (path: an absolute path and query, no blanks or
 * control characters), `on_failure`: `fail` (default) or `notice`.
 */
export const ServiceCheckPlan = z
  .strictObject({
    name,
    tcp: z.strictObject({ port }).optional(),
    http: z
      .strictObject({
        port: port.optional(),
        path: z
          .string()
          .max(2048)
          .regex(/^\/[\x21-\x7e]*$/, 'must be an absolute path (and query) of printable characters without blanks')
          .optional(),
        scheme: z.enum(['http', 'https']).optional(),
        expect_status: z.number().int().min(100).max(599).optional(),
      })
      .optional(),
    on_failure: z.enum(['fail', 'notice']).optional(),
  })
  .superRefine((c, ctx) => {
    if (!!c.tcp === !!c.http) ctx.addIssue({ code: 'custom', path: [], message: 'a check has exactly one of "tcp" and "http"' })
  })
export type ServiceCheckPlan = z.infer<typeof ServiceCheckPlan>

/** The live adapters whose VM a live import can read (from a snapshot, at any offset). */
export const LIVE_IMPORT_ADAPTERS = ['vim_api'] as const

/**
 * Why a plan cannot run as a live import (`live_import: true`, docs/live-import.md): the guest
 * must be started (`start` not false), the source read at any offset by the project's readers (an
 * offline importer other than the virt-v2v passthrough, or the `vim_api` adapter's snapshot
 * readers: {@link LIVE_IMPORT_ADAPTERS}), cold. Empty when the plan does not ask for one or can
 * run as one.
 */
export function liveImportRefusals(p: {
  live_import?: boolean
  start?: boolean
  mode: 'Warm' | 'Cold'
  source: { Live: string } | { Offline: string }
}): string[] {
  if (!p.live_import) return []
  const out: string[] = []
  if (p.start === false) out.push('a live import runs the guest while its disks copy: it cannot be combined with "start": false')
  if (p.mode === 'Warm') out.push('a warm migration keeps the source running until its cutover: a live import is cold ("mode": "Cold")')
  if ('Live' in p.source) {
    if (!(LIVE_IMPORT_ADAPTERS as readonly string[]).includes(p.source.Live))
      out.push(
        `a live import reads an offline source (host path, upload or offline_url) or a ${LIVE_IMPORT_ADAPTERS.join(', ')} VM; the ${p.source.Live} adapter's disks are not served to a running guest`,
      )
  } else if (PASSTHROUGH_IMPORTERS.includes(p.source.Offline as ImporterKind))
    out.push(`a ${p.source.Offline} import is copied and converted by virt-v2v as a whole: no reader can serve its disks to a running guest`)
  return out
}

/** The whole plan. */
export const Plan = z
  .strictObject({
    source: PlanSource,
    source_ref: SourceRef,
    mode: z.enum(['Warm', 'Cold']),
    name: name.optional(),
    destination: z.strictObject({ pool: zfsDatasetName }).optional(),
    guest_os: z.enum(['windows', 'linux', 'other']).optional(),
    networks: z
      .array(z.strictObject({ source: z.string().min(1).max(256), bridge }))
      .max(64)
      .optional(),
    firmware: z.enum(['bios', 'efi']).optional(),
    start: z.boolean().optional(),
    live_import: z.boolean().optional(),
    restore_point: z.strictObject({ backup_job_id: uuid, require_quiesced: z.boolean().optional() }).optional(),
    cutover: CutoverPlan.optional(),
    precopy_interval_seconds: z.number().int().min(1).max(86_400).optional(),
    checks: z
      .array(ServiceCheckPlan)
      .max(32)
      .describe(
        'Service checks run from this host after the boot against the guest\'s address (docs/boot-check.md "Services that answer"); results in the job\'s hardware.checks. A test boot runs them too, from its isolated network (docs/test-boot.md); with "start": false only a test boot runs them',
      )
      .optional(),
  })
  .superRefine((p, ctx) => {
    const live = 'Live' in p.source
    if (live && p.source_ref.kind !== 'live_vm') {
      ctx.addIssue({ code: 'custom', path: ['source_ref', 'kind'], message: 'a Live source needs source_ref.kind "live_vm"' })
    }
    if (!live && p.source_ref.kind === 'live_vm') {
      ctx.addIssue({
        code: 'custom',
        path: ['source_ref', 'kind'],
        message: 'an Offline source needs source_ref.kind "offline_host_path", "upload" or "offline_url"',
      })
    }
    if (p.source_ref.kind === 'offline_url' && p.source_ref.s3 && !p.source_ref.url.startsWith('s3:')) {
      ctx.addIssue({ code: 'custom', path: ['source_ref', 's3'], message: 's3 settings need an s3:// url' })
    }
    if (p.source_ref.kind === 'offline_url' && p.source_ref.tls && p.source_ref.url.startsWith('smb:')) {
      ctx.addIssue({ code: 'custom', path: ['source_ref', 'tls'], message: 'an smb:// input has no TLS (SMB 2 without encryption); leave tls out' })
    }
    if ('Offline' in p.source && p.source_ref.kind === 'offline_url' && !REMOTE_IMPORTERS.includes(p.source.Offline)) {
      ctx.addIssue({
        code: 'custom',
        path: ['source', 'Offline'],
        message: `a remote input (offline_url) is one of ${REMOTE_IMPORTERS.join(', ')}; a ${p.source.Offline} export must be in the import root`,
      })
    }
    if ('Offline' in p.source && p.source_ref.kind === 'offline_url') {
      const ext = REMOTE_FOLDER_DESCRIPTORS[p.source.Offline]
      if (ext && !p.source_ref.url.toLowerCase().endsWith(ext))
        ctx.addIssue({
          code: 'custom',
          path: ['source_ref', 'url'],
          message: `a remote ${p.source.Offline} is named by the URL of its ${ext} descriptor (its companions are read beside it)`,
        })
    }
    if (p.cutover && !('mode' in p.cutover && p.cutover.mode === 'auto') && !(live && p.mode === 'Warm')) {
      ctx.addIssue({ code: 'custom', path: ['cutover'], message: 'a cutover on command or at a time needs a Live source with mode "Warm"' })
    }
    const seen = new Set<string>()
    for (const [i, c] of (p.checks ?? []).entries()) {
      if (seen.has(c.name)) ctx.addIssue({ code: 'custom', path: ['checks', i, 'name'], message: `the check name "${c.name}" is used twice` })
      seen.add(c.name)
    }

    for (const why of liveImportRefusals(p)) ctx.addIssue({ code: 'custom', path: ['live_import'], message: why })
    if (p.cutover?.require_test_boot && 'mode' in p.cutover && p.cutover.mode === 'auto') {
      ctx.addIssue({
        code: 'custom',
        path: ['cutover', 'require_test_boot'],
        message: 'an automatic cutover does not wait for a test boot: use {"mode": "manual"} or {"at": ...}',
      })
    }
  })
export type Plan = z.infer<typeof Plan>

/** The body of `POST /migrations`: `{"plan": {...}}`. */
export const SubmitPlanBody = z.strictObject({ plan: Plan })

/** One failing field of a rejected plan: `path` like `plan.source_ref.path`. */
export interface PlanIssue {
  path: string
  message: string
}

/** zod issues as `{path, message}` with dotted paths. */
export function issuesOf(error: z.ZodError, prefix: string[] = []): PlanIssue[] {
  return error.issues.map((i) => ({ path: [...prefix, ...i.path.map(String)].join('.') || '(body)', message: i.message }))
}

/**
 * Validates a `POST /migrations` body. Throws `E_MIG_INVALID_PLAN` with `details.issues`
 * listing every failing field path (`plan.mode`, `plan.source_ref.path`, ...).
 */
export function parseSubmitBody(body: unknown): Plan {
  const r = SubmitPlanBody.safeParse(body)
  if (!r.success) {
    const issues = issuesOf(r.error)
    throw new MigError('E_MIG_INVALID_PLAN', `invalid plan: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`, { details: { issues } })
  }
  return r.data.plan
}

/** How the job runs: a live adapter (`live`), a `read_disk` loop (`offline`), or `run_full_import` (`passthrough`). */
export type Strategy = 'live' | 'offline' | 'passthrough'

/** The strategy of spec 1.2 for a plan: live adapter, passthrough importer, or `read_disk` loop. */
export function strategyOf(plan: Plan): Strategy {
  if ('Live' in plan.source) return 'live'
  return PASSTHROUGH_IMPORTERS.includes(plan.source.Offline as ImporterKind) ? 'passthrough' : 'offline'
}
