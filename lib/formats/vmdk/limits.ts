/**
 * The one set of limits every VMDK reader of the project applies (the offline inspection in
 * `inspect.ts`, the snapshot-chain reader in `chain-reader.ts` that the `vim_api` adapter uses),
 * and the byte units they share. A limit is chosen so that no disk an administrator really has
 * reaches it, while hostile input (a crafted descriptor, a forged header) cannot make a reader
 * allocate, open or loop without bound:
 *
 * - {@link MAX_CAPACITY_SECTORS} 2^37 sectors = 64 TiB: above VMware's largest virtual disk
 *   (62 TB on VMFS 5/6, 8 TB hosted); every size computed from it stays a safe integer.
 * - {@link MAX_DESCRIPTOR_BYTES} 4 MiB: a descriptor of {@link MAX_EXTENTS} extent lines of about
 *   70 bytes is about 2.3 MiB; real descriptors are under 2 KiB.
 * - {@link MAX_EXTENTS} 32,768 extent lines: a 62 TiB `twoGbMaxExtentSparse`/`Flat` disk (the
 *   layout with the most extents VMware writes, 2 GiB each) has 31,744.
 * - {@link MAX_CHAIN_DEPTH} 64 parents: ESXi allows 32 snapshots in a chain (and Workstation
 *   about as many), so a real chain has at most 33 disks; each layer costs one descriptor read.
 * - {@link MAX_GRAIN_SECTORS} 2^21 sectors (1 GiB) and {@link MAX_GTES_PER_GT} 512: the bounds
 *   qemu's `block/vmdk.c` accepts for hosted sparse extents (VMware writes 128 and 512).
 * - {@link MAX_GD_ENTRIES} 4 Mi grain directory entries per extent (a 64 TiB seSparse disk needs
 *   exactly that; a 2 TiB vmfsSparse 1 Mi), and {@link MAX_GD_ENTRIES_PER_CHAIN} four times that
 *   for all extents of a chain together: the directories are held in memory (8 bytes an entry),
 *   so at most 128 MiB, whatever the number of extents.
 */

/** Bytes per VMDK sector. */
export const SECTOR = 512
/** Largest text descriptor (file or embedded) read, bytes. */
export const MAX_DESCRIPTOR_BYTES = 4 * 1024 * 1024
/** Largest capacity accepted from a header, an extent line or their sum, sectors (64 TiB). */
export const MAX_CAPACITY_SECTORS = 2 ** 37
/** Most extent lines accepted in one descriptor. */
export const MAX_EXTENTS = 32768
/** Most parents followed below a disk (`parentFileNameHint`). */
export const MAX_CHAIN_DEPTH = 64
/** Largest grain, sectors (hosted sparse `grainSize`, COWD granularity). */
export const MAX_GRAIN_SECTORS = 0x200000
/** Most entries in one hosted sparse grain table (`numGTEsPerGT`). */
export const MAX_GTES_PER_GT = 512
/** Most grain directory entries of one sparse extent read into memory. */
export const MAX_GD_ENTRIES = 4 * 1024 * 1024
/** Most grain directory entries of all sparse extents of one chain together. */
export const MAX_GD_ENTRIES_PER_CHAIN = 4 * MAX_GD_ENTRIES
/** Bytes of a stream-optimized grain marker: the grain's first sector (u64) and its compressed size (u32). */
export const GRAIN_MARKER_BYTES = 12
