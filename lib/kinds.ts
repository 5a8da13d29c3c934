/**
 * Source kinds, with their wire spellings (spec 1.1 names, DESIGN.md section 3 spellings).
 */

/** Live control-plane adapter kinds (spec 1.1). `vim_api` is the only real one in v0.1. */
export const ADAPTER_KINDS = ['vim_api', 'wmi_api', 'pve_api', 'libvirt_remote', 'xen_api', 'prism_api'] as const
export type AdapterKind = (typeof ADAPTER_KINDS)[number]

/** Offline importer kinds (spec 1.1). `vmcx_export` is a passthrough to virt-v2v. */
export const IMPORTER_KINDS = ['ova_archive', 'ovf_folder', 'vmx_folder', 'vhdx', 'qcow2', 'vmdk', 'vmcx_export', 'vbox_folder', 'xva_archive'] as const
export type ImporterKind = (typeof IMPORTER_KINDS)[number]

/** Importers whose data copy is a single `run_full_import` instead of the `read_disk` loop (spec 1.2). */
export const PASSTHROUGH_IMPORTERS: readonly ImporterKind[] = ['vmcx_export']
