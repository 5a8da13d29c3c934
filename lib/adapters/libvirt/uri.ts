/**
 * Endpoints of the `libvirt_remote` adapter: libvirt remote URIs (libvirt "Connection URIs",
 * https://libvirt.org/uri.html and https://libvirt.org/remote.html) of the QEMU driver over two
 * transports:
 * - `qemu+ssh://[user@]host[:port]/system`: libvirt runs `ssh` to the host (default port 22); the
 *   data plane goes through the same SSH connection settings (a local forward of the backup's NBD
 *   socket). Authentication by private key only, the host key pinned.
 * - `qemu+tls://host[:port]/system`: libvirt's own TLS (default port 16514), a client certificate
 *   and key, the server's CA. Control plane only: the disk export is reached over SSH.
 * `qemu+tcp` (no authentication, no encryption) and the `libssh`/`libssh2` transports (their
 * own host key files and agent rules) are refused. No query or fragment: the adapter sets the
 * URI parameters itself.
 */
import { MigError } from '../../errors.ts'

/** A validated libvirt endpoint. `user` is the SSH login (`null` for TLS or when the endpoint names none). */
export interface LibvirtEndpoint {
  transport: 'ssh' | 'tls'
  user: string | null
  host: string
  port: number
  /** `/system` or `/session`. */
  path: string
  /** Canonical form: `qemu+<transport>://[user@]host:port/path`. */
  url: string
}

const HOST = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*)$/
const USER = /^[A-Za-z0-9._][A-Za-z0-9._-]{0,63}$/

/**
 * Parses and checks a `libvirt_remote` endpoint (see the module comment). Throws
 * `E_MIG_BAD_REQUEST` naming the rule broken (scheme, user, host, port, path, query).
 */
export function parseLibvirtEndpoint(endpoint: string): LibvirtEndpoint {
  const bad = (why: string) =>
    new MigError('E_MIG_BAD_REQUEST', `libvirt_remote endpoint ${JSON.stringify(endpoint.slice(0, 200))}: ${why}`, { details: { field: 'endpoint' } })
  const raw = endpoint.trim()
  if (raw === '' || raw.length > 2048) throw bad('empty or too long')
  const m = /^([a-z][a-z0-9+.-]*):\/\/([^/?#]*)(\/[^?#]*)?([?#].*)?$/i.exec(raw)
  if (!m) throw bad('must be a libvirt URI qemu+ssh://user@host[:port]/system or qemu+tls://host[:port]/system')
  const scheme = m[1].toLowerCase()
  if (scheme !== 'qemu+ssh' && scheme !== 'qemu+tls')
    throw bad(
      `scheme ${scheme} is not accepted: use qemu+ssh (key authentication, pinned host key) or qemu+tls (client certificate)${scheme === 'qemu+tcp' ? '; qemu+tcp has neither authentication nor encryption' : ''}`,
    )
  if (m[4]) throw bad('no query or fragment: the adapter sets the URI parameters (keyfile, known hosts) itself')
  const transport = scheme === 'qemu+ssh' ? 'ssh' : 'tls'
  let authority = m[2]
  let user: string | null = null
  const at = authority.lastIndexOf('@')
  if (at >= 0) {
    if (transport === 'tls') throw bad('a qemu+tls URI names no user (the client certificate identifies the caller)')
    user = authority.slice(0, at)
    authority = authority.slice(at + 1)
    if (!USER.test(user)) throw bad('invalid SSH user name')
  }
  const hp = /^(\[[^\]]+\]|[^:]+)(?::(\d{1,5}))?$/.exec(authority)
  if (!hp || !HOST.test(hp[1])) throw bad('invalid host')
  const port = hp[2] === undefined ? (transport === 'ssh' ? 22 : 16514) : Number(hp[2])
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw bad('port must be 1-65535')
  const path = (m[3] ?? '').replace(/\/+$/, '')
  if (path !== '/system' && path !== '/session') throw bad('path must be /system or /session')
  const host = hp[1].replace(/^\[|\]$/g, '')
  return { transport, user, host, port, path, url: `${scheme}://${user ? `${user}@` : ''}${hp[1]}:${port}${path}` }
}

/** One line of an OpenSSH known_hosts file (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT"): optional marker, hosts, key type, base64 key, comment. */
const KNOWN_HOSTS_LINE =
  /^(@(cert-authority|revoked) )?\S+ (ssh-[a-z0-9-]+|ecdsa-sha2-nistp(256|384|521)|sk-[A-Za-z0-9@.-]+)(-cert-v01@openssh\.com)? [A-Za-z0-9+/]+={0,2}( [^\r\n]*)?$/

/**
 * The problem with a `known_hosts` text (as `ssh-keyscan` prints it), or null: at most 64 KiB, at
 * least one key line, every non-comment line in the known_hosts format.
 */
export function knownHostsProblem(text: string): string | null {
  if (text.length > 65536) return 'longer than 64 KiB'
  const lines = text
    .split('\n')
    .map((l) => l.replace(/\r$/, '').trim())
    .filter((l) => l !== '' && !l.startsWith('#'))
  if (lines.length === 0) return 'no host key line (paste what `ssh-keyscan -p PORT HOST` prints)'
  for (let i = 0; i < lines.length; i++) if (!KNOWN_HOSTS_LINE.test(lines[i])) return `line ${i + 1} is not a known_hosts line "host keytype base64-key"`
  return null
}

/** The problem with an OpenSSH or PEM private key text, or null (the text is never echoed). */
export function privateKeyProblem(text: string): string | null {
  if (text.length > 65536) return 'longer than 64 KiB'
  if (!/^-----BEGIN (OPENSSH |RSA |EC |DSA )?PRIVATE KEY-----\r?\n[\s\S]+\r?\n-----END (OPENSSH |RSA |EC |DSA )?PRIVATE KEY-----\s*$/.test(text.trim() + '\n'))
    return 'must be an OpenSSH or PEM private key ("-----BEGIN OPENSSH PRIVATE KEY-----" ... "-----END OPENSSH PRIVATE KEY-----")'
  if (/Proc-Type: 4,ENCRYPTED/.test(text)) return 'is encrypted with a passphrase; register a key without one'
  return null
}
