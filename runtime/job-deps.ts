/**
 * Wires the orchestrator of one job to the real outer systems, from the configuration
 * (DESIGN.md sections 4-6): the source preparation of the plan, the destination sink
 * (`file` or `zvol`), the streaming copy loop, the Windows V2V preparer with the sink's
 * snapshot, the libvirt domain start with its boot check, and the host backup API for
 * plan `restore_point`. Used by the job worker (`runtime/worker.ts`).
 */
import { existsSync, readFileSync } from 'node:fs'
import { mkdir } from 'node:fs/promises'
import * as path from 'node:path'
import { BackupClient } from '../lib/backup/client.ts'
import type { Sealer } from '../lib/crypto/seal.ts'
import { defineAndStart } from '../lib/domain/start.ts'
import { Virsh } from '../lib/domain/virsh.ts'
import { sanitizeDomainName } from '../lib/domain/xml.ts'
import { MigError } from '../lib/errors.ts'
import { redactHostPaths } from '../lib/hostpath.ts'
import type { Job, RestorePointRecord } from '../lib/job.ts'
import { copyDisk } from '../lib/pipeline/copy-disk.ts'
import type { OrchestratorDeps, StartOutcome } from '../lib/pipeline/orchestrator-deps.ts'
import type { DomainVolume } from '../lib/domain/xml.ts'
import { runJobLiveImport } from '../lib/live-import/job.ts'
import { prepareSource } from '../lib/pipeline/prepare.ts'
import { allocatedBelow, checkBeforeCopy } from '../lib/host/precopy.ts'
import { run } from '../lib/host/doctor.ts'
import { spaceOf } from '../lib/host/fs-space.ts'
import { STORE_NEEDS_BYTES } from '../lib/store/persist.ts'
import { readQemuUser } from '../lib/host/qemu-access.ts'
import type { VmManifest } from '../lib/manifest.ts'
import type { Plan } from '../lib/plan.ts'
import { FileSink } from '../lib/sink/file.ts'
import type { Sink } from '../lib/sink/types.ts'
import { ZvolSink } from '../lib/sink/zvol.ts'
import type { Store } from '../lib/store/index.ts'
import { V2vPreparer, type V2vVolume } from '../lib/v2v/preparer.ts'
import type { Config, dataPaths } from './config.ts'
import type { Logger } from './logger.ts'

/** What the worker has at hand. `signal` aborts the job (cancel). */
export interface JobDepsInput {
  config: Config
  paths: ReturnType<typeof dataPaths>
  store: Store
  sealer: Sealer
  logger: Logger
  jobId: string
  signal: AbortSignal
}

/**
 * The destination sink the configuration names; for the zvol sink, `pool` (the plan's
 * `destination.pool`) overrides `MIGRATOR_ZFS_POOL`. The file sink has no pool and ignores it.
 */
export function sinkFromConfig(config: Config, pool?: string): Sink {
  return config.sink === 'zvol' ? new ZvolSink({ pool: pool ?? config.zfsPool, appliance: config.appliance }) : new FileSink({ dataDir: config.dataDir })
}

/** The backup API client of the configuration, or null when `MIGRATOR_BACKUP_URL` is unset. */
export function backupClientFromConfig(config: Config): BackupClient | null {
  const b = config.backup
  if (!b) return null
  return new BackupClient({
    baseUrl: b.baseUrl,
    username: b.username,
    password: b.password,
    tls: { ca_pem: b.caFile ? readFileSync(b.caFile, 'utf8') : undefined, fingerprint256: b.fingerprint256 ?? undefined, insecure: b.insecure },
  })
}

/**
 * The bridges the domain of `manifest` will use: for each NIC, the `plan.networks` bridge its
 * network maps to, else `defaultBridge` (none: user-mode networking), with where each comes from.
 */
export function bridgesInUse(manifest: VmManifest, networks: Plan['networks'], defaultBridge: string | null): Array<{ name: string; from: string }> {
  const out = new Map<string, string>()
  for (const nic of manifest.nics) {
    const i = (networks ?? []).findIndex((m) => m.source === nic.network)
    if (i >= 0) out.set(networks![i].bridge, `plan.networks[${i}].bridge`)
    else if (defaultBridge) out.set(defaultBridge, 'MIGRATOR_DEFAULT_BRIDGE')
  }
  return [...out].map(([name, from]) => ({ name, from }))
}

/**
 * Everything of `OrchestratorDeps` but the IPC callbacks (`onJob`, `onProgress`), for job
 * `input.jobId` (read to pick its destination pool). Throws `E_MIG_NOT_FOUND` for an unknown job,
 * `E_MIG_PERSIST_FAILED` when the store fails.
 */
export async function buildJobDeps(input: JobDepsInput): Promise<Omit<OrchestratorDeps, 'onJob' | 'onProgress'>> {
  const { config, paths, store, sealer, logger, jobId, signal } = input
  const pool = (await store.jobs.get(jobId)).plan.destination?.pool
  const sink = sinkFromConfig(config, pool)
  const virsh = new Virsh({ uri: config.libvirtUri, reconnectMs: config.libvirtReconnectSeconds * 1000 })
  // The domain list for the name reservation is asked for now, so `virsh list` runs while the
  // input is inspected (a fixed cost of every job); a failure surfaces at the reservation.
  // libvirt out of reach (a daemon restart) is waited for by the client (libvirtReconnectSeconds).
  const domains = virsh.list()
  domains.catch(() => {})
  // Read while the job inspects its source (two getent processes): the pre-copy checks need it.
  const qemuUser = readQemuUser(config.qemuConf)
  qemuUser.catch(() => {}) // an unreadable qemu.conf fails the pre-copy checks, which await it
  const backup = backupClientFromConfig(config)
  const now = () => new Date()
  // The job's domain name, reserved against `taken` (libvirt's domains) and every active job:
  // when the job starts, and again (`replace`) when libvirt has it by the define.
  const reserveName = (job: Job, manifest: VmManifest, taken: ReadonlySet<string>, replace = false) =>
    store.jobs.reserveDomain(job.id, sanitizeDomainName(job.plan.name ?? manifest.name), taken, now().toISOString(), { replace })

  const takeRestorePoint = backup
    ? async (job: { plan: { restore_point?: { backup_job_id: string; require_quiesced?: boolean } } }, sig: AbortSignal): Promise<RestorePointRecord> => {
        const rp = job.plan.restore_point!
        logger.info({ backup_job_id: rp.backup_job_id }, 'running the backup job for the restore point')
        const runId = await backup.runJob(rp.backup_job_id)
        const point = await backup.waitForRestorePoint(runId, {
          timeoutMs: config.backup!.restorePointTimeoutSeconds * 1000,
          requireQuiesced: rp.require_quiesced,
          signal: sig,
        })
        return { backup_job_id: rp.backup_job_id, run_id: runId, restore_point_id: point.id, quiesced: point.quiesced, created_at: point.created_at }
      }
    : undefined

  /**
   * virt-v2v-in-place over the job's volumes (snapshot first, rolled back on failure): Windows
   * guests before the start (virtio-win ISO required), Linux guests without a usable controller
   * driver from the Starting state (no ISO). libguestfs runs on TCG where the domains do.
   */
  const convertInPlace = async (id: string, manifest: VmManifest, disks: V2vVolume[], needsVirtioWin: boolean, sig?: AbortSignal): Promise<void> => {
    const preparer = new V2vPreparer({
      virtioWinIso: config.v2v.virtioWinIso,
      binary: config.v2v.binary,
      env: config.domain.type === 'qemu' ? { LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' } : {},
    })
    logger.info({ disks: disks.map((d) => d.label), needsVirtioWin }, 'V2V: converting the guest in place')
    const result = await preparer.run(disks, manifest, {
      signal: sig,
      snapshot: sink.snapshot(id),
      needsVirtioWin,
      onProgress: (p) => p.message && logger.info({ v2v: p.message }, 'V2V'),
    })
    for (const w of result.warnings) logger.warn({ v2v: w }, 'V2V warning')
  }

  // What another job of this host still has to write on its reservation: less what its volumes hold.
  const remainingOf = async (other: string, reserved: number): Promise<number> => {
    if (sink instanceof FileSink) return reserved - allocatedBelow(sink.jobDir(other))
    if (sink instanceof ZvolSink) {
      const used = await run('zfs', ['list', '-H', '-p', '-o', 'used', sink.jobDataset(other)])
      return reserved - (used.code === 0 && /^\d+$/.test(used.stdout.trim()) ? Number(used.stdout.trim()) : 0)
    }
    return reserved
  }

  return {
    jobId,
    jobs: store.jobs,
    watermarks: store.watermarks,
    now,
    signal,
    sink,
    keepOnCancel: config.keepOnCancel,
    spaceWait:
      config.copy.spaceWaitSeconds > 0 ? { seconds: config.copy.spaceWaitSeconds, spaceOf, storeFile: paths.dbFile, storeNeeds: STORE_NEEDS_BYTES } : undefined,
    readRetry: { seconds: config.copy.readRetrySeconds },
    redact: (message: string) => redactHostPaths(message, paths.importRoot, config.dataDir),
    reserveDomainName: async (job, manifest) => reserveName(job, manifest, new Set(await domains)),
    delta: config.delta,
    cutover: { shutdownEstimateSeconds: config.guestShutdownTimeoutSeconds, startEstimateSeconds: config.domain.bootGraceSeconds },
    takeRestorePoint,
    async preflight(job, manifest) {
      await checkBeforeCopy({
        disks: manifest.disks,
        file: sink instanceof FileSink ? { volumesDir: paths.volumes, jobDir: sink.jobDir(jobId) } : undefined,
        zvol: sink instanceof ZvolSink ? { pool: pool ?? config.zfsPool, jobDataset: sink.jobDataset(jobId) } : undefined,
        qemu: await qemuUser,
        bridges: bridgesInUse(manifest, job.plan.networks, config.domain.defaultBridge),
        reserve: (key, bytes, check) => store.jobs.reserveSpace(jobId, key, bytes, remainingOf, check),
      })
    },
    prepare: (job, signal) =>
      prepareSource(job, {
        signal,
        store,
        sealer,
        paths: { importRoot: paths.importRoot, uploadsDir: paths.uploads },
        now,
        guestShutdownTimeoutSeconds: config.guestShutdownTimeoutSeconds,
        stagingDir: path.join(config.dataDir, 'tmp'),
        fullImport: {
          workDir: path.join(config.dataDir, 'tmp'),
          binary: config.v2v.fullImportBinary,
          // Without the ISO virt-v2v still converts Linux guests; Windows ones get no virtio drivers.
          virtioWinIso: existsSync(config.v2v.virtioWinIso) ? config.v2v.virtioWinIso : undefined,
          // libguestfs' appliance follows the host: TCG where the domains run under TCG.
          env: config.domain.type === 'qemu' ? { LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' } : {},
        },
      }),
    copyDisk: (reader, volume, opts) =>
      copyDisk(reader, volume, { ...opts, label: volume.path, flushEveryBytes: config.copy.flushEveryBytes, maxBytesPerSecond: config.copy.maxBytesPerSecond }),
    async v2v(job, manifest, volumes, sig) {
      for (const v of volumes) await v.flush()
      await convertInPlace(
        job.id,
        manifest,
        manifest.disks.map((d, i) => ({ label: d.label, path: volumes[i]!.path })),
        true,
        sig,
      )
    },
    async start(job, manifest, volumes, sig) {
      for (const v of volumes) await v.flush()
      return startDomain(
        job,
        manifest,
        manifest.disks.map((d, i) => ({ label: d.label, path: volumes[i]!.path })),
        sig,
      )
    },
    liveImport: (job, source, volumes, hooks) =>
      runJobLiveImport({
        job,
        source,
        volumes,
        hooks,
        virsh,
        dataDir: config.dataDir,
        qemuUser,
        startDomain,
        signal,
        logger,
        bytesPerSecond: config.copy.maxBytesPerSecond,
      }),
  }

  /** Defines and starts the job's domain on `domainVolumes` with the boot check (Starting, or a live import's overlays). */
  async function startDomain(job: Job, manifest: VmManifest, domainVolumes: DomainVolume[], sig: AbortSignal): Promise<StartOutcome> {
    {
      const logDir = paths.logs
      await mkdir(logDir, { recursive: true, mode: 0o750 })
      const result = await defineAndStart({
        virsh,
        manifest,
        plan: {
          name: job.domain ?? job.plan.name,
          guest_os: job.plan.guest_os,
          firmware: job.plan.firmware,
          networks: job.plan.networks,
          start: job.plan.start,
        },
        volumes: domainVolumes,
        domainType: config.domain.type,
        defaultBridge: config.domain.defaultBridge,
        serialLogPath: path.join(logDir, `${jobId}.serial.log`),
        // A Linux guest with no driver for any controller qemu emulates is converted in place.
        convertGuest: (paths, convertSignal) =>
          convertInPlace(
            job.id,
            manifest,
            paths.map((p, i) => ({ label: manifest.disks[i]?.label ?? `disk${i}`, path: p })),
            false,
            convertSignal,
          ),
        bootCheck: {
          graceSeconds: config.domain.bootGraceSeconds,
          timeoutSeconds: config.domain.bootTimeoutSeconds,
          expectSerial: config.domain.bootSerialPattern ? new RegExp(config.domain.bootSerialPattern) : undefined,
        },
        // A reserved name libvirt has by now (a job that ended defined it after this one's list):
        // reserved again against that list and every active job's reservation.
        rename: (taken) => reserveName(job, manifest, taken, true),
        signal: sig,
      }).catch((e: unknown) => {
        throw e instanceof MigError ? e : new MigError('E_MIG_DOMAIN_DEFINE_FAILED', (e as Error).message)
      })
      logger.info({ domain: result.name, started: result.started, hardware: result.hardware, inspection_s: result.inspection?.seconds }, 'domain defined')
      return { domain: result.name, hardware: result.hardware, notice: result.notice, networkNotice: result.networkNotice }
    }
  }
}
