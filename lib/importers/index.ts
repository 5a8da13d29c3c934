/**
 * The importer registry (spec 1.1 "Nine offline importers") and the inspect entry point behind
 * `POST /host-files/inspect` and `POST /uploads/:id/inspect`.
 */
import { stat } from 'node:fs/promises'
import { MigError } from '../errors.ts'
import { remoteInput, withInputScope } from '../hostpath.ts'
import { checkDestinationLimits } from '../limits.ts'
import type { ImporterKind } from '../kinds.ts'
import { VmManifest } from '../manifest.ts'
import type { Importer, InspectContext } from './types.ts'

/** Importer modules by kind, loaded on first use so start-up does not pay for all nine parsers. */
const LOADERS: Record<ImporterKind, () => Promise<{ importer: Importer }>> = {
  ova_archive: () => import('./ova-archive.ts'),
  ovf_folder: () => import('./ovf-folder.ts'),
  vmx_folder: () => import('./vmx-folder.ts'),
  vhdx: () => import('./vhdx.ts'),
  qcow2: () => import('./qcow2.ts'),
  vmdk: () => import('./vmdk.ts'),
  vmcx_export: () => import('./vmcx-export.ts'),
  vbox_folder: () => import('./vbox-folder.ts'),
  xva_archive: () => import('./xva-archive.ts'),
}

/** The importer of `kind`. */
export async function importerFor(kind: ImporterKind): Promise<Importer> {
  return (await LOADERS[kind]()).importer
}

/** What inspect returns (DESIGN.md: `{detected_kind, manifest}`). */
export interface InspectResult {
  detected_kind: ImporterKind
  manifest: VmManifest
}

/**
 * Detects the kind of `absPath` (already confined to the import root, or the name of a remote
 * input of the active scope) unless `kind` is given,
 * runs that importer's inspect, and checks the manifest against the schema.
 * Throws `E_MIG_NOT_FOUND` (no such path) and whatever the importer throws
 * (`E_MIG_MALFORMED_ARCHIVE`, `E_MIG_UNSUPPORTED_FORMAT`, `E_MIG_HOST_PATH_REJECTED`, ...).
 */
export async function inspectInput(absPath: string, ctx: InspectContext, kind?: ImporterKind): Promise<InspectResult> {
  // a remote input of the active scope (lib/remote/) was found when it was opened
  if (!remoteInput(absPath))
    try {
      await stat(absPath)
    } catch {
      throw new MigError('E_MIG_NOT_FOUND', `${absPath} does not exist`)
    }
  return withInputScope(ctx.importRoot, () => inspectPinned(absPath, ctx, kind))
}

async function inspectPinned(absPath: string, ctx: InspectContext, kind?: ImporterKind): Promise<InspectResult> {
  const detected = kind ?? (await (await import('./probe.ts')).detectKind(absPath, ctx))
  const manifest = await (await importerFor(detected)).inspect(absPath, ctx)
  const checked = VmManifest.safeParse(manifest)
  if (!checked.success) throw new MigError('E_MIG_INTERNAL', `${detected} importer produced an invalid manifest: ${checked.error.message}`)
  if (checked.data.disks.length === 0)
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${checked.data.name}: the source has no disks to migrate`, { details: { disks: 0 } })
  checkDestinationLimits(checked.data.name, { disks: checked.data.disks.length, nics: checked.data.nics.length })
  return { detected_kind: detected, manifest: checked.data }
}
