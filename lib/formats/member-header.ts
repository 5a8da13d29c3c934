/**
 * Header checks of a disk file inside an OVA or OVF package at inspect, so that inspect tells
 * the truth about the disks inside archives: a member whose header is damaged (for example by a
 * text-mode transfer, which rewrites bytes >= 0x80) is refused at inspect with
 * `E_MIG_MALFORMED_ARCHIVE` naming the member and the field, instead of failing the job's copy.
 *
 * Sources: VMDK 5.0 "Hosted Sparse Extent Header" (grain size a power of two, at least 8
 * sectors; grain directory, redundant grain directory and overhead inside the extent; newline
 * check bytes), qemu `docs/interop/qcow2.txt` (magic, version 2 or 3, cluster_bits 9..21, L1
 * table and refcount table inside the file), and the full VHD (footer, dynamic header, BAT) and
 * VHDX (headers, region table, metadata) checks of `vhd.ts` / `vhdx.ts`, run inside the member.
 */
import { type ErrorCode, MigError } from '../errors.ts'
import type { DiskFormat } from '../manifest.ts'
import { QCOW2_HEADER, QCOW_MAGIC } from './qcow2.ts'
import { readVhdInfo } from './vhd.ts'
import { readVhdxInfo } from './vhdx.ts'
import { KDMV_HEADER, VMDK_SPARSE_MAGIC } from './vmdk/hosted-sparse.ts'
import { readVmdkSparseHeader } from './vmdk/inspect.ts'

const SECTOR = 512

function bad(member: string, field: string, why: string): MigError {
  return new MigError('E_MIG_MALFORMED_ARCHIVE', `${member}: ${field}: ${why}`, { details: { member, field } })
}

/**
 * A format reader's fault about `file` (the archive it opened) restated about `member`: the file
 * prefix of the message replaced by the member's name and `what`, `details.field` `header`, the
 * code kept unless `code` is given. Read failures and foreign errors are returned unchanged.
 */
function memberFault(e: unknown, file: string, member: string, what = '', code?: ErrorCode): unknown {
  if (!(e instanceof MigError) || e.code === 'E_MIG_DISK_READ_FAILED') return e
  const reason = e.message.startsWith(`${file}: `) ? e.message.slice(file.length + 2) : e.message.replace(/^.*?: /, '')
  return new MigError(code ?? e.code, `${member}: ${what}${reason}`, { details: { member, field: 'header' } })
}

/**
 * Checks the header of the disk image stored at bytes `offset`..`offset + length` of `file`
 * (`member`: its name for messages), for formats `vmdk` (sparse extents; a text descriptor is not
 * checked here), `qcow2`, `vhdx` and `vpc` (VHD); other formats pass. A VHD/VHDX member whose
 * layout is not one qemu reads keeps `E_MIG_UNSUPPORTED_FORMAT`. `head` holds the first bytes of the member.
 * Throws `E_MIG_MALFORMED_ARCHIVE` (`details.member`, `details.field`).
 */
export async function checkMemberHeader(format: DiskFormat, file: string, offset: number, length: number, head: Buffer, member: string): Promise<void> {
  if (format === 'vmdk' && head.length >= 4 && head.toString('latin1', KDMV_HEADER.magic, KDMV_HEADER.magic + 4) === VMDK_SPARSE_MAGIC) {
    let h
    try {
      h = await readVmdkSparseHeader(file, offset, length)
    } catch (e) {
      throw memberFault(e, file, member, 'sparse extent header: ', 'E_MIG_MALFORMED_ARCHIVE')
    }
    const sectors = Math.floor(length / SECTOR)
    if (h.grainSize < 8) throw bad(member, 'grainSize', `${h.grainSize} sectors, less than the 8 a sparse extent needs`)
    if (h.truncated) throw bad(member, 'gdOffset', `the grain directory or the stream footer lies past the member's end (${length} bytes)`)
    if (h.gdOffset !== null && h.gdOffset + Math.ceil((h.gdEntries * 4) / SECTOR) > sectors)
      throw bad(member, 'gdOffset', `grain directory at sector ${h.gdOffset} (${h.gdEntries} entries) is past the member's ${sectors} sectors`)
    if (h.redundantGrainTable && h.rgdOffset + Math.ceil((h.gdEntries * 4) / SECTOR) > sectors)
      throw bad(member, 'rgdOffset', `redundant grain directory at sector ${h.rgdOffset} is past the member's ${sectors} sectors`)
    if (h.overHead > sectors) throw bad(member, 'overHead', `${h.overHead} sectors, more than the member's ${sectors}`)
    return
  }
  if (format === 'vhdx' || format === 'vpc') {
    try {
      await (format === 'vhdx' ? readVhdxInfo : readVhdInfo)(file, { offset, length })
    } catch (e) {
      throw memberFault(e, file, member)
    }
    return
  }
  if (format === 'qcow2' && head.length >= 72) {
    const Q = QCOW2_HEADER
    if (head.readUInt32BE(Q.magic) !== QCOW_MAGIC) throw bad(member, 'magic', 'not QFI\\xfb')
    const version = head.readUInt32BE(Q.version)
    if (version !== 2 && version !== 3) throw bad(member, 'version', `${version} (2 or 3)`)
    const clusterBits = head.readUInt32BE(Q.cluster_bits)
    if (clusterBits < 9 || clusterBits > 21) throw bad(member, 'cluster_bits', `${clusterBits} out of 9..21`)
    const l1Size = head.readUInt32BE(Q.l1_size)
    const l1Offset = Number(head.readBigUInt64BE(Q.l1_table_offset))
    const refcountOffset = Number(head.readBigUInt64BE(Q.refcount_table_offset))
    if (!Number.isSafeInteger(l1Offset) || l1Offset + l1Size * 8 > length)
      throw bad(
        member,
        'l1_table_offset',
        `L1 table of ${l1Size} entries at byte ${head.readBigUInt64BE(Q.l1_table_offset)} is past the member's ${length} bytes`,
      )
    if (!Number.isSafeInteger(refcountOffset) || refcountOffset >= length)
      throw bad(member, 'refcount_table_offset', `byte ${head.readBigUInt64BE(Q.refcount_table_offset)} is past the member's ${length} bytes`)
  }
}
