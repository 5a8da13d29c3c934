/**
 * TLS trust settings of a registered live source (spec 2.2 `tls`), shared by the store (which
 * keeps them as JSON) and the adapters (which build their TLS connector from them).
 */

/** TLS settings of a source: trust by CA (PEM), by pinned SHA-256 thumbprint, or explicitly insecure. */
export interface SourceTls {
  insecure?: boolean
  ca_pem?: string
  thumbprint?: string
}
