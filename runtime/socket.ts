/**
 * The API's unix socket (`MIGRATOR_SOCKET`, docs/security.md "Local users"), made the same way
 * under Bun and Node:
 *
 * 1. its directory is created when missing, mode 0750, group `MIGRATOR_SOCKET_GROUP`;
 * 2. a socket file already at the path is probed: one that accepts a connection belongs to a
 *    live server and is left alone (the start fails, naming it); one that refuses is stale and is
 *    replaced; anything else than a socket is refused;
 * 3. the runtime binds the socket inside a new 0700 directory next to the path, where nobody
 *    else can reach it whatever its mode; it is then chmod 0660, chown root:group, and renamed
 *    into place. There is no moment at which the socket at its final path is wider than 0660.
 */
import { execFileSync } from 'node:child_process'
import { chmodSync, chownSync, existsSync, lstatSync, mkdirSync, mkdtempSync, renameSync, rmdirSync, statSync, unlinkSync } from 'node:fs'
import { createConnection } from 'node:net'
import * as path from 'node:path'

/** Why the socket cannot be made (the message names the path, the cause and the fix). */
export class SocketError extends Error {
  override name = 'SocketError'
}

/**
 * The gid of `group` (a name resolved through NSS with `getent group`, or a numeric gid).
 * Throws {@link SocketError} when the group does not exist.
 */
export function resolveGroup(group: string): number {
  if (/^\d+$/.test(group)) return Number(group)
  try {
    const line = execFileSync('getent', ['group', group], { encoding: 'utf8' }).trim()
    const gid = Number(line.split(':')[2])
    if (Number.isInteger(gid)) return gid
  } catch {}
  throw new SocketError(`MIGRATOR_SOCKET_GROUP=${group}: no such group (getent group ${group} finds nothing); create it (groupadd ${group}) or name another`)
}

/** True when something accepts connections on the unix socket `file` within 2 s. */
export function socketAnswers(file: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createConnection({ path: file })
    const timer = setTimeout(() => {
      s.destroy()
      resolve(true) // connected but silent is still alive; a refused connect errors at once
    }, 2000)
    s.once('connect', () => {
      clearTimeout(timer)
      s.destroy()
      resolve(true)
    })
    s.once('error', () => {
      clearTimeout(timer)
      resolve(false)
    })
  })
}

/** A socket being made: bind `bindPath`, then call `publish()`; `remove()` at shutdown. */
export interface PendingSocket {
  /** Where the runtime binds (inside a private 0700 directory). */
  bindPath: string
  /** The final path. */
  path: string
  /** Sets mode 0660 and owner root:group, renames the socket into place, removes the private directory. */
  publish(): void
  /** Removes the socket file when it is still this server's (same inode), and the private directory if left. */
  remove(): void
}

/**
 * Prepares the socket `socketPath` for `group` (steps 1 and 2 above) and returns where to bind.
 * Throws {@link SocketError} when a live server holds the path, the path is not a socket, the
 * group does not exist, or the directory cannot be made.
 */
export async function prepareSocket(socketPath: string, group: string): Promise<PendingSocket> {
  const root = process.getuid?.() === 0
  const gid = group === 'root' && !root ? -1 : resolveGroup(group)
  const dir = path.dirname(socketPath)
  if (!existsSync(dir)) {
    try {
      mkdirSync(dir, { recursive: true, mode: 0o750 })
      if (gid !== -1) chownSync(dir, -1, gid)
      chmodSync(dir, 0o750)
    } catch (e) {
      throw new SocketError(
        `cannot create the socket directory ${dir}: ${(e as Error).message} (run the server as root, or set MIGRATOR_SOCKET to a path you may create)`,
      )
    }
  }
  let existing: ReturnType<typeof lstatSync> | null = null
  try {
    existing = lstatSync(socketPath)
  } catch {}
  if (existing !== null) {
    if (!existing.isSocket()) throw new SocketError(`${socketPath} exists and is not a socket; remove it or set MIGRATOR_SOCKET to another path`)
    if (await socketAnswers(socketPath)) {
      throw new SocketError(`another server is listening on ${socketPath}; stop it first, or set MIGRATOR_SOCKET to another path`)
    }
  }
  let privateDir: string
  try {
    privateDir = mkdtempSync(path.join(dir, '.migrator-'))
  } catch (e) {
    throw new SocketError(`cannot create a directory in ${dir} for the socket: ${(e as Error).message}`)
  }
  chmodSync(privateDir, 0o700)
  const bindPath = path.join(privateDir, 's')
  let ino = -1
  const dropPrivate = () => {
    try {
      rmdirSync(privateDir)
    } catch {}
  }
  return {
    bindPath,
    path: socketPath,
    publish() {
      chmodSync(bindPath, 0o660)
      if (gid !== -1) chownSync(bindPath, root ? 0 : -1, gid)
      renameSync(bindPath, socketPath)
      ino = statSync(socketPath).ino
      dropPrivate()
    },
    remove() {
      try {
        if (ino !== -1 && lstatSync(socketPath).ino === ino) unlinkSync(socketPath)
      } catch {}
      try {
        unlinkSync(bindPath)
      } catch {}
      dropPrivate()
    },
  }
}
