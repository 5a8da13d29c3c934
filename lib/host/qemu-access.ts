/**
 * Whether qemu, running as libvirt's unprivileged user, can reach the files it opens itself:
 * the file sink's volumes (libvirt chowns the image to that user with `dynamic_ownership`, but
 * never the directories above it, so every ancestor needs search permission for that user) and
 * libvirt's NVRAM directory. Serial logs need nothing: libvirt (root) opens `<serial type='file'>`
 * itself and hands qemu the descriptor (verified on libvirt 9.0 with a 0700 log directory).
 *
 * The user comes from libvirt's `qemu.conf` (`user`, `group`, `dynamic_ownership`; defaults of
 * Debian's build: `libvirt-qemu`, `libvirt-qemu`, 1).
 *
 * How access is checked: as root, for real, by running `test -x` on each directory from `/` down
 * as that user (`setpriv --reuid --regid --init-groups`), so the kernel decides with everything
 * it knows (modes, owners, POSIX ACLs, supplementary groups). A server that is not root cannot
 * change user; it walks the modes and owners instead (ACLs not read) and says so.
 */
import { existsSync, readFileSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { exec } from '../exec.ts'

/** The identity qemu runs as, from `qemu.conf`. */
export interface QemuUser {
  /** User name (or `+<uid>`) as configured. */
  user: string
  /** Group name (or `+<gid>`) as configured. */
  group: string
  /** Numeric ids; null when the name does not resolve on this host. */
  uid: number | null
  gid: number | null
  /** Whether the user database knows `uid` (then its supplementary groups count: `setpriv --init-groups`). */
  uidKnown: boolean
  /** libvirt's `dynamic_ownership` (it chowns disk images to the qemu user when true). */
  dynamicOwnership: boolean
  /** The file it was read from, or null when absent (defaults used). */
  source: string | null
}

/** The `getent` line of `key` in database `db`, split at `:` (empty when absent). Never throws. */
async function getent(db: 'passwd' | 'group', key: string): Promise<string[]> {
  const r = await exec('getent', [db, key], { timeoutMs: 10_000 })
  return r.code === 0 ? r.stdout.split('\n')[0]!.split(':') : []
}

/**
 * The id of `name` in `db` (`+<id>` taken as the id as it is; a plain number as the id when the
 * database has no such name), null when it does not resolve; `byName`: the database has the name.
 */
async function resolveId(db: 'passwd' | 'group', name: string): Promise<{ id: number | null; byName: boolean }> {
  if (/^\+\d+$/.test(name)) return { id: Number(name.slice(1)), byName: false }
  const fields = await getent(db, name)
  if (fields.length >= 3 && /^\d+$/.test(fields[2]!)) return { id: Number(fields[2]), byName: true }
  return { id: /^\d+$/.test(name) ? Number(name) : null, byName: false }
}

/**
 * Reads `user`, `group` and `dynamic_ownership` from libvirt's QEMU driver configuration
 * `confPath` (comments and unknown keys ignored; an absent file means the defaults) and
 * resolves the ids with `getent` (child processes, user and group at once: the event loop goes
 * on, so a job's inspection and reader open are not held up). An unknown user or group is an id
 * of null, not an error; an unreadable `confPath` rejects with its `fs` error.
 */
export async function readQemuUser(confPath = '/etc/libvirt/qemu.conf'): Promise<QemuUser> {
  let text = ''
  let source: string | null = null
  if (existsSync(confPath)) {
    text = readFileSync(confPath, 'utf8')
    source = confPath
  }
  const value = (key: string): string | undefined => {
    let found: string | undefined
    for (const line of text.split('\n')) {
      const m = new RegExp(`^\\s*${key}\\s*=\\s*(?:"([^"]*)"|(\\S+))`).exec(line)
      if (m) found = m[1] ?? m[2]
    }
    return found
  }
  const user = value('user') ?? 'libvirt-qemu'
  const group = value('group') ?? 'libvirt-qemu'
  const [uid, gid] = await Promise.all([resolveId('passwd', user), resolveId('group', group)])
  // A user found by name is known; an id taken as it is is looked up by that id.
  const uidKnown = uid.byName || (uid.id !== null && (await getent('passwd', String(uid.id))).length > 0)
  return { user, group, uid: uid.id, gid: gid.id, uidKnown, dynamicOwnership: value('dynamic_ownership') !== '0', source }
}

/** Outcome of {@link qemuCanReach}. */
export interface Reach {
  ok: boolean
  /** The first directory (from `/` down) the qemu user cannot search, when not ok. */
  blockedAt: string | null
  /** How it was decided: `as-user` (setpriv, the kernel's answer), `modes` (walked), `root` (qemu runs as root). */
  method: 'as-user' | 'modes' | 'root'
}

/** `/`, `/a`, `/a/b`, ... `/a/b/c` for an absolute path. */
export function ancestors(dir: string): string[] {
  const abs = path.resolve(dir)
  const out = ['/']
  let cur = '/'
  for (const part of abs.split('/').filter(Boolean)) {
    cur = path.join(cur, part)
    out.push(cur)
  }
  return out
}

/**
 * Whether `qemu` can search every directory from `/` to `dir` (inclusive) — what it needs to
 * open a file in `dir` that libvirt chowned to it. A directory that does not exist yet is
 * judged by its nearest existing ancestor (the migrator creates the rest 0711). As root the
 * check is `setpriv` in a child process (the event loop goes on).
 */
export async function qemuCanReach(dir: string, qemu: QemuUser): Promise<Reach> {
  if (qemu.uid === 0) return { ok: true, blockedAt: null, method: 'root' }
  const dirs = ancestors(dir).filter((d) => existsSync(d))
  if (process.getuid?.() === 0 && qemu.uid !== null && qemu.gid !== null) {
    const groups = qemu.uidKnown ? '--init-groups' : '--clear-groups'
    const script = 'for d in "$@"; do test -x "$d" || { printf "%s" "$d"; exit 1; }; done'
    const r = await exec('setpriv', [`--reuid=${qemu.uid}`, `--regid=${qemu.gid}`, groups, '--', 'sh', '-c', script, 'sh', ...dirs], { timeoutMs: 10_000 })
    if (r.code === 0) return { ok: true, blockedAt: null, method: 'as-user' }
    if (r.code === 1 && r.stdout) return { ok: false, blockedAt: r.stdout, method: 'as-user' }
    // setpriv itself failed: fall through to the walk.
  }
  for (const d of dirs) {
    const st = statSync(d)
    const mode = st.mode
    const can = st.uid === qemu.uid ? (mode & 0o100) !== 0 : st.gid === qemu.gid ? (mode & 0o010) !== 0 : (mode & 0o001) !== 0
    if (!can) return { ok: false, blockedAt: d, method: 'modes' }
  }
  return { ok: true, blockedAt: null, method: 'modes' }
}

/** The operator's fix for a directory the qemu user cannot search. */
export function reachFix(blockedAt: string, qemu: QemuUser): string {
  return `let ${qemu.user} search ${blockedAt}: "chmod o+x ${blockedAt}" or "setfacl -m u:${qemu.user}:x ${blockedAt}"; or set MIGRATOR_DATA_DIR to a directory qemu can reach (as root the default is /var/lib/<appliance>)`
}
