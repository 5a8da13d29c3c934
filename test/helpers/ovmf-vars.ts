/**
 * An OVMF variable store (`OVMF_VARS*.fd`) holding a UEFI boot entry, for the source domains of
 * the tests: what `virt-fw-vars --append-boot-filepath` writes (python3-virt-firmware, which
 * Debian 12 does not package; nor is there an npm package for the edk2 store).
 *
 * Format (edk2 MdeModulePkg `VariableFormat.h`, `AuthenticatedVariableFormat.h`; UEFI 2.10
 * sections 3.1.3 "Load Options" and 10.3 "Device Path Nodes"): the firmware volume header
 * (`HeaderLength` at offset 0x30), then the variable store header (28 bytes: the authenticated
 * variable GUID, size, format 0x5A, state 0xFE), then the variables, each 4-byte aligned: a 60-byte
 * authenticated header (StartId 0x55AA, State 0x3F = added, Attributes, MonotonicCount,
 * TimeStamp, PubKeyIndex, NameSize, DataSize, VendorGuid), the UTF-16LE name with its NUL, the
 * data. Free space is 0xFF. A variable replaced is marked deleted (State & ~0x02).
 */
import { readFileSync, writeFileSync } from 'node:fs'
import { guidBytes } from './guid.ts'

const EFI_GLOBAL_VARIABLE = '8be4df61-93ca-11d2-aa0d-00e098032b8c'
const NV_BS_RT = 0x7
const HEADER = 60

const utf16z = (s: string) => Buffer.from(`${s}\0`, 'utf16le')

/** An `EFI_LOAD_OPTION` (active) booting the short-form file path `file` (`\EFI\debian\grubx64.efi`). */
export function loadOption(description: string, file: string): Buffer {
  const pathStr = utf16z(file)
  const fileNode = Buffer.alloc(4)
  fileNode.writeUInt8(4, 0) // media device path
  fileNode.writeUInt8(4, 1) // file path
  fileNode.writeUInt16LE(4 + pathStr.length, 2)
  const end = Buffer.from([0x7f, 0xff, 4, 0])
  const devicePath = Buffer.concat([fileNode, pathStr, end])
  const head = Buffer.alloc(6)
  head.writeUInt32LE(1, 0) // LOAD_OPTION_ACTIVE
  head.writeUInt16LE(devicePath.length, 4)
  return Buffer.concat([head, utf16z(description), devicePath])
}

/** The store's variables: name, vendor GUID (raw bytes), state, offset of the header. */
function variables(fd: Buffer): { name: string; guid: Buffer; state: number; at: number; end: number }[] {
  const fvLen = fd.readUInt16LE(0x30)
  const storeSize = fd.readUInt32LE(fvLen + 16)
  if (fd.readUInt8(fvLen + 20) !== 0x5a) throw new Error('not an OVMF variable store (store format byte is not 0x5A)')
  const limit = fvLen + storeSize
  const out: { name: string; guid: Buffer; state: number; at: number; end: number }[] = []
  let at = (fvLen + 28 + 3) & ~3
  while (at + HEADER <= limit && fd.readUInt16LE(at) === 0x55aa) {
    const nameSize = fd.readUInt32LE(at + 36)
    const dataSize = fd.readUInt32LE(at + 40)
    const name = fd
      .subarray(at + HEADER, at + HEADER + nameSize)
      .toString('utf16le')
      .replace(/\0+$/, '')
    const end = (at + HEADER + nameSize + dataSize + 3) & ~3
    out.push({ name, guid: fd.subarray(at + 44, at + 60), state: fd.readUInt8(at + 2), at, end })
    at = end
  }
  return out
}

/** Appends (or replaces) the global variable `name` with `data` (attributes NV+BS+RT). */
function setGlobal(fd: Buffer, name: string, data: Buffer): Buffer {
  const vars = variables(fd)
  const guid = guidBytes(EFI_GLOBAL_VARIABLE)
  for (const v of vars) if (v.name === name && v.guid.equals(guid) && v.state === 0x3f) fd.writeUInt8(v.state & ~0x02, v.at + 2)
  let at = vars.length ? vars[vars.length - 1]!.end : (fd.readUInt16LE(0x30) + 28 + 3) & ~3
  at = (at + 3) & ~3
  const nameBuf = utf16z(name)
  const head = Buffer.alloc(HEADER)
  head.writeUInt16LE(0x55aa, 0)
  head.writeUInt8(0x3f, 2)
  head.writeUInt32LE(NV_BS_RT, 4)
  head.writeUInt32LE(nameBuf.length, 36)
  head.writeUInt32LE(data.length, 40)
  guid.copy(head, 44)
  const rec = Buffer.concat([head, nameBuf, data])
  if (at + rec.length > fd.readUInt16LE(0x30) + fd.readUInt32LE(fd.readUInt16LE(0x30) + 16)) throw new Error('OVMF variable store full')
  rec.copy(fd, at)
  return fd
}

/**
 * Writes to `out` a copy of the OVMF variable store `template` with `Boot<num>` booting `file`
 * (short-form file path, found on any file system OVMF sees) and `BootOrder` = that entry first.
 */
export function writeVarsWithBootEntry(template: string, out: string, file: string, description = 'debian', num = 1): void {
  const fd = Buffer.from(readFileSync(template))
  const id = num.toString(16).toUpperCase().padStart(4, '0')
  setGlobal(fd, `Boot${id}`, loadOption(description, file))
  const order = Buffer.alloc(2)
  order.writeUInt16LE(num, 0)
  setGlobal(fd, 'BootOrder', order)
  writeFileSync(out, fd, { mode: 0o600 })
}

/** The global boot variables of an OVMF store (`Boot####`, `BootOrder`) that are live, by name. */
export function bootVariables(file: string): string[] {
  const fd = readFileSync(file)
  const guid = guidBytes(EFI_GLOBAL_VARIABLE)
  return variables(fd)
    .filter((v) => v.state === 0x3f && v.guid.equals(guid) && /^Boot/.test(v.name))
    .map((v) => v.name)
}
