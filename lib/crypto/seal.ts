/**
 * Sealing of stored credentials with AES-256-GCM (spec 1.1, 5.3).
 *
 * Envelope (base64 of): version byte `0x01` | 12-byte random nonce | ciphertext | 16-byte tag.
 * The associated data binds a ciphertext to its owner (the source id), so a sealed secret
 * copied onto another row does not open.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto'
import { MigError } from '../errors.ts'

const VERSION = 0x01
const NONCE_BYTES = 12
const TAG_BYTES = 16
/** Key length in bytes (AES-256). */
export const KEY_BYTES = 32

/** Seals and opens secrets with one 32-byte key. */
export class Sealer {
  constructor(private readonly key: Buffer) {
    if (key.length !== KEY_BYTES) throw new MigError('E_MIG_INTERNAL', `sealing key must be ${KEY_BYTES} bytes, got ${key.length}`)
  }

  /** Encrypts `plaintext` (UTF-8) bound to `aad`; a fresh random 96-bit nonce every call. */
  seal(plaintext: string, aad: string): string {
    const nonce = randomBytes(NONCE_BYTES)
    const c = createCipheriv('aes-256-gcm', this.key, nonce)
    c.setAAD(Buffer.from(aad, 'utf8'))
    const ct = Buffer.concat([c.update(plaintext, 'utf8'), c.final()])
    return Buffer.concat([Buffer.from([VERSION]), nonce, ct, c.getAuthTag()]).toString('base64')
  }

  /**
   * Decrypts an envelope made by {@link seal} with the same `aad`. Throws `E_MIG_INTERNAL` when
   * the envelope is malformed, was made with another key, or was tampered with.
   */
  open(envelope: string, aad: string): string {
    const raw = Buffer.from(envelope, 'base64')
    if (raw.length < 1 + NONCE_BYTES + TAG_BYTES || raw[0] !== VERSION) throw new MigError('E_MIG_INTERNAL', 'sealed secret: unknown envelope format')
    const nonce = raw.subarray(1, 1 + NONCE_BYTES)
    const tag = raw.subarray(raw.length - TAG_BYTES)
    const ct = raw.subarray(1 + NONCE_BYTES, raw.length - TAG_BYTES)
    try {
      const d = createDecipheriv('aes-256-gcm', this.key, nonce)
      d.setAAD(Buffer.from(aad, 'utf8'))
      d.setAuthTag(tag)
      return Buffer.concat([d.update(ct), d.final()]).toString('utf8')
    } catch (e) {
      throw new MigError('E_MIG_INTERNAL', 'sealed secret: authentication failed (wrong key or tampered data)', { cause: e })
    }
  }
}
