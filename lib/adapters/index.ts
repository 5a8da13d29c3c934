/**
 * The adapter registry: the adapter for each live kind of spec 1.1.
 *
 * - `vim_api`: the native vSphere SOAP adapter (lib/adapters/vim/adapter.ts), cold and warm with
 *   changed block tracking;
 * - `libvirt_remote`: a remote libvirtd over SSH (lib/adapters/libvirt/adapter.ts), cold and warm
 *   with checkpoints and pull-mode backups;
 * - `wmi_api`, `pve_api`, `xen_api`, `prism_api`: the validating stubs of
 *   lib/adapters/stubs.ts (endpoint rules and a TCP probe; no control-plane client, no warm).
 */
import type { AdapterKind } from '../kinds.ts'
import { stubAdapter, type StubKind } from './stubs.ts'
import type { SourceAdapter } from './types.ts'
import { createVimAdapter } from './vim/adapter.ts'
import { createLibvirtAdapter } from './libvirt/adapter.ts'

let vim: SourceAdapter | null = null
let libvirt: SourceAdapter | null = null
const stubs = new Map<AdapterKind, SourceAdapter>()

/** The adapter of `kind` (one instance per kind and process). */
export function adapterFor(kind: AdapterKind): SourceAdapter {
  if (kind === 'vim_api') return (vim ??= createVimAdapter())
  if (kind === 'libvirt_remote') return (libvirt ??= createLibvirtAdapter())
  let s = stubs.get(kind)
  if (!s) stubs.set(kind, (s = stubAdapter(kind as StubKind)))
  return s
}
