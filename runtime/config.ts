/**
 * Configuration from environment variables with the embedded defaults of DESIGN.md section 2,
 * parsed with zod. All sizes are bytes, all durations seconds unless the name says otherwise.
 *
 * One place per variable: {@link VARIABLES} has one entry per `MIGRATOR_*` variable (its zod
 * schema, which carries its default, and its docstring); {@link loadConfig} maps the parsed
 * values onto {@link Config}. To add a variable: add its entry to `VARIABLES`, its field to
 * `Config`, and the line that sets the field in `loadConfig`.
 *
 * The server resolves the configuration once (`loadConfig()` in serve-bun/serve-node, or the
 * host daemon's own object given to `createApp(config)`); job workers receive that resolved
 * object from the supervisor over IPC and never read the environment again.
 */
import { existsSync } from 'node:fs'
import { cpus } from 'node:os'
import * as path from 'node:path'
import { z } from 'zod'

/** The migrator's configuration (plain JSON data: it is sent as is to the job workers). */
export interface Config {
  /** Data directory holding `imports/`, `keyring/`, `migrator.db/`, `volumes/`, `logs/` (see {@link defaultDataDir}). */
  dataDir: string
  /**
   * The TCP listener (`MIGRATOR_LISTEN`), off (null) by default. Every request on it needs a
   * credential: the API token, the Basic credentials or a console session (runtime/auth.ts).
   */
  listen: { host: string; port: number } | null
  /**
   * The unix socket (`MIGRATOR_SOCKET`, default `/run/<appliance>/api.sock`; null: none), owner
   * root, mode 0660, group `group` (`MIGRATOR_SOCKET_GROUP`, default `root`). Its file mode is
   * its credential: who can connect is served without a token (runtime/socket.ts).
   */
  socket: { path: string; group: string } | null
  /** Mount point of the API (default `/api/v1/migrator`). */
  basePath: string
  /** Product path segment (`<appliance>` of spec 1.3/1.5; default `migrator`). */
  appliance: string
  /** Import root (default `<dataDir>/imports`). */
  importRoot: string
  /** Destination sink: `file` (default) or `zvol`. */
  sink: 'file' | 'zvol'
  /** ZFS pool for the zvol sink. */
  zfsPool: string
  /** libvirt connection URI (default `qemu:///system`). */
  libvirtUri: string
  /** Seconds a libvirt call waits for libvirtd to come back (a restart) before it fails (default 60). */
  libvirtReconnectSeconds: number
  /** Concurrent jobs (default 2). */
  maxJobs: number
  /** Inspects: running at once in worker threads (default: CPUs - 1, 1 to 4, so one core stays with the API), waiting (default 8; more answer 503 with `Retry-After`). */
  inspect: { concurrency: number; queue: number }
  /** Upload size cap in bytes (spec 8: 20 GiB). */
  uploadCapBytes: number
  /** Seconds an upload is kept before the sweeper removes it (default 7 days). */
  uploadTtlSeconds: number
  /** Seconds between sweeper runs (default 60). */
  sweepIntervalSeconds: number
  /** Seconds between SSE heartbeat comments (default 15). */
  sseHeartbeatSeconds: number
  /** Number of job events kept for SSE `Last-Event-ID` replay (default 10000). */
  eventReplayWindow: number
  /** Days audit log entries are kept before they are pruned (default 90). */
  auditRetentionDays: number
  /** Optional Basic-auth guard `user:password`, required when listening on a non-loopback address. */
  basicAuth: string | null
  /**
   * Host names the server answers to besides the loopback names and the `listen` address
   * (`MIGRATOR_ALLOWED_HOSTS`), as the WHATWG URL parser writes them: lower case, IPv4 dotted,
   * IPv6 in brackets. Any port. See runtime/request-guard.ts.
   */
  allowedHosts: string[]
  /**
   * Origins (`scheme://host[:port]`, as `URL.origin` writes them) whose pages may call the API
   * besides the migrator's own (`MIGRATOR_ALLOWED_ORIGINS`). See runtime/request-guard.ts.
   */
  allowedOrigins: string[]
  /** Log level for pino (default `info`; `silent` in tests). */
  logLevel: string
  /** Job supervision: lease (s), heartbeat timeout (s), worker attempts per job. */
  supervisor: { leaseSeconds: number; heartbeatTimeoutSeconds: number; maxAttempts: number }
  /** Warm delta loop: converged below this many bytes per pass, at most this many passes. */
  delta: { convergeBelowBytes: number; maxPasses: number }
  /** Warm jobs that wait for their cutover: seconds between delta passes when the plan has no `precopy_interval_seconds` (default 300). */
  precopyIntervalSeconds: number
  /** At most this many jobs of one live source run at once (0: no limit besides `maxJobs`). */
  maxJobsPerSource: number
  /** Live sources: how long a guest shutdown may take before the VM is powered off (s, default 300). */
  guestShutdownTimeoutSeconds: number
  /**
   * The copy loop: durable checkpoint (fsync + watermark) every `flushEveryBytes` (default 256
   * MiB); bandwidth cap on source reads in bytes/s (0: none); how long an offline copy waits for
   * space on a file system that filled up, seconds (default 600; 0: fails at once);
   * `readRetrySeconds`: how long it tries again a source that returns I/O errors (default 300; 0: fails at once).
   */
  copy: { flushEveryBytes: number; maxBytesPerSecond: number; spaceWaitSeconds: number; readRetrySeconds: number }
  /** Keep the destination volumes of a cancelled job (default false: remove them). */
  keepOnCancel: boolean
  /** Keep one job worker started ahead of the next job (`MIGRATOR_WARM_WORKER`). */
  warmWorker: boolean
  /** The destination domain: libvirt domain type (`kvm`, or `qemu` for TCG; default `kvm` when /dev/kvm exists, else `qemu`), default bridge for NICs the plan does not map (null: user-mode network), boot check (seconds, and an optional serial regexp whose match proves a boot: see VARIABLES). */
  domain: { type: 'kvm' | 'qemu'; defaultBridge: string | null; bootGraceSeconds: number; bootTimeoutSeconds: number; bootSerialPattern: string | null }
  /** Windows V2V (spec 1.5): the virtio-win ISO, the `virt-v2v-in-place` binary, and the `virt-v2v` binary of the VMCX passthrough. */
  v2v: { virtioWinIso: string; binary: string; fullImportBinary: string }
  /** The host backup API for plan `restore_point` (spec 4, 5.2); null when not configured. */
  backup: {
    baseUrl: string
    username: string
    password: string
    caFile: string | null
    fingerprint256: string | null
    insecure: boolean
    restorePointTimeoutSeconds: number
  } | null
  /** libvirt's QEMU driver configuration, read for the user qemu runs as (default `/etc/libvirt/qemu.conf`). */
  qemuConf: string
  /**
   * `<APPLIANCE>_MIGRATOR_SKIP_GO_SHIM` of spec 1.5: its name for this appliance and its value
   * (null when unset). Accepted and reported by the pre-flight checks: there is no Go shim.
   */
  skipGoShim: { variable: string; value: string | null }
}

const GiB = 1024 ** 3
const MiB = 1024 ** 2

/** Unset and empty are the same: the default applies. */
const unsetIfEmpty = (v: unknown) => (v === '' ? undefined : v)

/** A non-negative integer variable with a minimum and a default. */
function int(def: number, min = 0) {
  return z.preprocess(
    unsetIfEmpty,
    z
      .string()
      .regex(/^\d+$/, { error: `is not an integer >= ${min}` })
      .transform(Number)
      .pipe(
        z
          .number()
          .int()
          .min(min, { error: `is not an integer >= ${min}` })
          .max(Number.MAX_SAFE_INTEGER, { error: 'is too large' }),
      )
      .default(def),
  )
}

/** A string variable with a default. */
function str(def: string) {
  return z.preprocess(unsetIfEmpty, z.string().default(def))
}

/** An optional string variable (null when unset). */
function optional() {
  return z.preprocess(unsetIfEmpty, z.string().nullable().default(null))
}

/**
 * A comma-separated list (unset or empty: none); each trimmed, non-empty item goes through
 * `item`, which returns its canonical form or null when it is malformed (then the variable is
 * refused, naming the item and `rule`).
 */
function commaList(item: (raw: string) => string | null, rule: string) {
  return z.preprocess(
    unsetIfEmpty,
    z
      .string()
      .default('')
      .transform((raw, ctx) => {
        const out: string[] = []
        for (const part of raw
          .split(',')
          .map((p) => p.trim())
          .filter(Boolean)) {
          const canonical = item(part)
          if (canonical === null) {
            ctx.addIssue({ code: 'custom', message: `item ${JSON.stringify(part)} ${rule}` })
            return z.NEVER
          }
          out.push(canonical)
        }
        return out
      }),
  )
}

/** `raw` parsed by the WHATWG URL parser, or null when it does not parse. */
function parseUrl(raw: string): URL | null {
  try {
    return new URL(raw)
  } catch {
    return null
  }
}

/**
 * A bare host name or address (`migrator.example`, `10.0.0.5`, `[fd00::5]`, an optional port
 * that is ignored) in the form the URL parser gives `URL.hostname`, or null when `raw` is
 * anything else (a scheme, path, user or query).
 */
export function canonicalHostname(raw: string): string | null {
  const u = parseUrl(`http://${raw}`)
  if (!u || u.username || u.password || u.pathname !== '/' || u.search || u.hash) return null
  return u.hostname
}

/** An origin `http(s)://host[:port]` as `URL.origin` writes it, or null when `raw` is not one (a path, query or user is refused). */
export function canonicalOrigin(raw: string): string | null {
  const u = parseUrl(raw)
  if (!u || (u.protocol !== 'http:' && u.protocol !== 'https:')) return null
  if (u.username || u.password || u.pathname !== '/' || u.search || u.hash) return null
  return u.origin
}

/** A `1` flag (anything else, or unset, is false). */
function flag() {
  return z.preprocess(unsetIfEmpty, z.string().optional()).transform((v) => v === '1')
}

/** One variable: its schema (with its default) and what it means. */
interface Variable {
  schema: z.ZodType
  doc: string
}

/**
 * Every `MIGRATOR_*` variable: schema (parse + default) and meaning. The table of
 * docs/configuration.md is generated from it (`bun scripts/config-doc.ts`; a unit test fails when
 * they differ). A default that depends on the host is given in words at the end of `doc`, as
 * `(default: ...)`.
 */
export const VARIABLES = {
  MIGRATOR_DATA_DIR: {
    schema: optional(),
    doc: 'data directory: imports/, keyring/, migrator.db/, volumes/, logs/ (default: /var/lib/<appliance> as root, else ./var)',
  },
  MIGRATOR_LISTEN: {
    schema: z.preprocess(
      unsetIfEmpty,
      z
        .string()
        .nullable()
        .default(null)
        .transform((raw, ctx) => {
          if (raw === null) return null
          const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(raw)
          if (!m || Number(m[2]) > 65535) {
            ctx.addIssue({ code: 'custom', message: 'is not host:port' })
            return z.NEVER
          }
          return { host: m[1].replace(/^\[|\]$/g, ''), port: Number(m[2]) }
        }),
    ),
    doc: 'optional TCP listener host:port (unset: none, the unix socket only); every request on it needs the API token (<data dir>/api-token), the MIGRATOR_BASIC_AUTH credentials or a console session, else 401; a non-loopback address also requires MIGRATOR_BASIC_AUTH (docs/security.md)',
  },
  MIGRATOR_SOCKET: {
    schema: optional().refine((v) => v === null || v === 'none' || (path.isAbsolute(v) && Buffer.byteLength(v) <= 90), {
      // 108 bytes of sun_path, less the private directory the socket is bound in first (runtime/socket.ts)
      error: 'must be an absolute path of at most 90 bytes (a unix socket address), or none',
    }),
    doc: "the API's unix socket, owner root, mode 0660, its directory created 0750 when missing; who can connect to it (root and MIGRATOR_SOCKET_GROUP) is served without a token; none: no socket, then MIGRATOR_LISTEN is required (default: /run/<appliance>/api.sock)",
  },
  MIGRATOR_SOCKET_GROUP: {
    schema: str('root').pipe(z.string().regex(/^([a-z_][a-z0-9_-]*\$?|\d+)$/i, { error: 'must be a group name or a numeric gid' })),
    doc: 'group of the unix socket (and of its directory when the server creates it): its members reach the API as root does',
  },
  MIGRATOR_BASE_PATH: { schema: str('/api/v1/migrator').transform((s) => s.replace(/\/+$/, '')), doc: 'mount point of the API' },
  MIGRATOR_APPLIANCE: {
    schema: str('migrator').pipe(z.string().regex(/^[a-z0-9][a-z0-9_-]{0,63}$/i, { error: 'must match [a-z0-9][a-z0-9_-]*' })),
    doc: 'the <appliance> path segment (spec 1.3, 1.5)',
  },
  MIGRATOR_IMPORT_ROOT: { schema: optional(), doc: 'the import root, created mode 0750 (default: <data dir>/imports)' },
  MIGRATOR_SINK: {
    schema: z.preprocess(unsetIfEmpty, z.enum(['file', 'zvol'], { error: 'must be "file" or "zvol"' }).default('file')),
    doc: 'destination sink: file (sparse images under volumes/) or zvol',
  },
  MIGRATOR_ZFS_POOL: { schema: str('tank'), doc: 'pool of the zvol sink' },
  MIGRATOR_LIBVIRT_URI: { schema: str('qemu:///system'), doc: 'libvirt connection' },
  MIGRATOR_LIBVIRT_RECONNECT_SECONDS: {
    schema: int(60, 0),
    doc: 'how long a libvirt call waits for libvirtd to answer again (stopped or restarting) before the job fails',
  },
  MIGRATOR_LIBVIRT_QEMU_CONF: { schema: str('/etc/libvirt/qemu.conf'), doc: "libvirt's QEMU driver configuration, read for the user and group qemu runs as" },
  MIGRATOR_MAX_JOBS: { schema: int(2, 1), doc: 'concurrent jobs' },
  MIGRATOR_MAX_JOBS_PER_SOURCE: {
    schema: int(0, 0),
    doc: "at most this many jobs of one live source run at once, besides MIGRATOR_MAX_JOBS; a bulk plan's max_per_source may lower it (0: no limit)",
  },
  MIGRATOR_PRECOPY_INTERVAL_SECONDS: {
    schema: int(300, 1),
    doc: 'warm plans cutting over on command or at a time: seconds between delta passes when the plan has no precopy_interval_seconds',
  },
  MIGRATOR_INSPECT_CONCURRENCY: {
    schema: int(Math.max(1, Math.min(4, cpus().length - 1)), 1),
    doc: 'inspects running at once, each in a worker thread of the server (default: CPUs - 1, 1 to 4)',
  },
  MIGRATOR_INSPECT_QUEUE: { schema: int(8, 0), doc: 'inspects waiting for a worker thread; beyond, 503 E_MIG_CONFLICT with Retry-After: 2' },
  MIGRATOR_UPLOAD_CAP_BYTES: { schema: int(20 * GiB, 1), doc: 'upload size cap (spec 8)' },
  MIGRATOR_UPLOAD_TTL_SECONDS: { schema: int(7 * 24 * 3600, 1), doc: 'an upload expires this long after it was received' },
  MIGRATOR_SWEEP_INTERVAL_SECONDS: { schema: int(60, 1), doc: 'how often expired uploads are removed' },
  MIGRATOR_SSE_HEARTBEAT_SECONDS: { schema: int(15, 1), doc: 'SSE heartbeat comment interval' },
  MIGRATOR_EVENT_REPLAY_WINDOW: { schema: int(10000, 10), doc: 'job events kept for Last-Event-ID replay' },
  MIGRATOR_AUDIT_RETENTION_DAYS: {
    schema: int(90, 1),
    doc: 'days the audit log of state-changing requests is kept (GET /audit, `migrator audit`); older entries are pruned hourly',
  },
  MIGRATOR_BASIC_AUTH: {
    schema: z.preprocess(
      unsetIfEmpty,
      z
        .string()
        .regex(/^[^:]+:.+$/, { error: 'must be user:password' })
        .nullable()
        .default(null),
    ),
    doc: 'user:password guard for stand-alone installs (401 E_MIG_AUTH_FAILED without it)',
  },
  MIGRATOR_ALLOWED_HOSTS: {
    schema: commaList(canonicalHostname, 'is not a host name or address (name, a.b.c.d or [v6], no scheme or path)'),
    doc: 'comma list of host names the server answers to besides localhost, 127.0.0.0/8, [::1] and the MIGRATOR_LISTEN address (any port); other Host headers get 421 (docs/security.md)',
  },
  MIGRATOR_ALLOWED_ORIGINS: {
    schema: commaList(canonicalOrigin, 'is not an origin http(s)://host[:port] without path'),
    doc: "comma list of origins (http(s)://host[:port]) whose pages may send requests besides the migrator's own, e.g. a daemon serving its UI on another origin; other origins get 403 (docs/security.md)",
  },
  MIGRATOR_LOG_LEVEL: { schema: str('info'), doc: 'pino level (silent turns logs off)' },
  MIGRATOR_LEASE_SECONDS: { schema: int(30, 1), doc: 'job lease; a job whose lease expired is resumed by any server' },
  MIGRATOR_HEARTBEAT_TIMEOUT_SECONDS: { schema: int(20, 1), doc: 'a worker silent this long is killed and its job retried' },
  MIGRATOR_MAX_ATTEMPTS: { schema: int(3, 1), doc: 'worker runs of one job before it fails (E_MIG_INTERNAL)' },
  MIGRATOR_FLUSH_EVERY_BYTES: {
    schema: int(256 * MiB, MiB),
    doc: 'durable checkpoint (fsync + watermark) interval of the copy, in bytes of data read from the source (zero extents do not count)',
  },
  MIGRATOR_COPY_MAX_BYTES_PER_SECOND: { schema: int(0, 0), doc: 'bandwidth cap on source reads per disk copy (0: none)' },
  MIGRATOR_SPACE_WAIT_SECONDS: {
    schema: int(600, 0),
    doc: 'an offline copy whose file system fills up (volumes, store) waits this long for space, with a notice, then fails (0: fails at once)',
  },
  MIGRATOR_READ_RETRY_SECONDS: {
    schema: int(300, 0),
    doc: 'an offline copy whose source returns I/O errors tries again from its durable watermark every 5 s for this long, with a notice, then fails (0: fails at once)',
  },
  MIGRATOR_DELTA_CONVERGE_BYTES: { schema: int(64 * MiB, 0), doc: 'a warm delta pass below this converges' },
  MIGRATOR_DELTA_MAX_PASSES: { schema: int(8, 1), doc: 'delta passes before E_MIG_DELTA_TOO_LARGE' },
  MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS: {
    schema: int(300, 1),
    doc: 'live sources: how long the guest may take to shut down (ShutdownGuest) before the VM is powered off',
  },
  MIGRATOR_KEEP_ON_CANCEL: { schema: flag(), doc: "1 keeps a cancelled job's volumes" },
  MIGRATOR_WARM_WORKER: {
    schema: z.preprocess(unsetIfEmpty, z.enum(['0', '1'], { error: 'must be 0 or 1' }).default('1')).transform((v) => v === '1'),
    doc: "1 keeps one job worker started ahead of the next job (modules loaded, configuration and store open: its start is off every job's start, at the cost of one idle process); 0 forks each worker when its job starts. Each running worker's pid is in <data dir>/workers/<job id>.pid",
  },
  MIGRATOR_DOMAIN_TYPE: {
    schema: z.preprocess(unsetIfEmpty, z.enum(['kvm', 'qemu'], { error: 'must be "kvm" or "qemu"' }).optional()),
    doc: 'libvirt domain type, kvm or qemu (= TCG) (default: kvm when /dev/kvm exists, else qemu)',
  },
  MIGRATOR_DEFAULT_BRIDGE: { schema: optional(), doc: 'bridge for NICs plan.networks does not map (unset: user-mode networking)' },
  MIGRATOR_BOOT_GRACE_SECONDS: {
    schema: int(10, 0),
    doc: 'the domain must still run after this long; also how long a guest that gives no serial evidence is watched',
  },
  MIGRATOR_BOOT_TIMEOUT_SECONDS: {
    schema: int(120, 1),
    doc: 'how long to wait for boot evidence from a guest with a serial console (or for MIGRATOR_BOOT_SERIAL_PATTERN)',
  },
  MIGRATOR_BOOT_SERIAL_PATTERN: {
    schema: optional().superRefine((v, ctx) => {
      if (v === null) return
      try {
        new RegExp(v)
      } catch (e) {
        ctx.addIssue({ code: 'custom', message: `is not a regular expression: ${(e as Error).message}` })
      }
    }),
    doc: 'optional extra: a regular expression whose match in the serial log proves the boot (unset: the evidence rules of lib/domain/boot-check.ts decide)',
  },
  MIGRATOR_VIRTIO_WIN_ISO: { schema: str('/usr/share/virtio-win/virtio-win.iso'), doc: 'driver ISO for Windows V2V' },
  MIGRATOR_V2V_BINARY: { schema: str('virt-v2v-in-place'), doc: 'the in-place V2V tool' },
  MIGRATOR_V2V_FULL_IMPORT_BINARY: { schema: str('virt-v2v'), doc: 'the tool of the VMCX passthrough import' },
  MIGRATOR_BACKUP_URL: { schema: optional(), doc: 'host API {base_url} for plan restore_point (the client adds /api/v1)' },
  MIGRATOR_BACKUP_USER: { schema: str(''), doc: 'Basic user of the backup API' },
  MIGRATOR_BACKUP_PASSWORD: { schema: str(''), doc: 'Basic password of the backup API' },
  MIGRATOR_BACKUP_CA_FILE: { schema: optional(), doc: "TLS: a CA file the backup API's certificate must chain to" },
  MIGRATOR_BACKUP_FINGERPRINT: { schema: optional(), doc: 'TLS: pinned SHA-256 certificate fingerprint of the backup API' },
  MIGRATOR_BACKUP_INSECURE: { schema: flag(), doc: 'TLS: 1 accepts any certificate from the backup API' },
  MIGRATOR_BACKUP_TIMEOUT_SECONDS: { schema: int(600, 1), doc: "how long to wait for the run's restore point" },
} satisfies Record<string, Variable>

const EnvSchema = z.object(
  Object.fromEntries(Object.entries(VARIABLES).map(([k, v]) => [k, v.schema])) as { [K in keyof typeof VARIABLES]: (typeof VARIABLES)[K]['schema'] },
)

/** True for addresses that only this machine can reach. */
export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\./.test(host)
}

/**
 * The data directory when `MIGRATOR_DATA_DIR` is unset: `/var/lib/<appliance>` (spec 1.5) for
 * root, the installed appliance; `./var` (resolved against the working directory) for any other
 * user, a development server.
 */
export function defaultDataDir(appliance: string, uid: number | undefined = process.getuid?.()): string {
  return uid === 0 ? path.join('/var/lib', appliance) : path.resolve('./var')
}

/** The unix socket when `MIGRATOR_SOCKET` is unset: `/run/<appliance>/api.sock`. */
export function defaultSocket(appliance: string): string {
  return path.join('/run', appliance, 'api.sock')
}

/** Name of spec 1.5's `<APPLIANCE>_MIGRATOR_SKIP_GO_SHIM` for `appliance` (upper case, `-` as `_`). */
export function skipGoShimVariable(appliance: string): string {
  return `${appliance.toUpperCase().replace(/-/g, '_')}_MIGRATOR_SKIP_GO_SHIM`
}

/**
 * Reads the configuration from `env` (default `process.env`). Throws a plain Error naming the
 * variable, its value and the rule when a value is malformed, when a non-loopback listen
 * address has no `MIGRATOR_BASIC_AUTH` guard (a stand-alone install is never open), or when
 * neither a socket nor a TCP listener is configured.
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const picked = Object.fromEntries(Object.keys(VARIABLES).map((k) => [k, env[k]]))
  const parsed = EnvSchema.safeParse(picked)
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => {
      const name = String(i.path[0])
      return `${name}=${JSON.stringify(env[name] ?? '')} ${i.message}`
    })
    throw new Error(`configuration: ${lines.join('; ')}`)
  }
  const e = parsed.data
  const dataDir = path.resolve(e.MIGRATOR_DATA_DIR ?? defaultDataDir(e.MIGRATOR_APPLIANCE))
  const goShim = skipGoShimVariable(e.MIGRATOR_APPLIANCE)
  const cfg: Config = {
    dataDir,
    listen: e.MIGRATOR_LISTEN,
    socket:
      e.MIGRATOR_SOCKET === 'none' ? null : { path: path.normalize(e.MIGRATOR_SOCKET ?? defaultSocket(e.MIGRATOR_APPLIANCE)), group: e.MIGRATOR_SOCKET_GROUP },
    basePath: e.MIGRATOR_BASE_PATH,
    appliance: e.MIGRATOR_APPLIANCE,
    importRoot: path.resolve(e.MIGRATOR_IMPORT_ROOT ?? path.join(dataDir, 'imports')),
    sink: e.MIGRATOR_SINK,
    zfsPool: e.MIGRATOR_ZFS_POOL,
    libvirtUri: e.MIGRATOR_LIBVIRT_URI,
    libvirtReconnectSeconds: e.MIGRATOR_LIBVIRT_RECONNECT_SECONDS,
    maxJobs: e.MIGRATOR_MAX_JOBS,
    inspect: { concurrency: e.MIGRATOR_INSPECT_CONCURRENCY, queue: e.MIGRATOR_INSPECT_QUEUE },
    uploadCapBytes: e.MIGRATOR_UPLOAD_CAP_BYTES,
    uploadTtlSeconds: e.MIGRATOR_UPLOAD_TTL_SECONDS,
    sweepIntervalSeconds: e.MIGRATOR_SWEEP_INTERVAL_SECONDS,
    sseHeartbeatSeconds: e.MIGRATOR_SSE_HEARTBEAT_SECONDS,
    eventReplayWindow: e.MIGRATOR_EVENT_REPLAY_WINDOW,
    auditRetentionDays: e.MIGRATOR_AUDIT_RETENTION_DAYS,
    basicAuth: e.MIGRATOR_BASIC_AUTH,
    allowedHosts: e.MIGRATOR_ALLOWED_HOSTS,
    allowedOrigins: e.MIGRATOR_ALLOWED_ORIGINS,
    logLevel: e.MIGRATOR_LOG_LEVEL,
    supervisor: {
      leaseSeconds: e.MIGRATOR_LEASE_SECONDS,
      heartbeatTimeoutSeconds: e.MIGRATOR_HEARTBEAT_TIMEOUT_SECONDS,
      maxAttempts: e.MIGRATOR_MAX_ATTEMPTS,
    },
    delta: { convergeBelowBytes: e.MIGRATOR_DELTA_CONVERGE_BYTES, maxPasses: e.MIGRATOR_DELTA_MAX_PASSES },
    precopyIntervalSeconds: e.MIGRATOR_PRECOPY_INTERVAL_SECONDS,
    maxJobsPerSource: e.MIGRATOR_MAX_JOBS_PER_SOURCE,
    guestShutdownTimeoutSeconds: e.MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS,
    copy: {
      flushEveryBytes: e.MIGRATOR_FLUSH_EVERY_BYTES,
      maxBytesPerSecond: e.MIGRATOR_COPY_MAX_BYTES_PER_SECOND,
      spaceWaitSeconds: e.MIGRATOR_SPACE_WAIT_SECONDS,
      readRetrySeconds: e.MIGRATOR_READ_RETRY_SECONDS,
    },
    keepOnCancel: e.MIGRATOR_KEEP_ON_CANCEL,
    warmWorker: e.MIGRATOR_WARM_WORKER,
    domain: {
      type: e.MIGRATOR_DOMAIN_TYPE ?? (existsSync('/dev/kvm') ? 'kvm' : 'qemu'),
      defaultBridge: e.MIGRATOR_DEFAULT_BRIDGE,
      bootGraceSeconds: e.MIGRATOR_BOOT_GRACE_SECONDS,
      bootTimeoutSeconds: e.MIGRATOR_BOOT_TIMEOUT_SECONDS,
      bootSerialPattern: e.MIGRATOR_BOOT_SERIAL_PATTERN,
    },
    v2v: { virtioWinIso: e.MIGRATOR_VIRTIO_WIN_ISO, binary: e.MIGRATOR_V2V_BINARY, fullImportBinary: e.MIGRATOR_V2V_FULL_IMPORT_BINARY },
    backup: e.MIGRATOR_BACKUP_URL
      ? {
          baseUrl: e.MIGRATOR_BACKUP_URL,
          username: e.MIGRATOR_BACKUP_USER,
          password: e.MIGRATOR_BACKUP_PASSWORD,
          caFile: e.MIGRATOR_BACKUP_CA_FILE,
          fingerprint256: e.MIGRATOR_BACKUP_FINGERPRINT,
          insecure: e.MIGRATOR_BACKUP_INSECURE,
          restorePointTimeoutSeconds: e.MIGRATOR_BACKUP_TIMEOUT_SECONDS,
        }
      : null,
    qemuConf: e.MIGRATOR_LIBVIRT_QEMU_CONF,
    skipGoShim: { variable: goShim, value: env[goShim] ?? null },
  }
  if (cfg.listen === null && cfg.socket === null) {
    throw new Error('configuration: MIGRATOR_SOCKET=none needs a MIGRATOR_LISTEN address (the server would listen nowhere)')
  }
  if (cfg.listen !== null && !isLoopback(cfg.listen.host) && cfg.basicAuth === null) {
    throw new Error(`configuration: listening on ${cfg.listen.host} needs MIGRATOR_BASIC_AUTH (the migrator has no authentication of its own, spec 5)`)
  }
  return cfg
}

/** Paths below the data directory (spec 1.5 layout, DESIGN.md section 2). */
export function dataPaths(cfg: Config) {
  return {
    importRoot: cfg.importRoot,
    uploads: path.join(cfg.importRoot, '.uploads'),
    keyringDir: path.join(cfg.dataDir, 'keyring'),
    keyFile: path.join(cfg.dataDir, 'keyring', 'migrator.key'),
    /** The TCP listener's API token (lib/auth/api-token.ts). */
    tokenFile: path.join(cfg.dataDir, 'api-token'),
    dbDir: path.join(cfg.dataDir, 'migrator.db'),
    dbFile: path.join(cfg.dataDir, 'migrator.db', 'migrator.sqlite'),
    volumes: path.join(cfg.dataDir, 'volumes'),
    logs: path.join(cfg.dataDir, 'logs'),
  }
}
