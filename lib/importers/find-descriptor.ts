/**
 * Finds the descriptor of a folder-based export: the file itself when `inputPath` is a file
 * with the extension, or the single such regular file of the folder (VMX folders, VirtualBox
 * folders).
 */
import { readdir, stat } from 'node:fs/promises'
import * as path from 'node:path'
import { MigError } from '../errors.ts'
import { statPath } from '../formats/io.ts'

/** Most directory entries scanned for the descriptor of a folder. */
const MAX_DIR_ENTRIES = 10000

/**
 * The descriptor (`ext`, e.g. `.vmx`, `.vbox`, matched case-insensitively) of `inputPath`.
 * Throws `E_MIG_MALFORMED_ARCHIVE` (none, or several: they are listed in the message and in
 * `details.<ext>_files`; more than 10 000 entries), `E_MIG_UNSUPPORTED_FORMAT` (a file without
 * the extension, or neither file nor folder), `E_MIG_DISK_READ_FAILED` (cannot stat or list).
 */
export async function findDescriptor(inputPath: string, ext: string): Promise<string> {
  const has = (n: string) => n.toLowerCase().endsWith(ext.toLowerCase())
  const st = await statPath(inputPath)
  if (st.isFile()) {
    if (!has(inputPath)) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: not a ${ext} file`)
    return inputPath
  }
  if (!st.isDirectory()) throw new MigError('E_MIG_UNSUPPORTED_FORMAT', `${inputPath}: neither a folder nor a ${ext} file`)
  let names: string[]
  try {
    names = await readdir(inputPath)
  } catch (e) {
    throw new MigError('E_MIG_DISK_READ_FAILED', `${inputPath}: cannot list: ${(e as Error).message}`)
  }
  if (names.length > MAX_DIR_ENTRIES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: more than ${MAX_DIR_ENTRIES} entries`)
  const found: string[] = []
  for (const n of names.sort()) {
    if (!has(n)) continue
    const s = await stat(path.join(inputPath, n)).catch(() => null)
    if (s?.isFile()) found.push(n)
  }
  if (found.length === 0) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: the folder holds no ${ext} file`)
  if (found.length > 1) {
    throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${inputPath}: the folder holds several ${ext} files: ${found.join(', ')}`, {
      details: { [`${ext.slice(1)}_files`]: found },
    })
  }
  return path.join(inputPath, found[0]!)
}
