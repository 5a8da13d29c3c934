/** The boot-sector disks live in fixtures/bootdisk.ts (shared with the demo and benchmarks). */
export * from '../../fixtures/bootdisk.ts'
