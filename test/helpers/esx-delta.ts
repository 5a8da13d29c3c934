/**
 * Test-side writer of ESXi snapshot delta disks, which no tool on this machine makes (qemu-img
 * reads vmfsSparse and seSparse but cannot create them): a vmfsSparse ("COWD") or seSparse extent
 * holding given grains, and the delta descriptor naming it and its parent. The layout follows
 * qemu's `block/vmdk.c` reader; tests check every file it writes against `qemu-img convert`, an
 * independent reader, before trusting it.
 */
import { execFileSync } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import * as path from 'node:path'

const SECTOR = 512

/** A grain of a delta: its bytes (exactly one grain), or `'zero'` (seSparse only: a zeroed grain). */
export type DeltaGrain = Buffer | 'zero'

/**
 * Writes a vmfsSparse extent: 2 KiB header (magic `COWD`, version 1, capacity and granularity in
 * sectors, grain directory at sector 4), the directory, one 4096-entry table per touched span,
 * then the grains. `grains` maps grain index -> bytes (`grainSectors` x 512 bytes each).
 */
export function writeCowd(file: string, capacityBytes: number, grainSectors: number, grains: Map<number, DeltaGrain>): void {
  const grainBytes = grainSectors * SECTOR
  const span = 4096 * grainBytes
  const gdEntries = Math.ceil(capacityBytes / span)
  const gdSectors = Math.ceil((gdEntries * 4) / SECTOR)
  const tables = [...new Set([...grains.keys()].map((g) => Math.floor((g * grainBytes) / span)))].sort((a, b) => a - b)
  const tablesAt = 4 + gdSectors
  const grainsAt = tablesAt + tables.length * 32
  const header = Buffer.alloc(2048)
  header.write('COWD', 0, 'latin1')
  header.writeUInt32LE(1, 4)
  header.writeUInt32LE(3, 8)
  header.writeUInt32LE(capacityBytes / SECTOR, 12)
  header.writeUInt32LE(grainSectors, 16)
  header.writeUInt32LE(4, 20)
  header.writeUInt32LE(gdEntries, 24)
  header.writeUInt32LE(grainsAt + grains.size * grainSectors, 28)
  const gd = Buffer.alloc(gdSectors * SECTOR)
  const gts = Buffer.alloc(tables.length * 32 * SECTOR)
  for (const [i, t] of tables.entries()) gd.writeUInt32LE(tablesAt + i * 32, t * 4)
  const data: Buffer[] = []
  for (const [g, bytes] of [...grains].sort((a, b) => a[0] - b[0])) {
    if (bytes === 'zero' || bytes.length !== grainBytes) throw new Error('vmfsSparse grains are whole grains of data')
    const t = tables.indexOf(Math.floor((g * grainBytes) / span))
    gts.writeUInt32LE(grainsAt + data.length * grainSectors, t * 16384 + (g % 4096) * 4)
    data.push(bytes)
  }
  writeFileSync(file, Buffer.concat([header, gd, gts, ...data]))
}

/**
 * Writes a seSparse extent: const header (magic `0xcafebabe`, version `0x200000001`, 4 KiB
 * grains, 64-sector tables), volatile header (magic `0xcafecafe`, clean journal unless
 * `dirty`), grain directory, tables, grains. `grains` maps 4 KiB grain index -> bytes or `'zero'`.
 */
export function writeSeSparse(file: string, capacityBytes: number, grains: Map<number, DeltaGrain>, opts: { dirty?: boolean } = {}): void {
  const grainBytes = 4096
  const span = 4096 * grainBytes
  const gdEntries = Math.ceil(capacityBytes / span)
  const gdSectors = Math.ceil((gdEntries * 8) / SECTOR)
  const tables = [...new Set([...grains.keys()].map((g) => Math.floor((g * grainBytes) / span)))].sort((a, b) => a - b)
  const gdAt = 2
  const tablesAt = gdAt + gdSectors
  const grainsAt = tablesAt + Math.max(1, tables.length) * 64
  const head = Buffer.alloc(SECTOR)
  const fields: [number, number][] = [
    [0, 0xcafebabe],
    [1, 0x200000001],
    [2, capacityBytes / SECTOR],
    [3, 8],
    [4, 64],
    [10, 1],
    [11, 1],
    [16, gdAt],
    [17, gdSectors],
    [18, tablesAt],
    [19, Math.max(1, tables.length) * 64],
    [24, grainsAt],
    [25, grains.size * 8],
  ]
  for (const [i, v] of fields) head.writeBigUInt64LE(BigInt(v), i * 8)
  const vol = Buffer.alloc(SECTOR)
  vol.writeBigUInt64LE(0xcafecafen, 0)
  vol.writeBigUInt64LE(opts.dirty ? 1n : 0n, 24)
  const gd = Buffer.alloc(gdSectors * SECTOR)
  for (const [i, t] of tables.entries()) gd.writeBigUInt64LE(0x1000000000000000n | BigInt(i), t * 8)
  const gts = Buffer.alloc(Math.max(1, tables.length) * 64 * SECTOR)
  const data: Buffer[] = []
  for (const [g, bytes] of [...grains].sort((a, b) => a[0] - b[0])) {
    const at = tables.indexOf(Math.floor((g * grainBytes) / span)) * 32768 + (g % 4096) * 8
    if (bytes === 'zero') {
      gts.writeBigUInt64LE(0x2000000000000000n, at)
      continue
    }
    if (bytes.length !== grainBytes) throw new Error('seSparse grains are 4 KiB')
    const c = BigInt(data.length)
    gts.writeBigUInt64LE(0x3000000000000000n | ((c & 0xfffn) << 48n) | (c >> 12n), at)
    data.push(bytes)
  }
  const body = Buffer.concat([head, vol, gd, gts])
  const pad = Buffer.alloc(grainsAt * SECTOR - body.length)
  writeFileSync(file, Buffer.concat([body, pad, ...data]))
}

/**
 * Makes the base disk of a chain in `dir`: `vm.vmdk` + `vm-flat.vmdk` (monolithicFlat, by
 * qemu-img) holding the raw image `raw`. Returns the base's CID, for its first delta's parentCID.
 */
export function makeFlatBase(dir: string, raw: string): string {
  execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, path.join(dir, 'vm.vmdk')])
  return /^CID=([0-9a-f]+)/m.exec(readFileSync(path.join(dir, 'vm.vmdk'), 'latin1'))![1]!
}

/** The descriptor of a delta disk: `createType` `vmfsSparse` or `seSparse`, one extent, its parent's CID and name. */
export function deltaDescriptor(o: {
  createType: 'vmfsSparse' | 'seSparse'
  extent: string
  capacityBytes: number
  cid: string
  parentCid: string
  parentHint: string
}): string {
  const type = o.createType === 'seSparse' ? 'SESPARSE' : 'VMFSSPARSE'
  return [
    '# Disk DescriptorFile',
    'version=1',
    'encoding="UTF-8"',
    `CID=${o.cid}`,
    `parentCID=${o.parentCid}`,
    `createType="${o.createType}"`,
    `parentFileNameHint="${o.parentHint}"`,
    '',
    '# Extent description',
    `RW ${o.capacityBytes / SECTOR} ${type} "${o.extent}"`,
    '',
    '# The Disk Data Base',
    '#DDB',
    'ddb.virtualHWVersion = "14"',
    '',
  ].join('\n')
}
