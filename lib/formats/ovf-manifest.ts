/**
 * The OVF package manifest (`.mf`, DMTF DSP0243 1.1 section 5.1 / 2.0 section 5.3): one line per
 * file of the package, `<ALG>(<file name>)= <hex digest>`, ALG being SHA1 (OVF 1.x), SHA256 or
 * SHA512 (OVF 2.0). Writers differ in spacing (`SHA1(a.ovf)= …` from ovftool,
 * `SHA1 (a.ovf) = …` from coreutils-style tools) and line ends (CRLF), all of which are accepted.
 *
 * Verification policy (DESIGN.md section 5, "read only headers at inspect"): every listed file of
 * at most {@link INSPECT_VERIFY_LIMIT} bytes, and the descriptor always, is hashed at inspect
 * time; the digests of larger files are handed back to go into `DiskSource.digest` and are
 * verified while the data is copied.
 */
import { MigError } from '../errors.ts'
import type { HashAlgorithm } from './tar.ts'

/** Largest `.mf` accepted, bytes (a manifest is a few lines per file). */
export const MAX_MANIFEST_BYTES = 1024 * 1024
/** Largest number of `.mf` lines accepted. */
export const MAX_MANIFEST_ENTRIES = 10_000
/** Files up to this size (bytes, 64 MiB) are verified at inspect time; larger ones during the copy. */
export const INSPECT_VERIFY_LIMIT = 64 * 1024 * 1024

/** One `.mf` line: file name as written (relative to the descriptor), algorithm, lower-case hex. */
export interface OvfManifestEntry {
  name: string
  algorithm: HashAlgorithm
  hex: string
}

const HEX_LEN: Record<HashAlgorithm, number> = { sha1: 40, sha256: 64, sha512: 128 }

/**
 * Parses a `.mf` manifest. Blank lines are skipped; any other line that is not
 * `SHA1|SHA256|SHA512 (name) = hex` with a digest of the algorithm's length is an error, as is a
 * name listed twice with different digests.
 *
 * @param label the manifest's file or member name, for messages.
 * @throws E_MIG_MALFORMED_ARCHIVE naming `label` and the line number.
 */
export function parseOvfManifest(text: string, label: string): OvfManifestEntry[] {
  if (text.length > MAX_MANIFEST_BYTES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: manifest larger than ${MAX_MANIFEST_BYTES} bytes`)
  const out: OvfManifestEntry[] = []
  const seen = new Map<string, string>()
  const lines = text.replace(/^\uFEFF/, '').split(/\r?\n|\r/)
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.trim()
    if (line === '') continue
    const m = /^(SHA1|SHA256|SHA512)\s*\((.+)\)\s*=\s*([0-9A-Fa-f]+)$/i.exec(line)
    if (!m)
      throw new MigError(
        'E_MIG_MALFORMED_ARCHIVE',
        `${label}: line ${i + 1} is not "<SHA1|SHA256|SHA512>(<file>)= <hex>": ${JSON.stringify(line.slice(0, 80))}`,
      )
    const algorithm = m[1]!.toLowerCase() as HashAlgorithm
    const name = m[2]!.trim()
    const hex = m[3]!.toLowerCase()
    if (hex.length !== HEX_LEN[algorithm])
      throw new MigError(
        'E_MIG_MALFORMED_ARCHIVE',
        `${label}: line ${i + 1}: ${algorithm.toUpperCase()} digest of ${name} has ${hex.length} hex digits, expected ${HEX_LEN[algorithm]}`,
      )
    if (name === '' || name.includes('\0')) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: line ${i + 1}: empty file name`)
    const key = `${normalizeManifestName(name)}`
    const prev = seen.get(key)
    if (prev !== undefined) {
      if (prev !== `${algorithm}:${hex}`) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: ${name} is listed twice with different digests`)
      continue
    }
    seen.set(key, `${algorithm}:${hex}`)
    out.push({ name, algorithm, hex })
    if (out.length > MAX_MANIFEST_ENTRIES) throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${label}: more than ${MAX_MANIFEST_ENTRIES} entries`)
  }
  return out
}

/** `./a/b` and `a//b` name the same file: strips leading `./` and collapses duplicate slashes. */
export function normalizeManifestName(name: string): string {
  let s = name.replace(/\\/g, '/').replace(/\/{2,}/g, '/')
  while (s.startsWith('./')) s = s.slice(2)
  return s
}

/**
 * A file the manifest may name, as the importer sees it: its size in bytes and a way to hash it
 * (tar member range for an OVA, whole file for an OVF folder).
 */
export interface ManifestTarget {
  size: number
  digest(algorithm: HashAlgorithm): Promise<string>
}

/** Result of {@link verifyOvfManifest}. */
export interface ManifestVerification {
  /** Names (normalized) verified at inspect time. */
  verified: string[]
  /** Digests of files too large to hash at inspect, by normalized name, for `DiskSource.digest`. */
  deferred: Map<string, { algorithm: HashAlgorithm; hex: string }>
}

/**
 * Checks `.mf` entries against the package's files.
 *
 * @param entries parsed manifest lines.
 * @param lookup returns the file a (normalized) manifest name refers to, or null when the package
 *   has no such file. It may throw (e.g. `E_MIG_HOST_PATH_REJECTED` for a name that escapes).
 * @param opts.label manifest name for messages; `opts.descriptor` the normalized descriptor name
 *   (always verified, whatever its size); `opts.limit` the inspect-time size limit (64 MiB).
 * @throws E_MIG_MALFORMED_ARCHIVE a named file is missing, or a digest differs (message names
 *   the file, the algorithm, the expected and the actual digest).
 */
export async function verifyOvfManifest(
  entries: OvfManifestEntry[],
  lookup: (normalizedName: string) => ManifestTarget | null,
  opts: { label: string; descriptor?: string; limit?: number },
): Promise<ManifestVerification> {
  const limit = opts.limit ?? INSPECT_VERIFY_LIMIT
  const verified: string[] = []
  const deferred = new Map<string, { algorithm: HashAlgorithm; hex: string }>()
  for (const e of entries) {
    const name = normalizeManifestName(e.name)
    const target = lookup(name)
    if (!target)
      throw new MigError('E_MIG_MALFORMED_ARCHIVE', `${opts.label}: manifest lists ${e.name}, which is not in the package`, { details: { file: e.name } })
    if (target.size > limit && name !== opts.descriptor) {
      deferred.set(name, { algorithm: e.algorithm, hex: e.hex })
      continue
    }
    const actual = await target.digest(e.algorithm)
    if (actual !== e.hex) {
      throw new MigError(
        'E_MIG_MALFORMED_ARCHIVE',
        `${e.name}: ${e.algorithm.toUpperCase()} digest mismatch: manifest ${opts.label} says ${e.hex}, file has ${actual}`,
        {
          details: { file: e.name, algorithm: e.algorithm, expected: e.hex, actual },
        },
      )
    }
    verified.push(name)
  }
  return { verified, deferred }
}
