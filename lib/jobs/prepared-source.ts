/**
 * What the source side of a job provides once its plan is resolved (`PreparedSource`): made by
 * lib/jobs/prepare.ts, consumed by the orchestrator and its copy passes. A type of its own so
 * that the producer and the consumers both import it from here, never from each other.
 */
import type { LiveSession } from '../adapters/types.ts'
import type { DiskReader } from '../contracts/disk-reader.ts'
import type { ManifestDisk, VmManifest } from '../manifest.ts'
import type { SinkVolume } from '../sink/types.ts'

/** What the source side provides once the plan is resolved. */
export type PreparedSource =
  | {
      strategy: 'offline'
      manifest: VmManifest
      openReader(disk: ManifestDisk): Promise<DiskReader>
      /**
       * Checks the `.mf` digest of the disk's packed file (a file that is not the disk's raw bytes:
       * streamOptimized VMDK, qcow2 ...); run while the disk copies, awaited before the disk is
       * declared copied. Throws `E_MIG_MALFORMED_ARCHIVE` on a mismatch, `E_MIG_CANCELLED` when
       * `signal` aborts.
       */
      verifyDigest?(disk: ManifestDisk, signal: AbortSignal): Promise<void>
      /**
       * Throws `E_MIG_DISK_READ_FAILED` when an input file was written since it was opened
       * (lib/hostpath.ts `InputScope.assertUnchanged`); called after each disk's copy, before the
       * disk counts as copied.
       */
      assertUnchanged?(): void
      close(): Promise<void>
    }
  | {
      strategy: 'passthrough'
      manifest: VmManifest
      runFullImport(volumes: SinkVolume[], onBytes: (label: string, bytesDone: number) => void, signal: AbortSignal): Promise<void>
      close(): Promise<void>
    }
  | { strategy: 'live'; manifest: VmManifest; session: LiveSession; vmId: string; close(): Promise<void> }
