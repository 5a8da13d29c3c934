/**
 * Bootable test disks without an assembler: the MBR (sector 0, 512 bytes) is a hand-assembled
 * x86 real-mode boot sector. The BIOS (SeaBIOS) loads it at 0000:7C00 and jumps to it; it writes a
 * marker to COM1 (16550 UART at I/O port 0x3F8: poll the line status register at 0x3FD until bit 5,
 * "transmitter holding register empty", is set, then `out` the byte) and halts forever
 * (`cli; hlt; jmp $-2`). Bytes 510-511 hold the boot signature 0x55 0xAA.
 *
 * The rest of the (sparse) raw disk gets random data at a few offsets so that a copy of the disk can be
 * checked byte for byte (sha256 of the whole image).
 */
import { randomBytes } from 'node:crypto'
import { closeSync, ftruncateSync, openSync, writeSync } from 'node:fs'

/** What {@link makeBootDisk} wrote: the data ranges besides sector 0 (byte offsets and lengths). */
export interface BootDiskInfo {
  path: string
  sizeBytes: number
  marker: string
  chunks: Array<{ offset: number; length: number }>
}

const LOAD = 0x7c00

/**
 * The code of the boot sector, followed by the NUL-terminated message.
 * `after` selects what happens once the message is out: `halt` (stay running forever) or
 * `poweroff` (ACPI soft-off: write SLP_EN|SLP_TYP=0, 0x2000, to PM1a_CNT at 0x604 (q35/ICH9 and
 * newer PIIX4 as set up by SeaBIOS) and 0xB004 (older PIIX4/Bochs), then halt if still alive).
 */
function bootCode(message: string, after: 'halt' | 'poweroff'): Buffer {
  const code: number[] = []
  const emit = (...b: number[]) => code.push(...b)
  emit(0x31, 0xc0) // xor ax, ax
  emit(0x8e, 0xd8) // mov ds, ax           ; DS = 0, message addressed as 0x7C00 + offset
  const msgImm = code.length + 1
  emit(0xbe, 0x00, 0x00) // mov si, imm16  ; patched below with the message address
  emit(0xfc) // cld                       ; lodsb increments SI
  const next = code.length
  emit(0xac) // next: lodsb               ; AL = [DS:SI], SI++
  emit(0x84, 0xc0) // test al, al
  const jzDone = code.length
  emit(0x74, 0x00) // jz done             ; patched below
  emit(0x88, 0xc4) // mov ah, al           ; keep the character in AH
  emit(0xba, 0xfd, 0x03) // mov dx, 0x3FD  ; COM1 line status register
  const wait = code.length
  emit(0xec) // wait: in al, dx
  emit(0xa8, 0x20) // test al, 0x20        ; THR empty?
  emit(0x74, (wait - (code.length + 2)) & 0xff) // jz wait
  emit(0x88, 0xe0) // mov al, ah
  emit(0xba, 0xf8, 0x03) // mov dx, 0x3F8  ; COM1 transmit holding register
  emit(0xee) // out dx, al
  emit(0xeb, (next - (code.length + 2)) & 0xff) // jmp next
  const done = code.length
  code[jzDone + 1] = (done - (jzDone + 2)) & 0xff
  if (after === 'poweroff') {
    emit(0xb8, 0x00, 0x20) // mov ax, 0x2000 ; SLP_EN, sleep type 0 (S5 on qemu)
    emit(0xba, 0x04, 0x06) // mov dx, 0x604
    emit(0xef) // out dx, ax
    emit(0xba, 0x04, 0xb0) // mov dx, 0xB004
    emit(0xef) // out dx, ax
  }
  const halt = code.length
  emit(0xfa) // halt: cli
  emit(0xf4) // hlt
  emit(0xeb, (halt - (code.length + 2)) & 0xff) // jmp halt
  const msgAddr = LOAD + code.length
  code[msgImm] = msgAddr & 0xff
  code[msgImm + 1] = msgAddr >> 8
  return Buffer.concat([Buffer.from(code), Buffer.from(message, 'latin1'), Buffer.from([0])])
}

/** Sector 0: boot code + message, zero padding, and the 0x55AA signature unless `signature` is false. */
export function bootSector(marker: string, opts: { after?: 'halt' | 'poweroff'; signature?: boolean } = {}): Buffer {
  if (!/^[\x20-\x7e]{1,300}$/.test(marker)) throw new Error('marker must be 1-300 printable ASCII characters')
  const body = bootCode(`${marker}\r\n`, opts.after ?? 'halt')
  // 446..509 is the partition table: keep it empty (zeros) so nothing mistakes it for partitions.
  if (body.length > 446) throw new Error('marker too long for the boot sector')
  const s = Buffer.alloc(512)
  body.copy(s, 0)
  if (opts.signature !== false) {
    s[510] = 0x55
    s[511] = 0xaa
  }
  return s
}

function writeDisk(path: string, sector0: Buffer, sizeBytes: number, marker: string): BootDiskInfo {
  if (!Number.isSafeInteger(sizeBytes) || sizeBytes < 1 << 20 || sizeBytes % 512 !== 0) {
    throw new Error('sizeBytes must be a multiple of 512, at least 1 MiB')
  }
  const fd = openSync(path, 'w', 0o644)
  const chunks: Array<{ offset: number; length: number }> = []
  try {
    ftruncateSync(fd, sizeBytes)
    writeSync(fd, sector0, 0, 512, 0)
    const offsets = [64 * 1024, Math.floor(sizeBytes / 2 / 4096) * 4096, sizeBytes - 8192].filter((o) => o >= 4096)
    for (const off of offsets) {
      const data = randomBytes(4096)
      writeSync(fd, data, 0, data.length, off)
      chunks.push({ offset: off, length: data.length })
    }
  } finally {
    closeSync(fd)
  }
  return { path, sizeBytes, marker, chunks }
}

/**
 * Writes a sparse raw disk of `sizeBytes` (multiple of 512, >= 1 MiB) at `path` whose MBR prints
 * `marker` + CRLF to COM1 and halts; random 4 KiB blocks at 64 KiB, the middle and the end.
 */
export function makeBootDisk(path: string, marker: string, sizeBytes: number): BootDiskInfo {
  return writeDisk(path, bootSector(marker), sizeBytes, marker)
}

/** Like {@link makeBootDisk} but without the 0x55AA signature: SeaBIOS finds nothing to boot. */
export function makeBadBootDisk(path: string, sizeBytes: number): BootDiskInfo {
  return writeDisk(path, bootSector('NEVER-PRINTED', { signature: false }), sizeBytes, 'NEVER-PRINTED')
}

/** A disk that prints `marker` and then powers the VM off (ACPI S5): the domain ends up shut off. */
export function makePowerOffBootDisk(path: string, marker: string, sizeBytes: number): BootDiskInfo {
  return writeDisk(path, bootSector(marker, { after: 'poweroff' }), sizeBytes, marker)
}
