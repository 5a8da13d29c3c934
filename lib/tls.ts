/**
 * The TLS connector of the migrator's HTTPS clients (vSphere SOAP `adapters/vim/soap.ts`, the
 * backup API `backup/client.ts`): trust by a CA (PEM), by a pinned SHA-256 certificate
 * thumbprint (self-signed endpoints), or explicitly insecure.
 */
// The package file, not the bare 'undici' specifier: Bun substitutes a built-in shim for that
// specifier whose connector ignores `ca` and certificate pinning.
import { buildConnector } from 'undici/index.js'
import type { TLSSocket } from 'node:tls'

/**
 * Trust settings: `ca_pem` (PEM bundle), `thumbprint` (SHA-256 of the certificate, 64 hex
 * digits, colons optional, any case), `insecure` (no verification). A pin replaces CA
 * verification; without pin or `insecure`, the system CAs (or `ca_pem`) verify the chain.
 */
export interface TlsTrust {
  ca_pem?: string
  thumbprint?: string
  insecure?: boolean
}

/** A SHA-256 thumbprint as lower-case hex without colons. */
export function normalizeThumbprint(s: string): string {
  return s.replace(/:/g, '').toLowerCase()
}

/**
 * An undici connector applying `trust`; `timeoutMs` is the TCP + TLS connect timeout. With a pin,
 * a certificate whose SHA-256 thumbprint differs fails the connection with an error of code
 * `ERR_TLS_THUMBPRINT_MISMATCH` ("certificate thumbprint X does not match the pinned Y"), and
 * TLS connections are not resumed (a resumed TLS connection shows no peer certificate, so the pin could not
 * be checked on the pool's later connections). `socketOptions` go to `tls.connect` / `net.connect`
 * as they are (for example `onread`, see http/range-http.ts).
 */
export function tlsConnector(trust: TlsTrust, timeoutMs: number, socketOptions: Record<string, unknown> = {}): buildConnector.connector {
  const pin = trust.thumbprint ? normalizeThumbprint(trust.thumbprint) : null
  const base = buildConnector({
    ...socketOptions,
    ca: trust.ca_pem,
    rejectUnauthorized: pin === null && trust.insecure !== true,
    timeout: timeoutMs,
    ...(pin === null ? {} : { maxCachedSessions: 0 }),
  })
  return (o, cb) =>
    base(o, (err, socket) => {
      if (err || pin === null || o.protocol !== 'https:') return cb(err as Error, socket as never)
      const cert = (socket as TLSSocket).getPeerCertificate()
      const got = cert?.fingerprint256 ? normalizeThumbprint(cert.fingerprint256) : ''
      if (got !== pin) {
        socket!.destroy()
        const e = new Error(`certificate thumbprint ${got || '(none)'} does not match the pinned ${pin}`) as Error & { code: string }
        e.code = 'ERR_TLS_THUMBPRINT_MISMATCH'
        return cb(e, null)
      }
      cb(null, socket!)
    })
}
