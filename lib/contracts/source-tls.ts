/**
 * TLS trust settings of a registered live source (spec 2.2 `tls`) and of a remote offline input,
 * shared by the store (which keeps them as JSON), the request validation, and the adapters and
 * remote readers (which build their TLS connector from them).
 */
import { z } from 'zod'

/** TLS settings of a source: trust by CA (PEM), by pinned SHA-256 thumbprint, or explicitly insecure. */
export interface SourceTls {
  insecure?: boolean
  ca_pem?: string
  thumbprint?: string
  /** `libvirt_remote` over SSH: the pinned host keys, OpenSSH known_hosts lines (stored, not a request field of `tls`). */
  known_hosts?: string
  /** `libvirt_remote` over TLS: the client certificate, PEM (stored, not a request field of `tls`). */
  client_cert_pem?: string
}

/**
 * The zod schema of {@link SourceTls} in request bodies: a PEM certificate (up to 64 KiB), a
 * SHA-256 thumbprint (64 hex digits, colons optional), or `insecure`.
 */
export const SourceTlsSchema = z.strictObject({
  insecure: z.boolean().optional(),
  ca_pem: z
    .string()
    .max(65536)
    .regex(/-----BEGIN CERTIFICATE-----/, 'must be a PEM certificate')
    .optional(),
  thumbprint: z
    .string()
    .regex(/^([0-9A-Fa-f]{2}:?){32}$/, 'must be a SHA-256 thumbprint (64 hex digits, colons optional)')
    .optional(),
})
