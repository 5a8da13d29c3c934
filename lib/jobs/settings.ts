/**
 * What the job flow reads of the server's settings: the part of the configuration
 * (`runtime/config.ts` `Config`, where each field is documented with its `MIGRATOR_*` variable)
 * and of the data directory's layout (`runtime/config.ts` `dataPaths`) that the steps of a job
 * use. The runtime passes its resolved configuration as it is: `Config` has every field here.
 */
import type { Logger as PinoLogger } from 'pino'

/** The job flow's part of the configuration; sizes in bytes, durations in seconds. */
export interface JobSettings {
  /** Data directory: the file sink's volumes and the staging files live below it. */
  dataDir: string
  /** Product path segment: the zvol sink's dataset names carry it. */
  appliance: string
  /** Destination sink: `file` or `zvol`. */
  sink: 'file' | 'zvol'
  /** ZFS pool of the zvol sink when the plan names none. */
  zfsPool: string
  /** libvirt connection URI, and how long a libvirt call waits for libvirtd to come back. */
  libvirtUri: string
  libvirtReconnectSeconds: number
  /** Keep the destination volumes of a cancelled job. */
  keepOnCancel: boolean
  /** Live sources: how long a guest shutdown may take before the VM is powered off. */
  guestShutdownTimeoutSeconds: number
  /** Warm delta loop: converged below this many bytes per pass, at most this many passes. */
  delta: { convergeBelowBytes: number; maxPasses: number }
  /** The copy loop: checkpoint interval, bandwidth cap (0: none), space and read-retry windows (0: fail at once). */
  copy: { flushEveryBytes: number; maxBytesPerSecond: number; spaceWaitSeconds: number; readRetrySeconds: number }
  /** The destination domain: libvirt domain type, default bridge (null: user-mode network), boot check. */
  domain: { type: 'kvm' | 'qemu'; defaultBridge: string | null; bootGraceSeconds: number; bootTimeoutSeconds: number; bootSerialPattern: string | null }
  /** virt-v2v: the virtio-win ISO, `virt-v2v-in-place`, and the `virt-v2v` of the VMCX passthrough. */
  v2v: { virtioWinIso: string; binary: string; fullImportBinary: string }
  /** The host backup API for plan `restore_point`; null when not configured. */
  backup: {
    baseUrl: string
    username: string
    password: string
    caFile: string | null
    fingerprint256: string | null
    insecure: boolean
    restorePointTimeoutSeconds: number
  } | null
  /** libvirt's QEMU driver configuration, read for the user qemu runs as. */
  qemuConf: string
}

/** The data directory's paths the job flow uses (absolute). */
export interface JobPaths {
  /** The import root (offline inputs) and its `.uploads` directory. */
  importRoot: string
  uploads: string
  /** The SQLite store's file (the space wait keeps room for it). */
  dbFile: string
  /** The file sink's volumes. */
  volumes: string
  /** Serial logs of the destination domains and test boots. */
  logs: string
}

/** The structured logger the steps log to (the runtime's pino logger). */
export type JobLogger = PinoLogger
