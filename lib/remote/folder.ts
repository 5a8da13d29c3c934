/**
 * Remote folder exports: an `offline_url` naming an OVF descriptor (`.ovf`) or a VMX file
 * (`.vmx`) on an HTTP(S) server, in an S3 bucket or on an SMB share. The descriptor is opened and
 * read, the companion files it names (an OVF's `References/File` hrefs, its `<name>.mf` and
 * `<name>.cert`; a VMX's disk `fileName`s) are opened as sibling URLs of the same folder through
 * the same transport and credential (each once, its identity taken at open and checked on every
 * read), and all are registered in the job's input scope with the folder
 * (`InputScope.addRemoteFolder`), so the folder importers resolve them as they resolve files
 * beside a local descriptor. Names from the descriptor are hostile input: `remoteSibling`
 * (`lib/hostpath.ts`) rejects `..`, absolute names, other hosts (`E_MIG_HOST_PATH_REJECTED`).
 *
 * Not read remotely: chunked OVF files (`ovf:chunkSize`), VMDK descriptors whose extents are
 * other files (twoGbMaxExtent*, monolithicFlat: qemu reads those), VirtualBox `.vbox` folders.
 */
import * as path from 'node:path'
import type { RemoteFile } from '../contracts/remote-file.ts'
import { MigError } from '../errors.ts'
import { InputScope, remoteSibling } from '../hostpath.ts'
import { inspectInput, type InspectResult } from '../importers/index.ts'
import type { ImporterKind } from '../kinds.ts'
import { decodeDescriptor, MAX_DESCRIPTOR_BYTES, parseOvfEnvelope } from '../formats/ovf.ts'
import { MAX_VMX_BYTES, parseVmx, vmxHardware } from '../formats/vmx.ts'
import { openRemoteInput, type RemoteOpenOptions } from './open.ts'
import type { OfflineUrlRef } from './ref.ts'

/** Whether `url` names a folder export's descriptor (`.ovf` or `.vmx`). */
export function isFolderDescriptorUrl(url: string): boolean {
  return /\.(ovf|vmx)$/i.test(new URL(url).pathname)
}

/** What {@link openRemoteExport} opened: the input's name, every file, and one identity for all. */
export interface RemoteExport {
  /** The name the importer is given: the URL of the object or descriptor. */
  name: string
  /** The descriptor's folder URL, for a folder export (else null). */
  folder: string | null
  files: RemoteFile[]
  /** The identities of every file, in order (`<url>: <identity>; ...`): equal for the same export. */
  identity: string
}

/** Reads the whole of `f` (at most `limit` bytes; larger: `E_MIG_MALFORMED_ARCHIVE`). */
async function readWhole(f: RemoteFile, limit: number): Promise<Buffer> {
  if (f.size > limit) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${f.name}: descriptor is ${f.size} bytes, larger than the ${limit}-byte limit`)
  const b = Buffer.alloc(f.size)
  let got = 0
  while (got < b.length) {
    const n = await f.read(b.subarray(got), got)
    if (n === 0) break
    got += n
  }
  return b.subarray(0, got)
}

/** The companion names of a descriptor: required (every File, every disk) and optional ones. */
function companionsOf(url: string, bytes: Buffer): { required: string[]; optional: string[] } {
  const label = decodeURIComponent(path.posix.basename(new URL(url).pathname))
  if (/\.ovf$/i.test(label)) {
    const env = parseOvfEnvelope(decodeDescriptor(bytes), label)
    const chunked = env.files.find((f) => f.chunkSize !== null)
    if (chunked) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${url}: File ${chunked.href} is chunked (ovf:chunkSize); copy the export into the import root`)
    const base = label.replace(/\.ovf$/i, '')
    return { required: [...new Set(env.files.map((f) => f.href))], optional: [`${base}.mf`, `${base}.cert`] }
  }
  const vmx = parseVmx(bytes, label)
  return { required: [...new Set(vmxHardware(vmx).disks.map((d) => d.fileName))], optional: [] }
}

/**
 * Opens the remote input `ref`: the object itself, or for a `.ovf`/`.vmx` URL the descriptor and
 * its companions. Throws what `openRemoteInput` throws (a required companion missing:
 * `E_MIG_NOT_FOUND` naming its URL), `E_MIG_HOST_PATH_REJECTED` (a hostile companion name),
 * `E_MIG_MALFORMED_ARCHIVE` (a descriptor that does not parse), `E_MIG_UNSUPPORTED_FORMAT`
 * (chunked OVF files). Every file opened is closed when it throws.
 */
export async function openRemoteExport(ref: OfflineUrlRef, opts: RemoteOpenOptions = {}): Promise<RemoteExport> {
  const main = await openRemoteInput(ref, opts)
  if (!isFolderDescriptorUrl(ref.url)) return { name: main.name, folder: null, files: [main], identity: main.identity }
  const files: RemoteFile[] = [main]
  try {
    const bytes = await readWhole(main, Math.max(MAX_DESCRIPTOR_BYTES, MAX_VMX_BYTES))
    const folder = main.name.slice(0, main.name.lastIndexOf('/'))
    const { required, optional } = companionsOf(ref.url, bytes)
    for (const [names, needed] of [
      [required, true],
      [optional, false],
    ] as const)
      for (const rel of names) {
        const url = remoteSibling(folder, rel)
        if (files.some((f) => f.name === url)) continue
        try {
          files.push(await openRemoteInput({ ...ref, url }, opts))
        } catch (e) {
          if (!needed && e instanceof MigError && e.code === 'E_MIG_NOT_FOUND') continue
          throw e
        }
      }
    return { name: main.name, folder, files, identity: files.map((f) => `${f.name}: ${f.identity}`).join('; ') }
  } catch (e) {
    for (const f of files) f.close()
    throw e
  }
}

/** Registers what {@link openRemoteExport} opened in `scope`. */
export function addRemoteExport(scope: InputScope, x: RemoteExport): void {
  for (const f of x.files) scope.addRemote(f)
  if (x.folder) scope.addRemoteFolder(x.folder)
}

/**
 * Inspects the remote input `ref` without copying (the `POST /remote-files/inspect` endpoint):
 * headers, descriptors and tables are read with ranged requests, the object is closed after. A
 * `.ovf`/`.vmx` URL is a folder export: its companions are opened beside it (`lib/remote/folder.ts`).
 * `kind` skips detection. Throws what {@link openRemoteInput} and `inspectInput` throw.
 */
export async function inspectRemote(
  ref: OfflineUrlRef,
  importRoot: string,
  kind: ImporterKind | undefined,
  opts: RemoteOpenOptions = {},
): Promise<InspectResult> {
  const scope = new InputScope(importRoot)
  try {
    const remote = await openRemoteExport(ref, opts)
    addRemoteExport(scope, remote)
    return await scope.run(() => inspectInput(remote.name, { importRoot }, kind))
  } finally {
    scope.close()
  }
}
