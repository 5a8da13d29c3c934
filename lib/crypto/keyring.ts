/**
 * The sealing key file `keyring/migrator.key` (spec 1.5, 5.3): 32 random bytes, mode 0600, in a
 * 0700 directory. Created on first start; refused when it has the wrong size or is accessible by
 * group or others.
 */
import { chmodSync, closeSync, fstatSync, mkdirSync, openSync, readSync, writeSync, constants } from 'node:fs'
import { randomBytes } from 'node:crypto'
import * as path from 'node:path'
import { KEY_BYTES } from './seal.ts'

/** Why the server refuses to start with this key file. */
export class KeyringError extends Error {
  override name = 'KeyringError'
}

/**
 * Loads the key at `file`, creating it (and its 0700 directory) when missing. Throws
 * {@link KeyringError} with a message naming the file when it is not exactly 32 bytes, is not a
 * regular file, or has any group/other permission bits set.
 */
export function loadOrCreateKey(file: string): Buffer {
  mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 })
  let fd: number
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW)
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw new KeyringError(`cannot open key file ${file}: ${(e as Error).message}`)
    const key = randomBytes(KEY_BYTES)
    const wfd = openSync(file, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600)
    try {
      writeSync(wfd, key)
    } finally {
      closeSync(wfd)
    }
    chmodSync(file, 0o600)
    return key
  }
  try {
    const st = fstatSync(fd)
    if (!st.isFile()) throw new KeyringError(`key file ${file} is not a regular file`)
    if ((st.mode & 0o077) !== 0) {
      throw new KeyringError(`key file ${file} has mode ${(st.mode & 0o777).toString(8)}: it must not be accessible by group or others (chmod 600 ${file})`)
    }
    if (st.size !== KEY_BYTES) throw new KeyringError(`key file ${file} holds ${st.size} bytes; an AES-256-GCM key is exactly ${KEY_BYTES} bytes`)
    const key = Buffer.alloc(KEY_BYTES)
    if (readSync(fd, key, 0, KEY_BYTES, 0) !== KEY_BYTES) throw new KeyringError(`key file ${file}: short read`)
    return key
  } finally {
    closeSync(fd)
  }
}
