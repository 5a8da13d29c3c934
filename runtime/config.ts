/**
 * Configuration from environment variables with the embedded defaults of DESIGN.md section 2.
 * All sizes are bytes, all durations seconds unless the name says otherwise.
 */
import { existsSync } from 'node:fs'
import * as path from 'node:path'

/** The migrator's configuration. */
export interface Config {
  /** Data directory holding `imports/`, `keyring/`, `migrator.db/`, `volumes/` (default `./var`). */
  dataDir: string
  /** Listen address (default `127.0.0.1:8080`). */
  listen: { host: string; port: number }
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
  /** Concurrent jobs (default 2). */
  maxJobs: number
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
  /** Optional Basic-auth guard `user:password`, required when listening on a non-loopback address. */
  basicAuth: string | null
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
  /** The copy loop: durable checkpoint (fsync + watermark) every `flushEveryBytes` (default 256 MiB); bandwidth cap on source reads in bytes/s (0: none). */
  copy: { flushEveryBytes: number; maxBytesPerSecond: number }
  /** Keep the destination volumes of a cancelled job (default false: remove them). */
  keepOnCancel: boolean
  /** The destination domain: libvirt domain type (`kvm`, or `qemu` for TCG; default `kvm` when /dev/kvm exists, else `qemu`), default bridge for NICs the plan does not map (null: user-mode network), boot check (s; optional serial regexp that must appear). */
  domain: { type: 'kvm' | 'qemu'; defaultBridge: string | null; bootGraceSeconds: number; bootTimeoutSeconds: number; bootSerialPattern: string | null }
  /** Windows V2V (spec 1.5): the virtio-win ISO, the `virt-v2v-in-place` binary, and the `virt-v2v` binary of the VMCX passthrough. */
  v2v: { virtioWinIso: string; binary: string; fullImportBinary: string }
  /** The host backup API for plan `restore_point` (spec 4, 5.2); null when not configured. */
  backup: { baseUrl: string; username: string; password: string; caFile: string | null; fingerprint256: string | null; insecure: boolean; restorePointTimeoutSeconds: number } | null
}

const GiB = 1024 ** 3

function int(env: NodeJS.ProcessEnv, name: string, def: number, min = 0): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return def
  const n = Number(raw)
  if (!Number.isSafeInteger(n) || n < min) throw new Error(`configuration: ${name}=${JSON.stringify(raw)} is not an integer >= ${min}`)
  return n
}

function listen(raw: string): { host: string; port: number } {
  const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(raw)
  if (!m) throw new Error(`configuration: MIGRATOR_LISTEN=${JSON.stringify(raw)} is not host:port`)
  return { host: m[1].replace(/^\[|\]$/g, ''), port: Number(m[2]) }
}

function domainType(raw: string | undefined): 'kvm' | 'qemu' {
  if (raw === 'kvm' || raw === 'qemu') return raw
  if (raw) throw new Error('configuration: MIGRATOR_DOMAIN_TYPE must be "kvm" or "qemu"')
  return existsSync('/dev/kvm') ? 'kvm' : 'qemu'
}

function regexp(env: NodeJS.ProcessEnv, name: string): string | null {
  const raw = env[name]
  if (!raw) return null
  try {
    new RegExp(raw)
  } catch (e) {
    throw new Error(`configuration: ${name} is not a regular expression: ${(e as Error).message}`)
  }
  return raw
}

/** True for addresses that only this machine can reach. */
export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\./.test(host)
}

/**
 * Reads the configuration from `env` (default `process.env`). Throws a plain Error with the
 * variable name when a value is malformed, or when a non-loopback listen address has no
 * `MIGRATOR_BASIC_AUTH` guard (a stand-alone install is never open).
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const dataDir = path.resolve(env.MIGRATOR_DATA_DIR || './var')
  const appliance = env.MIGRATOR_APPLIANCE || 'migrator'
  if (!/^[a-z0-9][a-z0-9_-]{0,63}$/i.test(appliance)) throw new Error('configuration: MIGRATOR_APPLIANCE must match [a-z0-9][a-z0-9_-]*')
  const sink = env.MIGRATOR_SINK || 'file'
  if (sink !== 'file' && sink !== 'zvol') throw new Error('configuration: MIGRATOR_SINK must be "file" or "zvol"')
  const basePath = (env.MIGRATOR_BASE_PATH || '/api/v1/migrator').replace(/\/+$/, '')
  const cfg: Config = {
    dataDir,
    listen: listen(env.MIGRATOR_LISTEN || '127.0.0.1:8080'),
    basePath,
    appliance,
    importRoot: path.resolve(env.MIGRATOR_IMPORT_ROOT || path.join(dataDir, 'imports')),
    sink,
    zfsPool: env.MIGRATOR_ZFS_POOL || 'tank',
    libvirtUri: env.MIGRATOR_LIBVIRT_URI || 'qemu:///system',
    maxJobs: int(env, 'MIGRATOR_MAX_JOBS', 2, 1),
    uploadCapBytes: int(env, 'MIGRATOR_UPLOAD_CAP_BYTES', 20 * GiB, 1),
    uploadTtlSeconds: int(env, 'MIGRATOR_UPLOAD_TTL_SECONDS', 7 * 24 * 3600, 1),
    sweepIntervalSeconds: int(env, 'MIGRATOR_SWEEP_INTERVAL_SECONDS', 60, 1),
    sseHeartbeatSeconds: int(env, 'MIGRATOR_SSE_HEARTBEAT_SECONDS', 15, 1),
    eventReplayWindow: int(env, 'MIGRATOR_EVENT_REPLAY_WINDOW', 10000, 10),
    basicAuth: env.MIGRATOR_BASIC_AUTH || null,
    logLevel: env.MIGRATOR_LOG_LEVEL || 'info',
    supervisor: {
      leaseSeconds: int(env, 'MIGRATOR_LEASE_SECONDS', 30, 1),
      heartbeatTimeoutSeconds: int(env, 'MIGRATOR_HEARTBEAT_TIMEOUT_SECONDS', 20, 1),
      maxAttempts: int(env, 'MIGRATOR_MAX_ATTEMPTS', 3, 1),
    },
    delta: {
      convergeBelowBytes: int(env, 'MIGRATOR_DELTA_CONVERGE_BYTES', 64 * 1024 * 1024, 0),
      maxPasses: int(env, 'MIGRATOR_DELTA_MAX_PASSES', 8, 1),
    },
    precopyIntervalSeconds: int(env, 'MIGRATOR_PRECOPY_INTERVAL_SECONDS', 300, 1),
    maxJobsPerSource: int(env, 'MIGRATOR_MAX_JOBS_PER_SOURCE', 0, 0),
    guestShutdownTimeoutSeconds: int(env, 'MIGRATOR_GUEST_SHUTDOWN_TIMEOUT_SECONDS', 300, 1),
    copy: {
      flushEveryBytes: int(env, 'MIGRATOR_FLUSH_EVERY_BYTES', 256 * 1024 * 1024, 1024 * 1024),
      maxBytesPerSecond: int(env, 'MIGRATOR_COPY_MAX_BYTES_PER_SECOND', 0, 0),
    },
    keepOnCancel: env.MIGRATOR_KEEP_ON_CANCEL === '1',
    domain: {
      type: domainType(env.MIGRATOR_DOMAIN_TYPE),
      defaultBridge: env.MIGRATOR_DEFAULT_BRIDGE || null,
      bootGraceSeconds: int(env, 'MIGRATOR_BOOT_GRACE_SECONDS', 10, 0),
      bootTimeoutSeconds: int(env, 'MIGRATOR_BOOT_TIMEOUT_SECONDS', 120, 1),
      bootSerialPattern: regexp(env, 'MIGRATOR_BOOT_SERIAL_PATTERN'),
    },
    v2v: {
      virtioWinIso: env.MIGRATOR_VIRTIO_WIN_ISO || '/usr/share/virtio-win/virtio-win.iso',
      binary: env.MIGRATOR_V2V_BINARY || 'virt-v2v-in-place',
      fullImportBinary: env.MIGRATOR_V2V_FULL_IMPORT_BINARY || 'virt-v2v',
    },
    backup: env.MIGRATOR_BACKUP_URL
      ? {
          baseUrl: env.MIGRATOR_BACKUP_URL,
          username: env.MIGRATOR_BACKUP_USER || '',
          password: env.MIGRATOR_BACKUP_PASSWORD || '',
          caFile: env.MIGRATOR_BACKUP_CA_FILE || null,
          fingerprint256: env.MIGRATOR_BACKUP_FINGERPRINT || null,
          insecure: env.MIGRATOR_BACKUP_INSECURE === '1',
          restorePointTimeoutSeconds: int(env, 'MIGRATOR_BACKUP_TIMEOUT_SECONDS', 600, 1),
        }
      : null,
  }
  if (cfg.basicAuth !== null && !/^[^:]+:.+$/.test(cfg.basicAuth)) throw new Error('configuration: MIGRATOR_BASIC_AUTH must be user:password')
  if (!isLoopback(cfg.listen.host) && cfg.basicAuth === null) {
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
    dbDir: path.join(cfg.dataDir, 'migrator.db'),
    dbFile: path.join(cfg.dataDir, 'migrator.db', 'migrator.sqlite'),
    volumes: path.join(cfg.dataDir, 'volumes'),
  }
}
