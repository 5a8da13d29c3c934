/**
 * Resolves a job's plan into a prepared source for the orchestrator (spec 1.2 steps 1-3):
 * an offline input is confined to the import root (or is an upload), inspected with the plan's
 * importer kind, and read disk by disk; a live source is a logged-in control-plane connection.
 */
import { existsSync } from 'node:fs'
import { rm } from 'node:fs/promises'
import { join } from 'node:path'
import { MigError } from '../errors.ts'
import { InputScope, pinnedProcPath, resolveInRoot } from '../hostpath.ts'
import { statPath } from '../formats/io.ts'
import type { Job } from '../job.ts'
import { PASSTHROUGH_IMPORTERS, type ImporterKind } from '../kinds.ts'
import { inspectInput } from '../importers/index.ts'
import type { Sealer } from '../crypto/seal.ts'
import type { Store } from '../store/index.ts'
import { openSourceSession } from '../adapters/session.ts'
import { isLiveSession } from '../adapters/types.ts'
import { hashRange } from '../formats/tar.ts'
import { copyReadsStoredBytes, type ManifestDisk } from '../manifest.ts'
import { openDiskReader } from '../pipeline/readers/open.ts'
import { runV2vFullImport } from '../v2v/full-import.ts'
import type { PreparedSource } from './prepared-source.ts'
import { credentialLookup } from '../remote/credentials.ts'
import { addRemoteExport, openRemoteExport, type RemoteExport } from '../remote/folder.ts'
import type { OfflineUrlRef } from '../remote/ref.ts'
import type { JobPaths, JobSettings } from './settings.ts'

/** Where offline inputs live. */
export interface SourcePaths {
  importRoot: string
  uploadsDir: string
}

/**
 * The absolute input path of an offline plan, or for a remote input (`offline_url`) its URL and
 * reference; `E_MIG_HOST_PATH_REJECTED`, `E_MIG_UPLOAD_NOT_FOUND`.
 */
export async function offlineInputPath(
  job: Job,
  store: Store,
  paths: SourcePaths,
  now: Date,
): Promise<{ path: string; upload: boolean; remote?: OfflineUrlRef }> {
  const ref = job.plan.source_ref
  if (ref.kind === 'offline_host_path') return { path: resolveInRoot(paths.importRoot, ref.path), upload: false }
  if (ref.kind === 'offline_url') return { path: ref.url, upload: false, remote: ref }
  if (ref.kind === 'upload') {
    await store.uploads.get(ref.upload_id, now.toISOString())
    return { path: join(paths.uploadsDir, ref.upload_id), upload: true }
  }
  throw new MigError('E_MIG_INVALID_PLAN', 'an offline plan needs an offline_host_path or upload source_ref')
}

/**
 * The manifest (`.mf`) digest of a disk file too large to hash at inspect (`source.digest`), for
 * a disk whose file is not the disk's raw bytes as the copy reads them (streamOptimized VMDK,
 * qcow2, gzip-compressed files ...): the file (or tar member) is hashed whole, alongside the copy
 * (the orchestrator awaits it before the disk counts as copied). A raw file read in place has its
 * digest checked by the copy loop on the bytes it reads ({@link copyReadsStoredBytes}). Throws
 * `E_MIG_MALFORMED_ARCHIVE` on a mismatch, `E_MIG_DISK_READ_FAILED` when the file cannot be read,
 * `E_MIG_CANCELLED` when `signal` aborts.
 */
export async function verifyPackedDigest(disk: ManifestDisk, signal?: AbortSignal): Promise<void> {
  const d = disk.source.digest
  if (!d || copyReadsStoredBytes(disk)) return
  const { path, offset = 0 } = disk.source
  const length = disk.source.length ?? (await statPath(path)).size
  const got = await hashRange(path, offset, length, d.algorithm, signal)
  if (got !== d.hex.toLowerCase()) {
    const name = disk.source.member ?? path
    throw new MigError(
      'E_MIG_MALFORMED_ARCHIVE',
      `${name}: ${d.algorithm.toUpperCase()} digest mismatch with the manifest (.mf): expected ${d.hex.toLowerCase()}, the file has ${got}`,
    )
  }
}

/**
 * Records the version (`RemoteFile.identity`) of job `jobId`'s remote input at its first attempt;
 * a later attempt (a worker or server restarted, resuming from the durable watermarks) must see
 * the same version, else `E_MIG_DISK_READ_FAILED`: the disks copied so far are of the old one,
 * and going on would mix two versions.
 */
async function sameRemoteVersion(jobId: string, remote: { name: string; identity: string }, store: Store): Promise<void> {
  const first = await store.jobs.inputIdentity(jobId)
  if (first === null) return store.jobs.setInputIdentity(jobId, remote.identity)
  if (first !== remote.identity)
    throw new MigError(
      'E_MIG_DISK_READ_FAILED',
      `${remote.name}: the object changed on the server since the job's first attempt (${first}; now ${remote.identity}); the copy cannot resume on another version: submit the job again`,
      { details: { url: remote.name } },
    )
}

/**
 * Settings of the VMCX passthrough (`virt-v2v`): `workDir` for its run directory (needs about
 * 1 GiB free; default `<import root>/../tmp`), extra environment (`LIBGUESTFS_BACKEND_SETTINGS=
 * force_tcg` where KVM is not usable), the virtio-win ISO, the binary.
 */
export interface FullImportSettings {
  workDir?: string
  env?: Record<string, string>
  virtioWinIso?: string | null
  binary?: string
}

/**
 * Prepares the source of `job`. Offline: inspects the input (the manifest is taken afresh, so an
 * input changed since submission is noticed) and opens readers per disk; a remote input
 * (`offline_url`, `lib/remote/`) is opened first and read in place with ranged requests. Passthrough importers
 * (`vmcx_export`) get the virt-v2v full import (`lib/v2v/full-import.ts`), which writes straight
 * into the destination volumes; gzip-compressed or chunked OVF files are staged under
 * `<stagingDir>/staging/<job id>` (default `<import root>/../tmp`). Live: logs in to the source and
 * inspects the VM.
 */
export async function prepareSource(
  job: Job,
  deps: {
    store: Store
    sealer: Sealer
    paths: SourcePaths
    now(): Date
    fullImport?: FullImportSettings
    guestShutdownTimeoutSeconds?: number
    stagingDir?: string
    signal?: AbortSignal
  },
): Promise<PreparedSource> {
  const source = job.plan.source
  if ('Offline' in source) {
    const kind = source.Offline as ImporterKind
    const input = await offlineInputPath(job, deps.store, deps.paths, deps.now())
    // Every input file is opened once, checked, and read through that descriptor for the whole
    // job (inspect, digests, readers, qemu-nbd): a name swapped after the check is never reopened.
    const scope = new InputScope(deps.paths.importRoot)
    let manifest: PreparedSource['manifest']
    let remote: RemoteExport | null = null
    try {
      // a remote input is opened once (size and identity taken) and read by its URL through the scope
      if (input.remote) {
        // (a folder export: its descriptor and the companions it names, lib/remote/folder.ts)
        remote = await openRemoteExport(input.remote, { credentials: credentialLookup(deps.store.remoteCredentials, deps.sealer) })
        addRemoteExport(scope, remote)
        await sameRemoteVersion(job.id, remote, deps.store)
      }
      manifest = (await scope.run(() => inspectInput(input.path, { importRoot: deps.paths.importRoot, allowUploads: input.upload }, kind))).manifest
      // the copy reads clusters and grains in file order: one request per window from here on
      for (const f of remote?.files ?? []) f.readAhead?.(true)
    } catch (e) {
      scope.close()
      throw e
    }
    if (PASSTHROUGH_IMPORTERS.includes(kind)) {
      const fi = deps.fullImport ?? {}
      return {
        strategy: 'passthrough',
        manifest,
        close: async () => scope.close(),
        runFullImport: async (volumes, onBytes, signal) => {
          await runV2vFullImport({
            manifest,
            signal,
            onProgress: onBytes,
            volumes: volumes.map((v, i) => ({ label: manifest.disks[i]!.label, path: v.path })),
            workDir: join(fi.workDir ?? join(deps.paths.importRoot, '..', 'tmp'), 'vmcx', job.id),
            env: fi.env,
            virtioWinIso: fi.virtioWinIso,
            binary: fi.binary,
            // virt-v2v (and the qemu-nbd it starts) opens the disks this worker pinned at inspect.
            sourcePath: (file) => scope.run(() => pinnedProcPath(file)),
          })
        },
      }
    }
    // staged files a crashed attempt of this job left behind
    const stagingDir = join(deps.stagingDir ?? join(deps.paths.importRoot, '..', 'tmp'), 'staging', job.id)
    await rm(stagingDir, { recursive: true, force: true })
    return {
      strategy: 'offline',
      manifest,
      openReader: (disk) => scope.run(() => openDiskReader(disk, { stagingDir, signal: deps.signal })),
      verifyDigest: (disk, signal) => scope.run(() => verifyPackedDigest(disk, signal)),
      assertUnchanged: () => scope.assertUnchanged(),
      close: async () => scope.close(),
    }
  }
  const ref = job.plan.source_ref
  if (ref.kind !== 'live_vm') throw new MigError('E_MIG_INVALID_PLAN', 'a live plan needs a live_vm source_ref')
  const session = await openSourceSession(deps.store.sources, deps.sealer, ref.source_id, {
    guestShutdownTimeoutMs: deps.guestShutdownTimeoutSeconds === undefined ? undefined : deps.guestShutdownTimeoutSeconds * 1000,
  })
  if (!isLiveSession(session)) {
    await session.close()
    throw new MigError('E_MIG_SOURCE_UNREACHABLE', `${source.Live}: this adapter has no data plane`)
  }
  const manifest = await session.inspect(ref.vm_id)
  return { strategy: 'live', manifest, session, vmId: ref.vm_id, close: () => session.close() }
}

/** What the source preparation of a job needs of the worker: the settings, the store, the sealing key, the clock. */
export interface SourcePreparationInput {
  settings: Pick<JobSettings, 'dataDir' | 'guestShutdownTimeoutSeconds' | 'v2v' | 'domain'>
  paths: Pick<JobPaths, 'importRoot' | 'uploads'>
  store: Store
  sealer: Sealer
  now(): Date
}

/**
 * The orchestrator's `prepare` step: {@link prepareSource} with the settings' staging and work
 * directory (`<data dir>/tmp`), guest shutdown timeout and VMCX passthrough (`virt-v2v`; the
 * virtio-win ISO when it exists: without it virt-v2v still converts Linux guests, Windows ones
 * get no virtio drivers; libguestfs' appliance on TCG where the domains run under TCG).
 */
export function sourcePreparation(input: SourcePreparationInput): (job: Job, signal: AbortSignal) => Promise<PreparedSource> {
  const { settings, paths, store, sealer, now } = input
  const tmp = join(settings.dataDir, 'tmp')
  return (job, signal) =>
    prepareSource(job, {
      signal,
      store,
      sealer,
      paths: { importRoot: paths.importRoot, uploadsDir: paths.uploads },
      now,
      guestShutdownTimeoutSeconds: settings.guestShutdownTimeoutSeconds,
      stagingDir: tmp,
      fullImport: {
        workDir: tmp,
        binary: settings.v2v.fullImportBinary,
        virtioWinIso: existsSync(settings.v2v.virtioWinIso) ? settings.v2v.virtioWinIso : undefined,
        env: settings.domain.type === 'qemu' ? { LIBGUESTFS_BACKEND_SETTINGS: 'force_tcg' } : {},
      },
    })
}
